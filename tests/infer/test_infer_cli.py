"""`imaging-ai build-engines` through add_arguments/run, with the fakes in sys.modules."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from imaging_ai.infer import cli
from tests.fakes.cudart_fake import FakeCudart
from tests.fakes.trt_fake import make_fake_tensorrt
from tests.infer.tiny_model import TinyModel


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="imaging-ai build-engines")
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> object:
    cudart = FakeCudart()
    trt = make_fake_tensorrt("10.13.0", cudart)
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", cudart)
    return trt


def test_build_then_reuse(
    tiny: TinyModel, tmp_path: Path, fakes: object, capsys: pytest.CaptureFixture[str]
) -> None:
    engines = str(tmp_path / "engines")
    args = ("--engines-dir", engines, "--data-dir", str(tmp_path / "data"), "--max-batch", "4")
    args += ("--opt-batch", "2")
    assert cli.run(parse(*args)) == 0
    assert "tiny" in capsys.readouterr().out
    assert cli.run(parse(*args, "--model", "tiny")) == 0
    assert "cached" in capsys.readouterr().out
    assert list((tmp_path / "data" / "engines").glob("tiny-fp16-*.plan"))


def test_a_forced_bar_counts_the_models_on_stderr(
    tiny: TinyModel, tmp_path: Path, fakes: object, capsys: pytest.CaptureFixture[str]
) -> None:
    engines = str(tmp_path / "engines")
    args = ("--engines-dir", engines, "--data-dir", str(tmp_path / "data"), "--max-batch", "4")
    assert cli.run(parse(*args, "--opt-batch", "2", "--progress")) == 0
    captured = capsys.readouterr()
    assert "build-engines" in captured.err and "1/1" in captured.err
    assert "build-engines" not in captured.out
    assert cli.run(parse(*args, "--opt-batch", "2")) == 0  # not a terminal: no bar
    assert "build-engines" not in capsys.readouterr().err


def test_errors_become_exit_codes(
    tiny: TinyModel, tmp_path: Path, fakes: object, capsys: pytest.CaptureFixture[str]
) -> None:
    engines = str(tmp_path / "engines")
    assert cli.run(parse("--engines-dir", engines)) == 2
    data = ("--data-dir", str(tmp_path / "data"))
    assert cli.run(parse("--engines-dir", engines, *data, "--model", "liver")) == 1
    assert "no model named liver" in capsys.readouterr().err
    assert cli.run(parse("--engines-dir", str(tmp_path / "nowhere"), *data)) == 1

"""What ships is the daemon: the wheel holds no phantom, bench or fake, and imaging_ai imports
neither the development kit nor the tests except through its extension points."""

from __future__ import annotations

import ast
import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from imaging_ai import cli, faults, plugins, workers
from imaging_ai.errors import ConfigError, EngineError

ROOT = Path(__file__).resolve().parents[1]
DEV_ONLY = ("phantom", "bench", "fake", "mllp_listener", "imaging_ai_devkit", "tests/")


def test_the_wheel_holds_the_daemon_only(tmp_path: Path) -> None:
    source = tmp_path / "imaging-ai"  # not "src": setuptools then fails
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "imaging_ai", source / "imaging_ai", ignore=ignore)
    # Without isolation only where setuptools can build a wheel here (the wheel package).
    isolation = [] if importlib.util.find_spec("wheel") is None else ["--no-build-isolation"]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            *isolation,
            "-w",
            "out",
            "./imaging-ai",
        ],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=120,
    )
    (wheel,) = (tmp_path / "out").glob("imaging_ai-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"imaging_ai", "imaging_ai-0.1.0.dist-info"}
    assert [n for n in names if any(word in n for word in DEV_ONLY)] == []
    assert "imaging_ai/outputs/warm_fixture/lungs.npz" in names


def test_imaging_ai_imports_neither_the_devkit_nor_the_tests() -> None:
    found = []
    for path in sorted((ROOT / "imaging_ai").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [
                f"{path.name}: {n}" for n in names if n.split(".")[0] in {plugins.DEVKIT, "tests"}
            ]
    assert found == []


def test_the_warm_up_fixture_is_small() -> None:
    folder = ROOT / "imaging_ai" / "outputs" / "warm_fixture"
    assert sum(p.stat().st_size for p in folder.iterdir()) < 64_000


def test_a_fault_without_a_plan_stops_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugins, "entry_points", lambda group: [])
    with pytest.raises(ConfigError, match="fault injection is not installed"):
        faults.arm({faults.ENV: "before:claim"})
    faults.arm({})


def test_the_devkit_fault_plans() -> None:
    with pytest.raises(ConfigError, match="not a fault point"):
        faults.arm({faults.ENV: "before:lunch"})
    faults.arm({faults.ENV: "gpu:error"})
    try:
        assert faults.engine_factory(1, 8) is not None
    finally:
        faults.arm({})
    assert faults.engine_factory(1, 8) is None


def test_an_unknown_extension_backend_is_an_engine_error() -> None:
    with pytest.raises(EngineError, match="no backend 'nope' is installed"):
        workers.extension_backend("nope:x=1")


def test_devkit_commands_say_plainly_that_the_kit_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(plugins, "entry_points", lambda group: [])
    assert cli.main(["phantom", "/tmp/nowhere"]) == 2
    assert "development kit" in capsys.readouterr().err


def test_the_daemons_own_commands_never_load_extensions(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(group: str) -> list[object]:
        raise AssertionError(f"looked up {group}")

    monkeypatch.setattr(plugins, "entry_points", refuse)
    assert cli.build_parser(["serve"]).parse_args(["serve"]).command == "serve"

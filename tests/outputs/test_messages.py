"""The ORUs and FHIR bundle made in a helper process, beside the SEG and SR encoding."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from imaging_ai.config import Config, OutputsConfig, RisDestination, StorageConfig
from imaging_ai.outputs.common import build_report
from imaging_ai.outputs.files import encode_results
from imaging_ai.outputs.messages import MessageBuilder, build_messages
from tests.outputs.conftest import ALGORITHM, IMPRESSION, Study

CREATED = datetime(2026, 12, 1, 5, 0, 0, tzinfo=UTC)
RIS = (
    RisDestination(host="127.0.0.1", port=2575),
    RisDestination(host="ris.example", port=2576, receiving_application="RADIS"),
)


@pytest.fixture
def builder() -> Iterator[MessageBuilder]:
    b = MessageBuilder()
    b.start()
    yield b
    b.stop()


def test_messages_from_the_helper_process_are_the_ones_made_here(
    study: Study, builder: MessageBuilder
) -> None:
    report = build_report(study.analysis, study.headers, ALGORITHM, study.uids, IMPRESSION, CREATED)
    here = build_messages(report, RIS)
    there = builder.submit(report, RIS).result()
    assert there == here
    assert [m.destination for m in there.orus] == ["ris:127.0.0.1:2575", "ris:ris.example:2576"]
    assert b"RADIS" in there.orus[1].data and b"ORU^R01" in there.orus[0].data


def test_encoded_results_do_not_depend_on_where_the_messages_are_made(
    study: Study, builder: MessageBuilder, tmp_path: Path
) -> None:
    config = Config(storage=StorageConfig(data_dir=str(tmp_path)), outputs=OutputsConfig(ris=RIS))
    args = (study.analysis, study.headers, 41, CREATED, IMPRESSION, config)
    assert encode_results(*args, builder) == encode_results(*args)


def test_a_dead_helper_process_loses_no_message(study: Study, builder: MessageBuilder) -> None:
    report = build_report(study.analysis, study.headers, ALGORITHM, study.uids, IMPRESSION, CREATED)
    builder.submit(report, RIS).result()  # the process is up
    pool = builder._pool
    assert pool is not None
    for pid in list(pool._processes):  # SIGKILL, as the kernel's OOM killer would
        os.kill(pid, signal.SIGKILL)
    # The report in flight when it died is made here; the next goes to a new process.
    assert builder.submit(report, RIS).result() == build_messages(report, RIS)
    assert builder.submit(report, RIS).result() == build_messages(report, RIS)
    assert builder._pool is not None and builder._pool is not pool

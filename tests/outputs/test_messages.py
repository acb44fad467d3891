"""The ORUs and FHIR bundle made in a helper process, beside the SEG and SR encoding."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
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


def test_the_helper_process_exits_when_the_daemon_is_killed(tmp_path: Path) -> None:
    # A SIGKILLed daemon cannot stop its pool: the helper process must notice on its own.
    script = (
        "import sys, time\n"
        "from imaging_ai.outputs.messages import MessageBuilder\n"
        "if __name__ == '__main__':\n"
        "    b = MessageBuilder(); b.start()\n"
        "    b._pool.submit(int, '1').result()\n"
        "    print(*b._pool._processes, flush=True)\n"
        "    time.sleep(60)\n"
    )
    (tmp_path / "daemon.py").write_text(script)
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "daemon.py")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        (helper,) = (int(pid) for pid in proc.stdout.readline().split())
        assert _alive(helper)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while _alive(helper) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(helper), "the helper process outlived the daemon"
    finally:
        proc.kill()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_reports_in_flight_when_the_helper_dies_start_one_new_process(
    study: Study, builder: MessageBuilder
) -> None:
    report = build_report(study.analysis, study.headers, ALGORITHM, study.uids, IMPRESSION, CREATED)
    builder.submit(report, RIS).result()
    pool = builder._pool
    assert pool is not None
    in_flight = [builder.submit(report, RIS) for _ in range(3)]
    for pid in list(pool._processes):
        os.kill(pid, signal.SIGKILL)
    # The first failure starts a new process; a report sent to it is not lost when the other
    # reports of the dead one fail afterwards, and the new process is not replaced again.
    first, *rest = in_flight
    assert first.result() == build_messages(report, RIS)
    replacement = builder._pool
    assert replacement is not None and replacement is not pool
    on_replacement = builder.submit(report, RIS)
    assert all(p.result() == build_messages(report, RIS) for p in rest)
    assert on_replacement.result() == build_messages(report, RIS)
    assert builder._pool is replacement

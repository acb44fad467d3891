"""The attack suite (issue 18's acceptance): each attack of ``tests/reliability/attacks.py`` on
the running daemon, then a good study that must arrive complete.

One daemon (``imaging-ai serve``, two receivers, SQLite) with a short negotiation deadline, a
small cap on waiting sockets and a short HTTP header timeout, so that each attack shows in
seconds. After every attack a PACS sends a fresh two-image CT study, retrying the association as
a PACS does while the daemon sheds what the attack left (at most 30 s): every C-STORE must be
answered Success and both instances must be in the catalogue. The figures (attacks tried,
refused correctly, studies lost) are printed; ``docs/reliability.md`` records them.

make test runs each attack once; the soak (``make soak``) runs the whole catalogue
``IMAGING_AI_ATTACK_ROUNDS`` times (default 5) with floods ten times as large.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pydicom
import pytest
from imaging_ai_devkit.bench.harness import CALLED_AE
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage  # type: ignore[attr-defined]
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from imaging_ai.db.models import AuditEvent, Instance, Series, Study
from tests.conftest import wait_until
from tests.dicom_factory import ct_series
from tests.reliability.attacks import Attack, Target, catalogue
from tests.reliability.conftest import FaultDaemon

NEGOTIATION_S = 2.0
MAX_PENDING = 16
HEADER_TIMEOUT_S = 2.0
RETRY_FOR_S = 30.0
QUICK = [a for a in catalogue() if not a.soak_only]


@dataclass
class Tally:
    tried: int = 0
    refused: int = 0
    studies_sent: int = 0
    studies_complete: int = 0
    retries: int = 0

    def line(self) -> str:
        lost = self.studies_sent - self.studies_complete
        return (
            f"attacks tried {self.tried}, refused correctly {self.refused}; good studies sent "
            f"{self.studies_sent}, complete {self.studies_complete}, lost {lost} "
            f"({self.retries} association retries)"
        )


def _daemon(root: Path) -> FaultDaemon:
    daemon = FaultDaemon(
        root,
        "[assemble]\nseries_idle_s = 0.5\nstudy_idle_s = 0.5\npoll_s = 0.2\n",
        calling_aes=("PACS",),
        receivers=2,
        http_extra=f"limit_concurrency = 4000\nheader_timeout_s = {HEADER_TIMEOUT_S}\n",
    )
    daemon.env.update(
        {
            "IMAGING_AI_DICOM__NEGOTIATION_TIMEOUT_S": str(NEGOTIATION_S),
            "IMAGING_AI_DICOM__MAX_PENDING_CONNECTIONS": str(MAX_PENDING),
        }
    )
    return daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultDaemon]:
    daemon = _daemon(tmp_path_factory.mktemp("attacked"))
    daemon.start(timeout_s=400)
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def tally() -> Iterator[Tally]:
    tally = Tally()
    yield tally
    print(f"\nattack suite: {tally.line()}")


def _target(daemon: FaultDaemon, scratch: Path, scale: int = 1) -> Target:
    assert daemon.proc is not None
    return Target(
        dicom_port=daemon.dicom_port,
        http_port=daemon.http_port,
        pid=daemon.proc.pid,
        negotiation_timeout_s=NEGOTIATION_S,
        max_pending_connections=MAX_PENDING,
        header_timeout_s=HEADER_TIMEOUT_S,
        scratch=scratch,
        scale=scale,
    )


def _instances(daemon: FaultDaemon, *, study_uid: str = "", sop_uid: str = "") -> int:
    engine = daemon.database()
    query = select(func.count(Instance.id))
    if study_uid:
        query = (
            query.join(Series, Series.id == Instance.series_id)
            .join(Study, Study.id == Series.study_id)
            .where(Study.study_instance_uid == study_uid)
        )
    if sop_uid:
        query = query.where(Instance.sop_instance_uid == sop_uid)
    with Session(engine) as s:
        count = int(s.scalar(query) or 0)
    engine.dispose()
    return count


def _good_study(daemon: FaultDaemon, root: Path, tally: Tally) -> None:
    """A PACS sends a fresh two-image study; it must be answered Success and catalogued."""
    files = ct_series(root, slices=2)
    uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    tally.studies_sent += 1
    ae = AE(ae_title="PACS")
    ae.acse_timeout = ae.network_timeout = 30
    ae.add_requested_context(CTImageStorage)
    deadline = time.monotonic() + RETRY_FOR_S
    while True:
        assoc = ae.associate("127.0.0.1", daemon.dicom_port, ae_title=CALLED_AE)
        if assoc.is_established:
            break
        assert time.monotonic() < deadline, f"no association for {RETRY_FOR_S} s"
        tally.retries += 1
        time.sleep(0.5)
    statuses = [int(assoc.send_c_store(pydicom.dcmread(f)).Status) for f in files]
    assoc.release()
    assert statuses == [0, 0], statuses
    wait_until(lambda: _instances(daemon, study_uid=uid) == 2)
    tally.studies_complete += 1


def _after_checks(daemon: FaultDaemon, scratch: Path) -> None:
    """What some attacks leave for the database to show."""
    aborted = scratch / "aborted-uid"
    if aborted.exists():
        assert _instances(daemon, sop_uid=aborted.read_text()) == 0, "aborted instance kept"
    spoofed = scratch / "spoofed"
    if spoofed.exists():
        engine = daemon.database()
        with Session(engine) as s:
            sources = set(s.scalars(select(AuditEvent.source)))
        engine.dispose()
        assert spoofed.read_text() not in sources, sources


def _attack_then_study(
    daemon: FaultDaemon, attack: Attack, root: Path, tally: Tally, scale: int = 1
) -> None:
    root.mkdir(parents=True, exist_ok=True)
    assert daemon.proc is not None and daemon.proc.poll() is None, daemon.log()[-3000:]
    tally.tried += 1
    verdict = attack.run(_target(daemon, root, scale))
    print(f"  {attack.kind}: {attack.name}: {verdict.saw}")
    assert verdict.refused, f"{attack.name}: {verdict.saw}"
    _after_checks(daemon, root)
    tally.refused += 1
    _good_study(daemon, root / "good", tally)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("attack", QUICK, ids=[a.name for a in QUICK])
def test_attack_then_a_good_study(
    daemon: FaultDaemon, tally: Tally, attack: Attack, tmp_path: Path
) -> None:
    _attack_then_study(daemon, attack, tmp_path, tally)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_attack_rounds(tmp_path: Path) -> None:
    rounds = int(os.environ.get("IMAGING_AI_ATTACK_ROUNDS", "5"))
    tally = Tally()
    daemon = _daemon(tmp_path / "daemon")
    daemon.start(timeout_s=400)
    try:
        for n in range(rounds):
            for i, attack in enumerate(catalogue()):
                _attack_then_study(daemon, attack, tmp_path / f"r{n}" / str(i), tally, scale=10)
    finally:
        daemon.stop()
        print(f"\nattack suite, {rounds} rounds: {tally.line()}")
    assert tally.studies_complete == tally.studies_sent

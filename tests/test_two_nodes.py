"""Two daemons on one PostgreSQL and one spool: every study analysed once, also when a node is
SIGKILLed in the middle of a job (its lease expires and the other node takes the job)."""

from __future__ import annotations

import time
from pathlib import Path

from imaging_ai_devkit.bench.harness import DaemonProcess
from imaging_ai_devkit.phantom import PhantomSpec, generate, write_study
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session

from imaging_ai.db.models import Job, Report, Study
from tests.conftest import PostgresCluster, wait_until

STUDIES = 4
FAST = "[assemble]\nseries_idle_s = 1.0\nstudy_idle_s = 1.0\npoll_s = 0.2\n"


def test_two_nodes_share_the_queue_and_survive_a_sigkill(
    postgres: PostgresCluster, tmp_path: Path
) -> None:
    url = postgres.create_database()
    shared = tmp_path / "shared"
    nodes = [
        DaemonProcess(
            tmp_path / name,
            FAST,
            database_url=url,
            data_dir=shared,
            storage_extra=f'node_name = "{name}"\njob_lease_s = 6.0',
        )
        for name in ("node-a", "node-b")
    ]
    for node in nodes:
        node.start()
    studies = []
    for i in range(STUDIES):
        out = tmp_path / f"study{i}"
        write_study(
            generate(PhantomSpec(slices=16, seed=700 + i, nodules=1, slice_thickness_mm=5.0)), out
        )
        studies.append(sorted((out / "dicom").glob("*.dcm")))
    for i, files in enumerate(studies):
        nodes[i % 2].send(files)
    engine = create_engine(url)

    def processing_on_b() -> bool:
        with Session(engine) as s:
            return bool(
                s.scalar(
                    select(func.count(Job.id)).where(
                        Job.state == "processing", Job.node.like("node-b:%")
                    )
                )
            )

    wait_until(processing_on_b, timeout_s=120, interval_s=0.05)
    nodes[1].kill()  # in the middle of a job
    killed_at = time.monotonic()

    def all_done() -> bool:
        with Session(engine) as s:
            return s.scalar(select(func.count(Study.id)).where(Study.state == "done")) == STUDIES

    wait_until(all_done, timeout_s=240)
    with Session(engine) as s:
        reports = s.scalars(select(Report)).all()
        jobs = s.scalars(select(Job)).all()
    assert len(reports) == STUDIES and len({r.study_id for r in reports}) == STUDIES
    assert len(jobs) == STUDIES and all(j.state == "done" for j in jobs)
    assert any(j.attempts >= 2 for j in jobs), "the killed node's job was taken over"
    assert all(j.node.startswith("node-a:") for j in jobs if j.attempts >= 2)
    assert time.monotonic() - killed_at < 240
    nodes[0].stop()
    engine.dispose()

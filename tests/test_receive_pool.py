"""The receiver pool: one listener hands connections to the least-loaded receiver process."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage, Verification  # type: ignore[attr-defined]

from imaging_ai.config import Config
from imaging_ai.receive_pool import ReceiverPool
from tests.conftest import receiver_config, wait_until
from tests.dicom_factory import ct_series

CALLED = "IMAGING_AI"


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return receiver_config(tmp_path, 2)


@pytest.fixture
def pool(config: Config) -> Iterator[ReceiverPool]:
    pool = ReceiverPool(config)
    pool.start()
    yield pool
    pool.stop(timeout_s=10)


def associate(port: int) -> object:
    ae = AE(ae_title="PACS")
    ae.add_requested_context(Verification)
    ae.add_requested_context(CTImageStorage)
    assoc = ae.associate("127.0.0.1", port, ae_title=CALLED)
    assert assoc.is_established
    return assoc


def _loads(pool: ReceiverPool) -> list[int]:
    return [link.load.value for link in pool._links if link is not None]


def test_four_associations_spread_two_and_two(pool: ReceiverPool, tmp_path: Path) -> None:
    assocs = [associate(pool.port) for _ in range(4)]
    wait_until(lambda: pool.stats.snapshot()["active"] == 4)
    assert sorted(_loads(pool)) == [2, 2]
    ds = pydicom.dcmread(ct_series(tmp_path / "src", slices=1)[0])
    for assoc in assocs:
        assert assoc.send_c_echo().Status == 0x0000  # type: ignore[attr-defined]
    assert assocs[0].send_c_store(ds).Status == 0x0000  # type: ignore[attr-defined]
    for assoc in assocs:
        assoc.release()  # type: ignore[attr-defined]
    wait_until(lambda: _loads(pool) == [0, 0])
    assert pool.stats.snapshot()["stored"] == 1


def test_a_dead_receiver_is_passed_over(pool: ReceiverPool) -> None:
    victim = pool._supervisor.process(0)
    assert victim is not None and victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)
    wait_until(lambda: pool.alive() == 1)
    for _ in range(3):
        assoc = associate(pool.port)
        assert assoc.send_c_echo().Status == 0x0000  # type: ignore[attr-defined]
        assoc.release()  # type: ignore[attr-defined]


def test_stop_closes_the_port(config: Config) -> None:
    pool = ReceiverPool(config)
    pool.start()
    port = pool.port
    pool.stop(timeout_s=10)
    assert pool.alive() == 0
    ae = AE(ae_title="PACS")
    ae.add_requested_context(Verification)
    assert not ae.associate("127.0.0.1", port, ae_title=CALLED).is_established

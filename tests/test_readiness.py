"""/readyz's engine check: ready only once every inference worker has loaded and warmed up."""

from __future__ import annotations

from types import SimpleNamespace

from imaging_ai.pipeline import Daemon
from imaging_ai.workers import WorkerStatus


def _worker(device: str, state: str, alive: bool = True) -> WorkerStatus:
    return WorkerStatus(
        index=0,
        pid=1,
        backend="onnxruntime-cpu",
        device=device,
        state=state,
        alive=alive,
        batches_done=0,
        batch_sizes=(),
        busy_fraction=0.0,
        busy_s=0.0,
        fallbacks=0,
        restarts=0,
        in_flight=0,
        degraded=False,
    )


def _engines_check(*workers: WorkerStatus) -> str:
    pool = SimpleNamespace(status=lambda: workers)
    daemon = SimpleNamespace(processor=SimpleNamespace(engines=SimpleNamespace(pool=pool)))
    return Daemon._engines_ready(daemon)  # type: ignore[arg-type]


def test_a_worker_still_loading_its_engines_is_not_ready() -> None:
    check = _engines_check(_worker("cuda:0", "ready"), _worker("cuda:1", "starting"))
    assert check == "inference workers starting: cuda:1"


def test_ready_workers_are_ok_and_a_dead_one_is_down() -> None:
    assert _engines_check(_worker("cpu", "ready")) == "ok"
    assert _engines_check(_worker("cpu", "ready", alive=False)) == "inference workers down: cpu"
    assert _engines_check() == "inference workers down: "

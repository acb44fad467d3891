#!/usr/bin/env python3
"""`imaging-ai bench sustained` on the GPU machine, where neither Orthanc nor DCMTK exists.

The same benchmark (`imaging_ai_devkit.bench.sustained`: capacity from a backlog sent at once,
then a Poisson mixed-priority stream at ``--load`` of it, deadline misses per class, studies/hour
and slices/s) with pynetdicom in place of DCMTK and Orthanc: a pool of sender processes makes the
re-UID'd copies of the three phantoms and sends each study on its own association, as
storescu would (processes, not threads: one Python sender is ~1-3 s for 300 slices, about what
the daemon needs for a study on an H200); the storage SCP of `turnaround.py` keeps the
SEG and SR that come back. The backend is ONNX Runtime CUDA on one GPU unless ``--cpu``.

On the device, from the repository root, by benchmarks/device/sustained.sh (which puts
onnxruntime-gpu and the daemon's other packages on PYTHONPATH):

    python3 benchmarks/device/sustained.py --budget 190 --timeout 40

Here, as a dry run of the same path on ONNX Runtime CPU with tiny sizes:

    .venv/bin/python benchmarks/device/sustained.py --cpu

What is missing (a package, ONNX Runtime's CUDA provider, a GPU) is named before anything runs;
the figures and each study's outcome go to ``$OUT/sustained.json`` when OUT is set.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "devkit"), str(ROOT / "benchmarks" / "device")]
# The daemon and the phantom generator run as `python -m imaging_ai` subprocesses.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (os.environ.get("PYTHONPATH", ""), str(ROOT)) if p
)

# (capacity studies, stream studies, slices, senders) on the device and for a dry run here.
# On an H200 a 300-slice study is ~1-3 s of the daemon's time: the backlog of 8 is ~10-25 s,
# the stream of 40 at 80% ~50-150 s; --budget cuts the stream if capacity is lower.
DEVICE = (8, 40, 300, 8)
DRY_RUN = (3, 4, 16, 2)


def parser() -> argparse.ArgumentParser:
    """`bench.sustained`'s options (sizes default to the device's) and the sender's."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--cpu", action="store_true", help="dry run here: ONNX Runtime CPU, tiny sizes")
    p.add_argument("--capacity-studies", type=int, help=f"backlog for capacity ({DEVICE[0]})")
    p.add_argument("--studies", type=int, help=f"studies in the stream ({DEVICE[1]})")
    p.add_argument("--slices", type=int, help=f"slices per study ({DEVICE[2]})")
    p.add_argument("--senders", type=int, help=f"sender processes ({DEVICE[3]})")
    p.add_argument("--load", type=float, default=0.8, help="fraction of capacity (0.8)")
    p.add_argument("--mix", default="0.2,0.3,0.5", help="urgent,inpatient,outpatient")
    p.add_argument("--seed", type=int, default=1, help="arrivals and classes")
    p.add_argument("--timeout", type=float, default=40, help="s to wait for results once sent")
    p.add_argument("--budget", type=float, default=0.0, help="stop sending past this many s")
    p.add_argument("--json", type=Path, help="figures and outcomes ($OUT/sustained.json)")
    return p


def with_sizes(args: argparse.Namespace) -> argparse.Namespace:
    """Fill in the sizes left out: the device's, or the dry run's with --cpu."""
    sizes = DRY_RUN if args.cpu else DEVICE
    for name, value in zip(
        ("capacity_studies", "studies", "slices", "senders"), sizes, strict=True
    ):
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.json is None and os.environ.get("OUT"):
        args.json = Path(os.environ["OUT"]) / "sustained.json"
    return args


def missing() -> list[str]:
    """What the run needs and this machine lacks (turnaround.py's list and checks)."""
    try:
        import turnaround
    except ImportError as exc:  # its module imports pydicom and pynetdicom
        return [exc.name or str(exc)]
    return list(turnaround.missing())


def push(files: Sequence[str], port: int, called_ae: str) -> int:
    """Send one study on one association, TCP_NODELAY on, as storescu does; failures (in a
    sender process)."""
    from pynetdicom import AE, StoragePresentationContexts

    ae = AE(ae_title="STORESCU")
    ae.requested_contexts = StoragePresentationContexts[:127]
    assoc = ae.associate("127.0.0.1", port, ae_title=called_ae)
    if not assoc.is_established:
        raise RuntimeError("the daemon refused the association")
    raw = assoc.dul.socket.socket if assoc.dul.socket is not None else None
    if raw is not None:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    failed = 0
    try:
        for path in files:
            status = assoc.send_c_store(path)
            failed += int(getattr(status, "Status", 0xC000) != 0x0000)
    finally:
        assoc.release()
    return failed


def warm(_: int) -> None:
    """Import what a sender needs, so that the first study sent does not pay for it."""
    import pydicom  # noqa: F401
    import pynetdicom  # noqa: F401


def pynetdicom_sender(pool: ProcessPoolExecutor, processes: int) -> Any:
    """`imaging_ai_devkit.bench.sustained.Sender` over the pool, with turnaround.py's PACS."""
    from imaging_ai_devkit.bench.harness import CALLED_AE
    from imaging_ai_devkit.bench.stack import Hospital
    from imaging_ai_devkit.bench.sustained import Copied, CopyJob, Sender, copy_study
    from turnaround import PynetdicomPacs

    def copy_all(jobs: Sequence[CopyJob]) -> list[Copied]:
        return list(pool.map(copy_study, jobs, chunksize=4))

    def send(hospital: Hospital, files: list[Path]) -> None:
        port = hospital.daemon.dicom_port
        failed = pool.submit(push, [str(f) for f in files], port, CALLED_AE).result()
        if failed:
            raise RuntimeError(f"{failed} of {len(files)} instances refused")

    made: Callable[..., Any] = PynetdicomPacs
    return Sender(copy_all, send, made, f"pynetdicom, {processes} processes")


def main() -> int:
    args = with_sizes(parser().parse_args())
    backend = "onnxruntime-cpu" if args.cpu else "onnxruntime-cuda"
    os.environ.setdefault("IMAGING_AI_ENGINES__BACKEND", backend)
    gone = missing()
    if gone:
        print(f"cannot run: missing {', '.join(gone)}; PYTHONPATH={os.environ['PYTHONPATH']}")
        print("headline: sustained not measured (see the line above; sustained.sh)")
        return 2
    from imaging_ai_devkit.bench import sustained

    print(
        f"sustained on {os.environ['IMAGING_AI_ENGINES__BACKEND']}: backlog of "
        f"{args.capacity_studies}, stream of {args.studies} studies of {args.slices} slices, "
        f"{args.senders} sender processes, budget {args.budget:g} s",
        flush=True,
    )
    # Spawned, not forked: this process has threads (the PACS, the sender's) by the time it sends.
    context = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(args.senders, mp_context=context) as pool:
            list(pool.map(warm, range(args.senders)))
            return sustained.run(args, pynetdicom_sender(pool, args.senders))
    except Exception as exc:  # one clear line last, after the traceback
        import traceback

        traceback.print_exc()
        print(f"headline: sustained not measured: {type(exc).__name__}: {str(exc)[-300:]}")
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""The receiver pool alone (no assembler, scheduler or workers) under DCMTK storescu.

Diagnostic for `imaging-ai bench ingest`: the same ReceiverPool, SQLite database and spool as
the daemon, without the rest of the daemon around them. From the repository root:

    .venv/bin/imaging-ai phantom /tmp/ingprof/ph --slices 300 --seed 1000
    .venv/bin/python scripts/ingest_receivers_alone.py --associations 4 --receivers 2

Prints images/s of each run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from imaging_ai_devkit.bench.harness import free_port

from imaging_ai.config import load_config
from imaging_ai.db.session import make_engine, upgrade
from imaging_ai.receive_pool import ReceiverPool


def send(files: list[Path], port: int, associations: int) -> float:
    """Send ``files`` over parallel storescu processes; return images/s."""
    env = {**os.environ, "TCP_NODELAY": "1"}
    chunks = [files[i::associations] for i in range(associations)]
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            ["storescu", "-aet", "STORESCU", "-aec", "IMAGING_AI", "127.0.0.1", str(port)]
            + [str(p) for p in chunk],
            env=env,
        )
        for chunk in chunks
    ]
    for proc in procs:
        proc.wait()
    return len(files) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=Path, default=Path("/tmp/ingprof/ph/dicom"))
    parser.add_argument("--associations", type=int, default=1)
    parser.add_argument("--receivers", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    files = sorted(args.study.glob("*.dcm"))
    root = Path(tempfile.mkdtemp(prefix="imaging-ai-receivers-"))
    try:
        path = root / "receivers.toml"
        path.write_text(
            f'[dicom]\nae_title = "IMAGING_AI"\nport = {free_port()}\n'
            f"receiver_processes = {args.receivers}\n"
            'allowed_callers = [{ ae_title = "STORESCU", host = "127.0.0.1" }]\n'
            f'[storage]\ndata_dir = "{root / "data"}"\nmin_free_mb = 64\n'
            '[logging]\nlevel = "WARNING"\n'
        )
        config = load_config(path)
        (config.storage.spool_dir / "tmp" / config.storage.node).mkdir(parents=True)
        engine = make_engine(config.storage.resolved_database_url)
        upgrade(engine)
        engine.dispose()
        pool = ReceiverPool(config)
        pool.start()
        try:
            rates = [send(files, pool.port, args.associations) for _ in range(args.runs)]
        finally:
            pool.stop()
        print(" ".join(f"{rate:.0f}" for rate in rates), "img/s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

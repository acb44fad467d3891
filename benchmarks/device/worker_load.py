#!/usr/bin/env python3
"""Issue 4 on two GPUs: where one batch's time goes inside a worker, and one GPU against two.

Run on nvidia-h200-x2 from the repository root, after `source benchmarks/device/setup_ort.sh`:

    timeout 240 python3 benchmarks/device/worker_load.py

Everything uses the daemon's own pieces (`WorkerPool`, one `Batcher` per shipped model, the
shipped lung-seg and nodule-det 2.0.0, batch 64, ONNX Runtime CUDA FP16 as a worker loads it).

(a) trace: one GPU worker; batches of 64 submitted straight to it, lung-seg and nodule-det in
    turn, with 1, 2 and 3 in flight; each batch's `BatchTrace` splits its round trip into
    the way to a free runner thread of the worker (a batch waiting for a free set of engines
    waits in the pipe), the engine's copy in, run and copy out, the rest of the worker's time,
    the reply and the way back to the daemon.
(b) load: 16 client threads send 96 studies of 300 preprocessed slices through both models
    (a slice counts once per model) on a one-GPU pool and on a two-GPU pool, alternately and
    `--repeats` times each, with each GPU's utilisation, SM clock and power (`nvidia-smi`, every
    100 ms), each worker's busy fraction and CPU, the daemon process's CPU, and the medians of
    the traces under load.
(c) when time is left: (a) and one load with `gpu_threads=0` (ONNX Runtime's default thread
    pool in the GPU sessions, as before this change), then the same engines in this process,
    back to back and with a 5 ms pause (asleep, then spinning) before each batch.

Steps that no longer fit in `--budget-s` are skipped and said so. Writes `$OUT/issue4.json`
(after every step) and prints a table and a `headline:` line last. A reduced dry run for any
machine: `python3 benchmarks/device/worker_load.py --cpu` (CPU workers, small studies).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "device"))

from multi_gpu import gpu_sampler, proc_cpu_s, run_studies, self_cpu_s  # noqa: E402

from imaging_ai.arena import SliceArena, SlotBatch  # noqa: E402
from imaging_ai.batch import Batcher  # noqa: E402
from imaging_ai.batch_policy import BatchingConfig  # noqa: E402
from imaging_ai.infer.base import infer_into  # noqa: E402
from imaging_ai.infer.ort import last_stages  # noqa: E402
from imaging_ai.modelcard import ModelCard, load_model_card  # noqa: E402
from imaging_ai.worker_pool import WorkerPool  # noqa: E402
from imaging_ai.workers import BatchTrace, PoolConfig, WorkerSpec  # noqa: E402

NAMES = ("lung-seg", "nodule-det")
INPUT_SETS = 4  # distinct studies' inputs, so the daemon's copies do not run from the CPU cache
Row = dict[str, Any]


class Budget:
    """Wall-clock budget of the whole run; steps ask before they start."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def allows(self, what: str, needs_s: float) -> bool:
        if self.left() >= needs_s:
            return True
        print(f"skipped {what}: needs about {needs_s:.0f} s, {self.left():.0f} s left", flush=True)
        return False


# ---- GPU sampling --------------------------------------------------------------------------


def gpu_figures(samples: dict[int, list[list[float]]], gpus: int) -> list[Row]:
    """Mean utilisation (fraction), SM clock and power of the first `gpus` GPUs."""
    rows = []
    for gpu in sorted(samples)[:gpus]:
        util, clock, power = (_mean(c) for c in zip(*samples[gpu], strict=True))
        rows.append({"gpu": gpu, "util": round(util / 100, 3), "sm_mhz": _rounded(clock)})
        rows[-1] |= {"power_w": _rounded(power), "samples": len(samples[gpu])}
    return rows


def _mean(values: tuple[float, ...]) -> float:
    known = [v for v in values if not np.isnan(v)]
    return float(np.mean(known)) if known else float("nan")


def _rounded(value: float) -> int | None:
    return None if np.isnan(value) else round(value)


# ---- traces --------------------------------------------------------------------------------


def _stage(i: int, t: BatchTrace) -> float:
    return t.stages[i] if t.stages else 0


def trace_row(traces: list[BatchTrace]) -> Row:
    """Medians (ms) of each part of the batches' round trips."""
    if not traces:
        return {"batches": 0}

    def ms(part: Callable[[BatchTrace], float], among: list[BatchTrace] = traces) -> float:
        return round(statistics.median(part(t) for t in among) / 1e6, 3)

    row: Row = {"batches": len(traces), "size": statistics.median(t.size for t in traces)}
    row["to_worker"] = ms(lambda t: t.received - t.sent)
    row["wait_engines"] = ms(lambda t: t.started - t.received)
    staged = [t for t in traces if t.stages is not None]
    if staged:
        for i, name in enumerate(("copy_in", "run", "copy_out")):
            row[name] = ms(partial(_stage, i), staged)
        row["rest_in_worker"] = ms(
            lambda t: t.ended - t.started - (sum(t.stages) if t.stages else 0), staged
        )
    row["in_worker"] = ms(lambda t: t.ended - t.started)
    row["reply"] = ms(lambda t: t.replied - t.ended)
    row["back"] = ms(lambda t: t.returned - t.replied)
    row["round_trip"] = ms(lambda t: t.returned - t.sent)
    trips = sorted(t.returned - t.sent for t in traces)
    row["round_trip_p90"] = round(trips[int(0.9 * (len(trips) - 1))] / 1e6, 3)
    return row


RAW_FIELDS = (
    "model size worker runner sent received started ended replied returned copy_in run copy_out"
)


def raw_traces(traces: list[BatchTrace], models: list[str]) -> Row:
    """Every batch's trace as integers (us; times from the first send), for analysis elsewhere."""
    if not traces:
        return {"fields": RAW_FIELDS, "rows": []}
    t0 = min(t.sent for t in traces)
    rows = []
    for t in traces:
        times = (t.sent, t.received, t.started, t.ended, t.replied, t.returned)
        stages = t.stages or (0, 0, 0)
        rows.append(
            [models.index(t.model), t.size, t.worker, t.runner]
            + [(v - t0) // 1000 for v in times]
            + [v // 1000 for v in stages]
        )
    return {"fields": RAW_FIELDS, "rows": rows}


def trace_in_flight(
    pool: WorkerPool, cards: list[ModelCard], batch: int, deep: int, seconds: float
) -> list[Row]:
    """Batches of `batch` straight to the pool, models in turn, `deep` in flight; per model."""
    arenas: dict[str, SliceArena] = {}
    free, errors = threading.Semaphore(deep), []

    def done(error: BaseException | None) -> None:
        if error is not None:
            errors.append(error)
        free.release()

    try:
        rng = np.random.default_rng(0)
        for c in cards:
            arena = SliceArena.create(batch * deep, c.input_shape, pool.output_shape(c.name))
            arenas[c.name] = arena
            arena.inputs[...] = rng.random(arena.inputs.shape, dtype=np.float32)
        for card in cards:  # the worker maps and page-locks new arenas on their first batch
            free.acquire()
            pool.reserve((1, 0.0, 0), 30.0)
            pool.submit(card.name, SlotBatch(arenas[card.name], tuple(range(batch))), done)
        for _ in range(deep):
            free.acquire()
        for _ in range(deep):
            free.release()
        pool.take_traces()
        samples: dict[int, list[list[float]]] = {}
        with gpu_sampler(samples):
            sent, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds and not errors:
                card = cards[sent % len(cards)]
                group = (sent // len(cards)) % deep  # never two batches in flight on one slot
                free.acquire()
                if not pool.reserve((1, 0.0, sent), 30.0):
                    raise RuntimeError("the worker pool granted no room in 30 s")
                slots = tuple(range(group * batch, (group + 1) * batch))
                pool.submit(card.name, SlotBatch(arenas[card.name], slots), done)
                sent += 1
            for _ in range(deep):
                free.acquire()
            elapsed = time.perf_counter() - t0
        if errors:
            raise RuntimeError(f"a traced batch failed: {errors[0]}")
        traces = pool.take_traces()
    finally:
        for arena in arenas.values():
            arena.close()
    rows = []
    for card in cards:
        mine = [t for t in traces if t.model == card.name]
        rows.append({"in_flight": deep, "model": card.name} | trace_row(mine))
    per_pair = round(elapsed / (sent / len(cards)) * 1e3, 2)
    pair: Row = {"in_flight": deep, "model": "pair", "ms_per_pair": per_pair}
    rows.append(pair | {"gpu": gpu_figures(samples, 1)})
    return rows


# ---- load ----------------------------------------------------------------------------------


class Pool:
    """A started WorkerPool with a Batcher per model."""

    def __init__(self, gpus: int, args: argparse.Namespace, cards: list[ModelCard], **spec: Any):
        self.gpus, self.cards = gpus, cards
        worker_spec = WorkerSpec(
            model_dirs=tuple(c.folder for c in cards),
            backend=args.backend,
            data_dir=Path("/tmp/imaging-ai-data"),
            precision="fp16",
            max_batch_size=args.batch,
        )
        self.spec = replace(worker_spec, **spec)
        on_cpu = args.backend == "onnxruntime-cpu"
        config = PoolConfig(gpus=0 if on_cpu else gpus, cpu_workers=gpus, depth=args.depth)
        self.pool = WorkerPool(self.spec, config)
        t0 = time.perf_counter()
        self.pool.start()
        knobs = BatchingConfig(
            max_batch_size=args.batch, max_queue_delay_ms=2.0, max_pending=args.max_pending
        )
        self.batchers = {c.name: Batcher(c.name, knobs, self.pool) for c in cards}
        for b in self.batchers.values():
            b.start()
        self.start_s = round(time.perf_counter() - t0, 1)
        self.warm = False

    def stop(self) -> None:
        for b in self.batchers.values():
            b.stop()
        self.pool.stop()


def timed_load(p: Pool, inputs: list[dict[str, Any]], args: argparse.Namespace) -> Row:
    """The timed load on a pool (after one warm-up load the first time), with its figures."""
    if not p.warm:
        run_studies(p.batchers, p.cards, inputs, min(args.clients, args.studies), args.clients)
        p.warm = True
    before = {w.index: (w.busy_s, w.batches_done, w.pid) for w in p.pool.status()}
    worker_cpu0 = {i: proc_cpu_s(pid) for i, (_, _, pid) in before.items() if pid}
    samples: dict[int, list[list[float]]] = {}
    queue_depths: list[int] = []
    stop = threading.Event()

    def watch_queue() -> None:  # is the daemon side keeping the batchers' queues full?
        while not stop.wait(0.05):
            queue_depths.append(sum(b.pending for b in p.batchers.values()))

    watcher = threading.Thread(target=watch_queue, daemon=True)
    p.pool.take_traces()
    cpu0 = self_cpu_s()
    with gpu_sampler(samples):
        watcher.start()
        seconds, spread = run_studies(p.batchers, p.cards, inputs, args.studies, args.clients)
        stop.set()
    watcher.join()
    parent = (self_cpu_s() - cpu0) / seconds
    traces = p.pool.take_traces()
    workers = []
    for w in p.pool.status():
        busy0, batches0, pid = before[w.index]
        cpu = (proc_cpu_s(pid) - worker_cpu0[w.index]) / seconds if pid else float("nan")
        workers.append(
            {
                "device": w.device,
                "busy": round((w.busy_s - busy0) / seconds, 3),
                "batches": w.batches_done - batches0,
                "cpu_cores": round(cpu, 2),
                "fallbacks": w.fallbacks,
            }
        )
    return {
        "gpus": p.gpus,
        "gpu_threads": p.spec.gpu_threads,
        "seconds": round(seconds, 3),
        "slices_per_s": round(args.studies * args.slices * len(p.cards) / seconds, 1),
        "parent_cpu_cores": round(parent, 2),
        "queued_slices_median": statistics.median(queue_depths) if queue_depths else None,
        "queue_empty_fraction": round(np.mean([q == 0 for q in queue_depths]), 3)
        if queue_depths
        else None,
        "workers": workers,
        "gpu": gpu_figures(samples, p.gpus),
        "traces": {c.name: trace_row([t for t in traces if t.model == c.name]) for c in p.cards},
        "raw": raw_traces(traces, [c.name for c in p.cards]),
        "max_spread": spread,
        "start_s": p.start_s,
    }


# ---- the same engines in this process ------------------------------------------------------


GAPS = (("here", ""), ("here, 5 ms sleep", "sleep"), ("here, 5 ms spin", "spin"))
GAP_S = 0.005  # about what a hand-over left the GPU idle in the worker check


def in_process(args: argparse.Namespace, cards: list[ModelCard], seconds: float) -> list[Row]:
    """Both models' engines loaded here as a worker loads them, fed from page-locked arenas.

    Batches back to back, then with a 5 ms pause before each (asleep, then spinning): if a
    pause alone slows the next batch, the GPU or the host's power states do, not the worker.
    """
    from imaging_ai import worker_arenas, workers

    spec = WorkerSpec(
        tuple(c.folder for c in cards), backend=args.backend, max_batch_size=args.batch
    )
    device = "cpu" if args.backend == "onnxruntime-cpu" else "cuda:0"
    engines, _ = workers._load_engines(spec, device)
    mapped = worker_arenas.MappedArenas(page_lock=device != "cpu")
    arenas = {}
    rows: list[Row] = []
    try:
        for card in cards:
            out = engines[card.name].infer(np.zeros((1, *card.input_shape), np.float32)).shape
            made = SliceArena.create(args.batch, card.input_shape, out[1:])
            made.inputs[...] = np.random.default_rng(0).random(made.inputs.shape, np.float32)
            arenas[card.name] = (made, mapped.get(made.ref))
        for label, gap in GAPS:
            views = {name: view for name, (_, view) in arenas.items()}
            rows += _batches_here(engines, views, label, gap, seconds)
    finally:
        mapped.close()
        for made, _ in arenas.values():
            made.close()
        for engine in engines.values():
            engine.close()
    return rows


def _batches_here(
    engines: dict[str, Any], views: dict[str, SliceArena], label: str, gap: str, seconds: float
) -> list[Row]:
    times: dict[str, list[tuple[int, tuple[int, int, int] | None]]] = {n: [] for n in views}
    samples: dict[int, list[list[float]]] = {}
    with gpu_sampler(samples):
        t0 = time.perf_counter()
        pairs = 0
        while time.perf_counter() - t0 < seconds:
            for name, view in views.items():
                if gap == "sleep":
                    time.sleep(GAP_S)
                elif gap == "spin":
                    until = time.perf_counter() + GAP_S
                    while time.perf_counter() < until:
                        pass
                start = time.perf_counter_ns()
                infer_into(engines[name], [view.inputs], [view.outputs])
                times[name].append((time.perf_counter_ns() - start, last_stages()))
            pairs += 1
        elapsed = time.perf_counter() - t0
    rows: list[Row] = []
    for name, got in times.items():
        got = got[1:] or got  # the first one pays for the arena's first touch
        row: Row = {"in_flight": label, "model": name, "batches": len(got)}
        row["in_worker"] = round(statistics.median(ns for ns, _ in got) / 1e6, 3)
        staged = [s for _, s in got if s is not None]
        if staged:
            for i, part in enumerate(("copy_in", "run", "copy_out")):
                row[part] = round(statistics.median(s[i] for s in staged) / 1e6, 3)
        rows.append(row)
    per_pair = round(elapsed / max(pairs, 1) * 1e3, 2)
    pair: Row = {"in_flight": label, "model": "pair", "ms_per_pair": per_pair}
    rows.append(pair | {"gpu": gpu_figures(samples, 1)})
    return rows


# ---- report --------------------------------------------------------------------------------

TRACE_COLUMNS = (
    "to_worker",
    "wait_engines",
    "copy_in",
    "run",
    "copy_out",
    "rest_in_worker",
    "in_worker",
    "reply",
    "back",
    "round_trip",
)


def trace_table(rows: list[Row]) -> list[str]:
    head = f"{'trace':<28} {'n':>5} " + " ".join(f"{c[:10]:>10}" for c in TRACE_COLUMNS)
    lines = [head + "   (ms, medians)"]
    for r in rows:
        what = f"{r.get('label', '')}{r['in_flight']} / {r['model']}"
        if r["model"] == "pair":
            gpu = "".join(
                f"; GPU {g['gpu']} util {g['util']:.0%}, SM {g['sm_mhz']} MHz, {g['power_w']} W"
                for g in r.get("gpu", [])
            )
            lines.append(f"{what:<28} {'':>5} {r['ms_per_pair']:>10.2f} ms per pair{gpu}")
            continue
        cells = " ".join(
            f"{r[c]:>10.3f}" if isinstance(r.get(c), float) else f"{'-':>10}" for c in TRACE_COLUMNS
        )
        lines.append(f"{what:<28} {r.get('batches', 0):>5} {cells}")
    return lines


def load_table(loads: list[Row]) -> list[str]:
    lines = [
        f"{'load':<18} {'slices/s':>9} {'parent':>6} {'queue0':>6}  "
        "workers busy / cpu; GPUs util / SM MHz / W"
    ]
    for r in loads:
        what = f"{r['gpus']} GPU(s), threads {r['gpu_threads']}"
        ws = ", ".join(f"{w['busy']:.0%}/{w['cpu_cores']:.1f}" for w in r["workers"])
        gs = ", ".join(f"{g['util']:.0%}/{g['sm_mhz']}/{g['power_w']}" for g in r["gpu"]) or "-"
        empty = r["queue_empty_fraction"]
        lines.append(
            f"{what:<18} {r['slices_per_s']:>9.0f} {r['parent_cpu_cores']:>6.2f} "
            f"{'-' if empty is None else f'{empty:.0%}':>6}  {ws}; {gs}"
        )
    return lines


def headline(loads: list[Row]) -> str:
    main = [r for r in loads if r["gpu_threads"] == 1]
    one = [r["slices_per_s"] for r in main if r["gpus"] == 1]
    two = [r["slices_per_s"] for r in main if r["gpus"] == 2]
    if not one or not two:
        return "headline: no one-vs-two comparison (a load failed or was skipped; see above)"
    ratio = statistics.median(two) / statistics.median(one)
    busy = [w["busy"] for r in main if r["gpus"] == 2 for w in r["workers"]]
    util = [g["util"] for r in main if r["gpus"] == 2 for g in r["gpu"]]
    utils = f"{min(util):.0%}-{max(util):.0%}" if util else "not sampled"
    return (
        f"headline: two GPUs at {ratio:.2f}x one (medians {statistics.median(two):,.0f} vs "
        f"{statistics.median(one):,.0f} slices/s; runs {', '.join(f'{v:,.0f}' for v in two)} vs "
        f"{', '.join(f'{v:,.0f}' for v in one)}); on two GPUs workers busy "
        f"{min(busy):.0%}-{max(busy):.0%}, GPU util {utils} (goals: >= 1.8x, >= 80%)"
    )


# ---- main ----------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--budget-s", type=float, default=200.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--studies", type=int, default=96)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--slices", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--depth", type=int, default=2, help="PoolConfig.depth")
    parser.add_argument("--max-pending", type=int, default=1024)
    parser.add_argument("--trace-s", type=float, default=3.0)
    parser.add_argument("--backend", default="onnxruntime-cuda")
    parser.add_argument("--cpu", action="store_true", help="reduced dry run on CPU workers")
    args = parser.parse_args()
    if args.cpu:
        args.backend, args.studies, args.clients, args.slices = "onnxruntime-cpu", 4, 4, 16
        args.batch, args.max_pending, args.trace_s = 8, 64, 1.0
    return args


class Report:
    """What the run found so far, written to $OUT after every step."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.data: Row = {"args": vars(args), "traces": [], "loads": [], "skipped": []}
        out = os.environ.get("OUT")
        self.path = Path(out, "issue4.json") if out else None

    def save(self) -> None:
        if self.path is not None:
            self.path.write_text(json.dumps(self.data, indent=1, default=str))

    def step(self, what: str, action: Callable[[], Any]) -> Any:
        """Run one step; a failure is recorded and printed, and the run goes on."""
        t0 = time.perf_counter()
        try:
            result = action()
        except Exception as exc:  # keep what the other steps measure
            print(f"{what} FAILED after {time.perf_counter() - t0:.0f} s: {exc!r}", flush=True)
            self.data["skipped"].append(f"{what}: {type(exc).__name__}: {exc}")
            result = None
        else:
            print(f"{what}: {time.perf_counter() - t0:.1f} s", flush=True)
        self.save()
        return result


def main() -> int:
    args = parse_args()
    budget, report = Budget(args.budget_s), Report(args)
    cards = [load_model_card(ROOT / "engines" / n) for n in NAMES]
    print("models:", ", ".join(f"{c.name} {c.version} {c.input_shape}" for c in cards), flush=True)
    rng = np.random.default_rng(1)
    inputs = [
        {c.name: rng.random((args.slices, *c.input_shape), dtype=np.float32) for c in cards}
        for _ in range(INPUT_SETS)
    ]
    pools: dict[str, Pool] = {}
    try:
        run_all(args, budget, report, cards, inputs, pools)
    finally:
        for p in pools.values():
            with contextlib.suppress(Exception):
                p.stop()
    if budget.allows("the engines in this process", 20 + len(GAPS) * args.trace_s):
        rows = report.step("in process", lambda: in_process(args, cards, args.trace_s))
        report.data["traces"] += rows or []
        report.save()
    under_load = [
        row | {"in_flight": f"load {r['gpus']}G t{r['gpu_threads']}", "model": name}
        for r in report.data["loads"]
        for name, row in r["traces"].items()
    ]
    print("\n".join(trace_table(report.data["traces"] + under_load)))
    print("\n".join(load_table(report.data["loads"])))
    for skipped in report.data["skipped"]:
        print("not done:", skipped)
    print(headline(report.data["loads"]), flush=True)
    return 0


def run_all(
    args: argparse.Namespace,
    budget: Budget,
    report: Report,
    cards: list[ModelCard],
    inputs: list[dict[str, Any]],
    pools: dict[str, Pool],
) -> None:
    """(a) traces on one GPU, (b) loads on one and two GPUs in turn, (c) the old threads."""
    pools["1"] = report.step("start 1-GPU pool", lambda: Pool(1, args, cards))
    if pools["1"] is None:
        del pools["1"]
        return
    for deep in (1, 2, 3):
        rows = report.step(
            f"trace, {deep} in flight",
            partial(trace_in_flight, pools["1"].pool, cards, args.batch, deep, args.trace_s),
        )
        report.data["traces"] += rows or []
    if budget.allows("the 2-GPU pool", 60):
        pools["2"] = report.step("start 2-GPU pool", lambda: Pool(2, args, cards))
        if pools["2"] is None:
            del pools["2"]
    load_s = 15.0
    for _ in range(args.repeats):
        for key in ("1", "2"):
            if key in pools and budget.allows(f"a load on {key} GPU(s)", load_s + 5):
                t0 = time.perf_counter()
                row = report.step(
                    f"load, {key} GPU(s)", partial(timed_load, pools[key], inputs, args)
                )
                if row is not None:
                    load_s = time.perf_counter() - t0
                    report.data["loads"].append(row)
                    brief = {k: v for k, v in row.items() if k not in ("traces", "raw")}
                    print(json.dumps(brief), flush=True)
    for key in list(pools):
        pools.pop(key).stop()
    if budget.allows("the gpu_threads=0 comparison", 40 + load_s):
        old = report.step(
            "start 1-GPU pool, gpu_threads=0", lambda: Pool(1, args, cards, gpu_threads=0)
        )
        if old is None:
            return
        pools["old"] = old
        rows = report.step(
            "trace, 1 in flight, gpu_threads=0",
            lambda: trace_in_flight(old.pool, cards, args.batch, 1, args.trace_s),
        )
        report.data["traces"] += [r | {"label": "threads 0: "} for r in rows or []]
        row = report.step("load, 1 GPU, gpu_threads=0", lambda: timed_load(old, inputs, args))
        if row is not None:
            report.data["loads"].append(row)
        pools.pop("old").stop()


if __name__ == "__main__":
    sys.exit(main())

"""Takes phantom studies and gives one study's turnaround, from its last instance received to its
SEG and SR stored in PACS (its report is on the API before that), p50 and p95, by stage.

`imaging-ai bench turnaround --studies 5 --slices 300`: Orthanc, as the hospital's PACS, pushes
each study in turn (one association, released at the end) to an otherwise idle daemon with its
default assembly rules, which sends its results back to Orthanc and its ORU to a stand-in RIS
(`imaging_ai_devkit.bench.stack`). The stage times are the daemon's own records
(`imaging_ai_devkit.bench.stages`). The peer, in the same run and on the same machine: the
analysis of the first study alone in this process, as `imaging-ai infer` runs it (reading,
preprocessing, both models, postprocessing), with none of the daemon's receiving, queueing, workers,
outputs or delivery. The backend is the daemon's ``[engines] backend``: ONNX Runtime CPU unless
``IMAGING_AI_ENGINES__BACKEND`` says otherwise (the device run sets onnxruntime-cuda).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from imaging_ai import progress as bars
from imaging_ai.config import AssembleConfig
from imaging_ai.stats import quantile
from imaging_ai_devkit.bench.harness import ENGINES_DIR, describe_filesystem
from imaging_ai_devkit.bench.orthanc import OrthancPacs
from imaging_ai_devkit.bench.schedule import make_study
from imaging_ai_devkit.bench.stack import Hospital, HospitalOptions, study_identity
from imaging_ai_devkit.bench.stages import StudyStages, label, read_stages


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `imaging-ai bench turnaround`."""
    parser.add_argument("--studies", type=int, default=5, help="studies, sent one at a time")
    parser.add_argument("--slices", type=int, default=300, help="slices per phantom study")
    parser.add_argument(
        "--idle",
        type=float,
        help="series and study idle timers (s; default the daemon's, 10 and 20: the release "
        "rule completes a pushed study first)",
    )
    parser.add_argument(
        "--release-grace", type=float, help="assemble.release_grace_s (s; default the daemon's)"
    )
    parser.add_argument(
        "--budget", type=float, default=0.0, help="stop sending studies past this many s (0: none)"
    )
    parser.add_argument("--json", type=Path, help="write the studies' stages and the figures")
    parser.add_argument("--batch", type=int, default=0, help="engines.max_batch_size (0: default)")
    parser.add_argument("--goal", type=float, default=30.0, help="goal for p95 (s; default 30)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait per study")
    parser.add_argument("--plot", type=Path, help="write the stages of each study as PNG")
    bars.add_argument(parser)


def run(
    args: argparse.Namespace, pacs: Callable[[Path, str, int], OrthancPacs] = OrthancPacs
) -> int:
    """Run the benchmark and print the table; the last line starts with headline:.

    ``pacs`` makes the PACS (see `Hospital`); Orthanc unless a script brings another.
    """
    started = time.monotonic()
    backend = os.environ.get("IMAGING_AI_ENGINES__BACKEND", "onnxruntime-cpu")
    with tempfile.TemporaryDirectory(prefix="imaging-ai-bench-turnaround-") as tmp:
        work = Path(tmp)
        studies = []
        made = bars.progress(
            range(args.studies), desc="phantoms", unit="study", force=args.progress
        )
        with made:
            for i in made:
                bars.echo(f"generating study {i + 1}/{args.studies} ({args.slices} slices)")
                accession = f"TURN-{i + 1}"
                studies.append(
                    make_study(work / accession, 7300 + i, args.slices, "urgent", accession)
                )
        print(f"peer: the first study analysed in this process ({backend})", flush=True)
        bare = bare_analysis(studies[0], backend)
        with Hospital(work / "hospital", hospital_options(args), pacs) as hospital:
            # The engines load and warm up after HTTP answers; their start-up is not a study's.
            wait_ready(hospital)
            results = _all(hospital, studies, args, started)
            # Reported before the daemon stops, so a slow shutdown cannot cost the figures.
            setup = f"{backend}, PACS {pacs.__name__}, data on {describe_filesystem(work)}"
            return report(results, bare, setup, args)


def report(results: list[StudyStages], bare: float, setup: str, args: argparse.Namespace) -> int:
    """Print the table (and write the plot and JSON if asked); the headline last."""
    if not results:
        print("headline: turnaround not measured: no study came back (see above)", flush=True)
        return 1
    _print(results, bare, setup, args)
    if args.plot:
        from imaging_ai_devkit.bench.plots import turnaround_stages

        title = f"turnaround of {args.slices}-slice studies by stage ({setup.split(',')[0]})"
        turnaround_stages(results, args.plot, title)
        print(f"plot: {args.plot}")
    line = headline(results, bare, args)
    if args.json:
        figures = {"setup": setup, "bare_s": bare, "headline": line, "args": vars(args)}
        studies_json = [asdict(r) for r in results]
        args.json.write_text(json.dumps({**figures, "studies": studies_json}, default=str))
    print(line, flush=True)
    return 0


def hospital_options(args: argparse.Namespace) -> HospitalOptions:
    """The daemon's assembly as configured by default, unless the options say otherwise."""
    default = AssembleConfig()
    series, study = (
        (args.idle, args.idle) if args.idle else (default.series_idle_s, default.study_idle_s)
    )
    engines = f"max_batch_size = {args.batch}" if args.batch else ""
    return HospitalOptions(
        series, study, default.poll_s, engines, "WARNING", release_grace_s=args.release_grace
    )


def wait_ready(hospital: Hospital, timeout_s: float = 180) -> None:
    """Wait until the daemon's /readyz says every check is ok (its workers warmed up)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            hospital.daemon.get("/readyz")
            return
        except OSError:  # 503 (HTTPError) until every check is ok
            time.sleep(0.2)
    raise RuntimeError(
        f"daemon not ready within {timeout_s:.0f} s: {hospital.daemon.log()[-2000:]}"
    )


def _all(
    hospital: Hospital, studies: list[list[Path]], args: argparse.Namespace, started: float
) -> list[StudyStages]:
    """Every study in turn; within ``--budget``, those that fit, judged by the slowest yet."""
    results: list[StudyStages] = []
    longest = 0.0
    # A bar of the studies back on stderr; the lines above it go through echo (stdout).
    with bars.progress(
        total=len(studies), desc="turnaround", unit="study", force=args.progress
    ) as bar:
        for n, files in enumerate(studies, start=1):
            left = args.budget - (time.monotonic() - started)
            if args.budget and results and left < 1.5 * longest:
                bars.echo(
                    f"  {left:.0f} s of the budget left: stopping after {len(results)} studies"
                )
                break
            t = time.monotonic()
            try:
                results.append(_one(hospital, files, n, args))
            except (RuntimeError, LookupError) as exc:
                tail = "\n".join(hospital.daemon.log().splitlines()[-15:])
                bars.echo(f"  study {n} FAILED: {exc}\n  the daemon's log ends:\n{tail}")
                break
            bar.update()
            longest = max(longest, time.monotonic() - t)
    return results


def bare_analysis(files: list[Path], backend: str) -> float:
    """Seconds for `imaging_ai.analyse.analyse_study` on ``files`` (models loaded first)."""
    from imaging_ai.analyse import analyse_study, load_models
    from imaging_ai.config import EnginesConfig

    with tempfile.TemporaryDirectory() as data:
        models = load_models(EnginesConfig(dir=str(ENGINES_DIR), backend=backend), Path(data))
        start = time.perf_counter()
        analyse_study(files, models)
        seconds = time.perf_counter() - start
        for model in (models.lungs, models.nodules):
            model.engine.close()
    return seconds


def _one(hospital: Hospital, files: list[Path], n: int, args: argparse.Namespace) -> StudyStages:
    """Push one study from Orthanc, wait for its results there, read its stages."""
    uid, accession = study_identity(files)
    orthanc_id = hospital.upload(files)
    hospital.push(orthanc_id)
    deadline = time.monotonic() + args.timeout
    while hospital.state(uid) != "done":
        if time.monotonic() > deadline or hospital.state(uid) == "failed":
            raise RuntimeError(f"study {n}: no results within {args.timeout} s")
        time.sleep(0.1)
    results = hospital.results(uid, accession, orthanc_id)
    if results.problems():
        raise RuntimeError(f"study {n}: {'; '.join(results.problems())}")
    stages = read_stages(hospital.database_url, uid)
    name, seconds = stages.slowest
    bars.echo(
        f"  study {n}/{args.studies}: {stages.turnaround_s:.1f} s "
        f"(report on the API after {stages.report_s:.1f} s; slowest: {label(name)} "
        f"{seconds:.1f} s)"
    )
    return stages


def _print(results: list[StudyStages], bare: float, setup: str, args: argparse.Namespace) -> None:
    print()
    options = hospital_options(args)
    completions = ", ".join(sorted({r.completion for r in results}))
    print(
        f"turnaround: {len(results)} studies of {args.slices} slices, one at a time, pushed by "
        f"the PACS; {setup}; idle timers {options.series_idle_s:g}/{options.study_idle_s:g} s, "
        f"completed by: {completions}"
    )
    print("from the last instance received to SEG+SR stored in PACS (p95 nearest-rank)")
    print(f"{'stage':<40} {'p50 s':>7} {'p95 s':>7} {'share':>6}")
    stages = list(dict.fromkeys(k for r in results for k in r.stages))
    total = sum(r.turnaround_s for r in results)
    for stage in stages:
        values = [r.stages.get(stage, 0.0) for r in results]
        print(
            f"{label(stage):<40} {quantile(values, 0.5):>7.2f} {quantile(values, 0.95):>7.2f} "
            f"{sum(values) / total:>6.0%}"
        )
    turnaround = [r.turnaround_s for r in results]
    reports = [r.report_s for r in results]
    print(f"{'turnaround (SEG+SR in PACS)':<40} {quantile(turnaround, 0.5):>7.2f} "
          f"{quantile(turnaround, 0.95):>7.2f}")  # fmt: skip
    print(f"{'report on the RIS API':<40} {quantile(reports, 0.5):>7.2f} "
          f"{quantile(reports, 0.95):>7.2f}")  # fmt: skip
    print(f"{'peer: bare analysis, one study':<40} {bare:>7.2f}")


def headline(results: list[StudyStages], bare: float, args: argparse.Namespace) -> str:
    """p50/p95 against the goal, the slowest stage by its median, and the peer."""
    turnaround = [r.turnaround_s for r in results]
    p50, p95 = quantile(turnaround, 0.5), quantile(turnaround, 0.95)
    medians = {
        stage: quantile([r.stages.get(stage, 0.0) for r in results], 0.5)
        for stage in results[0].stages
    }
    slowest = max(medians, key=lambda k: medians[k])
    verdict = "met" if p95 <= args.goal else "not met"
    return (
        f"headline: turnaround p50 {p50:.1f} s, p95 {p95:.1f} s for a {args.slices}-slice "
        f"study (goal <= {args.goal:g} s: {verdict}); slowest stage {label(slowest)} "
        f"(p50 {medians[slowest]:.1f} s); bare analysis {bare:.1f} s"
    )

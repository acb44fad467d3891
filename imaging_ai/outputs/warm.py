"""Builds one small set of results at start, so the first study does not pay first-use costs.

The first SEG and SR a process builds take about 0.4 s longer than the next ones (pydicom's
and highdicom's code dictionaries, value representations and templates are set up on first
use). A hospital's first study of the day should not wait for that, so the daemon encodes the
results of a small fixture in memory while its inference workers load their engines: four
64 x 64 slices of a synthetic CT and its lungs, shipped in ``warm_fixture/`` (package data,
written once by the development kit's ``imaging_ai_devkit.warm_fixture``). Nothing is written
to disk and nothing is sent.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from importlib import resources

import numpy as np
from numpy.typing import NDArray

from imaging_ai.analyse import Analysis
from imaging_ai.config import Config
from imaging_ai.outputs.common import read_headers
from imaging_ai.outputs.files import EncodedResults, encode_results
from imaging_ai.outputs.messages import MessageBuilder
from imaging_ai.postprocess import LESION, measure, organ_volumes_ml
from imaging_ai.volume import Volume, load_series

log = logging.getLogger(__name__)

_FIXTURE = "warm_fixture"
_WARM_JOB = 0  # job ids start at 1: the warm-up's UIDs are never a real job's


def warm_up_outputs(config: Config, builder: MessageBuilder | None = None) -> float:
    """Encode a SEG, SR, ORU and FHIR bundle of the fixture; return the seconds it took.

    With a ``builder`` its process makes the messages, which warms it up too.

    Raises whatever the encoders raise: a failure here would fail every study too, and the
    caller decides whether that stops the start.
    """
    started = time.perf_counter()
    fixture_results(config, builder)
    return time.perf_counter() - started


def fixture_results(config: Config, builder: MessageBuilder | None = None) -> EncodedResults:
    """The fixture's results as ``config`` has them made (SEG, the SR in each class its PACS
    destinations take, ORU, FHIR), in memory: the warm-up's, and a real sample of what the
    daemon sends (``scripts/conformance_tables.py`` reads their SOP classes and syntaxes)."""
    with resources.as_file(resources.files("imaging_ai.outputs") / _FIXTURE) as folder:
        paths = sorted(folder.glob("*.dcm"))
        volume = load_series(paths, workers=1)
        headers = read_headers(paths)
        with (folder / "lungs.npz").open("rb") as f, np.load(f, allow_pickle=False) as lungs:
            lung_labels = lungs["labels"]
    analysis = _analysis(volume, lung_labels)
    when = datetime.now(UTC)
    return encode_results(analysis, headers, _WARM_JOB, when, "warm-up", config, builder)


def _analysis(volume: Volume, lung_labels: NDArray[np.uint8]) -> Analysis:
    """Lungs from the fixture's truth and one small lesion in a lung, measured as a real one."""
    # The labels only need to be plausible, not exact, to exercise the encoders.
    labels = lung_labels.astype(np.uint8)
    lung = np.argwhere(labels > 0)
    if len(lung) == 0:
        raise RuntimeError("the warm-up fixture has no lung voxels")
    s, r, c = lung[len(lung) // 2]
    block = np.stack(
        np.meshgrid(
            np.arange(s, s + 1),
            np.arange(max(r - 2, 0), r + 3),
            np.arange(max(c - 2, 0), c + 3),
            indexing="ij",
        ),
        axis=-1,
    ).reshape(-1, 3)
    lesion = measure(1, block, np.full(len(block), 0.9, np.float32), volume, labels)
    marked = labels.copy()
    marked[tuple(block.T)] = LESION
    return Analysis(
        volume=volume,
        labels=marked,
        lesions=(lesion,),
        organ_volumes_ml=organ_volumes_ml(labels, volume),
        models={
            "lung-seg": {"name": "lung-seg", "version": "0", "sha256": "0" * 64},
            "nodule-det": {"name": "nodule-det", "version": "0", "sha256": "0" * 64},
        },
    )

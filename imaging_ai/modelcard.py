"""Model folders (`engines/<model>/model.toml` + `model.onnx`) in; validated, frozen ModelCards out.

A model card says what a model takes, what it gives and what it is worth: its input tensor,
the preprocessing the pipeline must apply, the meaning of every output channel (with SNOMED CT
codes for DICOM SEG/SR), thresholds, measured quality and where the training data came from.
`engines/README.md` shows a complete card and documents every key.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, NoReturn, cast

from imaging_ai.errors import ModelError

# "classification": a candidate classifier, which decides on each candidate lesion the detector
# proposed from a 3-D patch around it (LUNA16's false-positive reduction stage).
Task = Literal["segmentation", "detection", "classification"]
TASKS: tuple[Task, ...] = ("segmentation", "detection", "classification")
OutputKind = Literal["softmax", "sigmoid", "logits"]
Normalise = Literal["minmax", "zscore"]
Denoise = Literal["none", "gaussian", "median"]
QualityValue = float | int | str

CARD_FILE = "model.toml"
ONNX_FILE = "model.onnx"
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_MISSING = object()


@dataclass(frozen=True)
class CodedConcept:
    """A coded concept as DICOM writes it: (code value, coding scheme designator, meaning)."""

    code: str
    scheme: str
    meaning: str


@dataclass(frozen=True)
class InputSpec:
    """The model's input tensor: name, channels, spatial size, dtype and layout.

    ``context_slices`` > 0 makes a 2.5-D input: each slice travels with that many neighbours on
    either side as channels (``channels = 2 * context_slices + 1``, the slice itself in the
    middle), ``context_spacing_mm`` apart along the slice normal, rounded to whole slices (at
    least one); 0 means adjacent slices.
    """

    name: str
    channels: int
    height: int
    width: int
    dtype: Literal["float32"] = "float32"
    layout: Literal["NCHW", "NCDHW"] = "NCHW"
    context_slices: int = 0
    context_spacing_mm: float = 0.0
    depth: int = 0  # voxels along the slice normal of a 3-D patch (NCDHW); 0 for slices


@dataclass(frozen=True)
class PatchSpec:
    """Where a candidate classifier's 3-D patches are sampled: one isotropic spacing (mm) per
    input channel, each channel the same candidate at its own scale (field of view = patch size
    times spacing), centred on the candidate."""

    spacing_mm: tuple[float, ...]


@dataclass(frozen=True)
class PreprocessSpec:
    """Preprocessing the pipeline applies before inference: HU window, normalisation, denoise."""

    window_center: float
    window_width: float
    normalise: Normalise
    denoise: Denoise = "none"
    denoise_sigma_mm: float = 0.0


@dataclass(frozen=True)
class OutputSpec:
    """The output tensor the pipeline reads: name, activation kind and channel count."""

    name: str
    kind: OutputKind
    channels: int


@dataclass(frozen=True)
class Label:
    """One output class: its segment number, output channel, codes and threshold."""

    value: int
    channel: int
    name: str
    category: CodedConcept
    type: CodedConcept
    threshold: float
    anatomic_region: CodedConcept | None = None
    min_volume_mm3: float = 0.0


@dataclass(frozen=True)
class Provenance:
    """Where the training data came from, and whether the project ships this model."""

    training_data: str
    shipped: bool = False


@dataclass(frozen=True)
class ModelCard:
    """A validated model card plus the identity (path, sha256) of the ONNX file beside it."""

    name: str
    version: str
    task: Task
    description: str
    input: InputSpec
    preprocess: PreprocessSpec
    output: OutputSpec
    labels: tuple[Label, ...]
    quality: Mapping[str, QualityValue] = field(hash=False)
    provenance: Provenance
    folder: Path
    sha256: str
    patch: PatchSpec | None = None

    @property
    def onnx_path(self) -> Path:
        """Path of the model's ONNX file."""
        return self.folder / ONNX_FILE

    @property
    def input_shape(self) -> tuple[int, ...]:
        """(channels, height, width) of one input slice, or (channels, depth, height, width) of
        one 3-D patch."""
        i = self.input
        if i.depth:
            return (i.channels, i.depth, i.height, i.width)
        return (i.channels, i.height, i.width)


class _Table:
    """A TOML table with its place in the file, so every error names file, key and value."""

    def __init__(self, data: Mapping[str, object], where: str, source: Path) -> None:
        self.data, self.where, self.source = data, where, source

    def fail(self, key: str, value: object, why: str) -> NoReturn:
        raise ModelError(f"{self.source}: {self.where}{key} = {value!r}: {why}")

    def get(self, key: str, default: object = _MISSING) -> object:
        if key in self.data:
            return self.data[key]
        if default is _MISSING:
            raise ModelError(f"{self.source}: {self.where}{key} is missing")
        return default

    def text(self, key: str, default: object = _MISSING) -> str:
        value = self.get(key, default)
        if not isinstance(value, str) or not value.strip():
            self.fail(key, value, "expected a non-empty string")
        return value

    def integer(self, key: str, minimum: int, default: object = _MISSING) -> int:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(key, value, f"expected an integer >= {minimum}")
        return value

    def number(self, key: str, default: object = _MISSING) -> float:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(key, value, "expected a number")
        return float(value)

    def flag(self, key: str, default: object = _MISSING) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            self.fail(key, value, "expected true or false")
        return value

    def choice(self, key: str, options: tuple[str, ...], default: object = _MISSING) -> str:
        value = self.get(key, default)
        if value not in options:
            self.fail(key, value, f"expected one of {', '.join(options)}")
        return value

    def table(self, key: str, where: str | None = None) -> _Table:
        value = self.get(key)
        if not isinstance(value, dict):
            self.fail(key, value, "expected a table")
        return _Table(value, where if where is not None else f"[{key}] ", self.source)

    def only(self, *allowed: str) -> None:
        """Refuse unknown keys: a misspelt `threshhold` must not silently fall back to a default."""
        for key in self.data:
            if key not in allowed:
                self.fail(key, self.data[key], f"unknown key; expected one of {', '.join(allowed)}")


def load_model_card(folder: Path) -> ModelCard:
    """Read and validate `folder/model.toml`, and hash `folder/model.onnx`.

    Parameters
    ----------
    folder : Path
        A model folder holding `model.toml` and `model.onnx`.

    Returns
    -------
    ModelCard
        The validated card; `sha256` is the hex digest of the ONNX file.

    Raises
    ------
    ModelError
        The card is missing, not TOML, or a key is missing or invalid (the message names the
        file, the key and the bad value); or `model.onnx` is missing.
    """
    path = folder / CARD_FILE
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ModelError(f"{folder}: no {CARD_FILE}; every model folder needs its card") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ModelError(f"{path}: not valid TOML: {exc}") from exc
    card = parse_model_card(data, path)
    onnx_path = folder / ONNX_FILE
    if not onnx_path.is_file():
        raise ModelError(f"{onnx_path}: missing; the card {path} needs its ONNX model beside it")
    return replace(card, folder=folder, sha256=file_sha256(onnx_path))


def parse_model_card(data: Mapping[str, object], source: Path) -> ModelCard:
    """Validate a parsed card; `folder` is `source`'s folder and `sha256` is left empty.

    Parameters
    ----------
    data : Mapping[str, object]
        The card as `tomllib` parsed it.
    source : Path
        Where the card came from, for error messages.

    Returns
    -------
    ModelCard
        The validated card.
    """
    top = _Table(data, "", source)
    sections = ("input", "preprocess", "output", "labels", "quality", "provenance", "patch")
    top.only("name", "version", "task", "description", *sections)
    name = top.text("name")
    if not _NAME_RE.match(name):
        top.fail("name", name, "expected lower-case letters, digits, '.', '_' or '-' (max 64)")
    output = _parse_output(top.table("output"))
    task = cast(Task, top.choice("task", TASKS))
    spec = _parse_input(top.table("input"), patch=task == "classification")
    return ModelCard(
        name=name,
        version=top.text("version"),
        task=task,
        description=top.text("description"),
        input=spec,
        preprocess=_parse_preprocess(top.table("preprocess")),
        output=output,
        labels=_parse_labels(top, output),
        quality=_parse_quality(top.table("quality")),
        provenance=_parse_provenance(top.table("provenance")),
        folder=source.parent,
        sha256="",
        patch=_parse_patch(top, spec) if task == "classification" else _no_patch(top),
    )


def _no_patch(top: _Table) -> PatchSpec | None:
    if "patch" in top.data:
        top.fail("patch", top.data["patch"], 'only a task = "classification" card has a [patch]')
    return None


def _parse_patch(top: _Table, spec: InputSpec) -> PatchSpec:
    t = top.table("patch")
    t.only("spacing_mm")
    spacing = t.get("spacing_mm")
    if (
        not isinstance(spacing, list)
        or len(spacing) != spec.channels
        or not all(_positive(v) for v in spacing)
    ):
        why = f"expected {spec.channels} positive spacings in mm, one per input channel"
        t.fail("spacing_mm", spacing, why)
    return PatchSpec(tuple(float(v) for v in spacing))


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _parse_input(t: _Table, *, patch: bool = False) -> InputSpec:
    t.only("name", "channels", "size", "dtype", "layout", "context_slices", "context_spacing_mm")
    if patch:
        return _parse_patch_input(t)
    size = t.get("size")
    if (
        not isinstance(size, list)
        or len(size) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size)
    ):
        t.fail("size", size, "expected [height, width], two positive integers")
    t.choice("dtype", ("float32",), "float32")
    t.choice("layout", ("NCHW",), "NCHW")
    channels, context = t.integer("channels", 1, 1), t.integer("context_slices", 0, 0)
    if channels != 2 * context + 1:  # the pipeline makes channels only from neighbouring slices
        why = f"context_slices = {context} gives {2 * context + 1} channel(s): the slice and "
        t.fail("channels", channels, why + f"{context} neighbour(s) on each side")
    spacing = t.number("context_spacing_mm", 0.0)
    if spacing < 0 or (spacing and not context):
        t.fail("context_spacing_mm", spacing, "expected >= 0 mm, with context_slices >= 1")
    return InputSpec(
        t.text("name"), channels, size[0], size[1],
        context_slices=context, context_spacing_mm=spacing,
    )  # fmt: skip


def _parse_patch_input(t: _Table) -> InputSpec:
    """A candidate classifier's input: channels of 3-D patches, [depth, height, width] voxels."""
    size = t.get("size")
    if (
        not isinstance(size, list)
        or len(size) != 3
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size)
    ):
        t.fail("size", size, "expected [depth, height, width], three positive integers")
    t.choice("dtype", ("float32",), "float32")
    t.choice("layout", ("NCDHW",), "NCDHW")
    for key in ("context_slices", "context_spacing_mm"):
        if key in t.data:
            t.fail(key, t.data[key], "a 3-D patch has no context slices")
    depth, height, width = size
    return InputSpec(
        t.text("name"), t.integer("channels", 1, 1), height, width, layout="NCDHW", depth=depth
    )


def _parse_preprocess(t: _Table) -> PreprocessSpec:
    t.only("window_center", "window_width", "normalise", "denoise", "denoise_sigma_mm")
    width = t.number("window_width")
    if width <= 0:
        t.fail("window_width", width, "expected a positive width in HU")
    denoise = t.choice("denoise", ("none", "gaussian", "median"), "none")
    sigma = t.number("denoise_sigma_mm", 0.0)
    if denoise == "none" and sigma != 0:
        t.fail("denoise_sigma_mm", sigma, 'set denoise too, or leave the sigma out for "none"')
    if denoise != "none" and sigma <= 0:
        t.fail("denoise_sigma_mm", sigma, f"denoise = {denoise!r} needs a positive sigma in mm")
    return PreprocessSpec(
        window_center=t.number("window_center"),
        window_width=width,
        normalise=cast(Normalise, t.choice("normalise", ("minmax", "zscore"))),
        denoise=cast(Denoise, denoise),
        denoise_sigma_mm=sigma,
    )


def _parse_output(t: _Table) -> OutputSpec:
    t.only("name", "kind", "channels")
    kind = cast(OutputKind, t.choice("kind", ("softmax", "sigmoid", "logits")))
    channels = t.integer("channels", 2 if kind == "softmax" else 1)
    return OutputSpec(t.text("name"), kind, channels)


def _parse_labels(top: _Table, output: OutputSpec) -> tuple[Label, ...]:
    raw = top.get("labels")
    if not isinstance(raw, list) or not raw or not all(isinstance(v, dict) for v in raw):
        top.fail("labels", raw, "expected one or more [[labels]] tables")
    labels = tuple(
        _parse_label(_Table(entry, f"[[labels]][{i}] ", top.source), output)
        for i, entry in enumerate(raw)
    )
    for attr in ("value", "channel", "name"):
        seen: set[object] = set()
        for i, label in enumerate(labels):
            value = getattr(label, attr)
            if value in seen:
                top.fail(f"labels[{i}].{attr}", value, "used by an earlier label")
            seen.add(value)
    return labels


def _parse_label(t: _Table, output: OutputSpec) -> Label:
    optional = ("anatomic_region", "min_volume_mm3")
    t.only("value", "channel", "name", "threshold", "category", "type", *optional)
    first = 1 if output.kind == "softmax" else 0
    channel = t.integer("channel", 0)
    if not first <= channel < output.channels:
        why = (
            f"expected {first}..{output.channels - 1} for {output.channels} {output.kind} channels"
        )
        t.fail("channel", channel, why + (" (0 is background)" if first else ""))
    threshold = t.number("threshold")
    if output.kind != "logits" and not 0 < threshold <= 1:
        t.fail("threshold", threshold, f"expected a probability in (0, 1] for {output.kind}")
    region = t.get("anatomic_region", None)
    min_volume = t.number("min_volume_mm3", 0.0)
    if min_volume < 0:
        t.fail("min_volume_mm3", min_volume, "expected a volume >= 0")
    return Label(
        value=t.integer("value", 1),
        channel=channel,
        name=t.text("name"),
        category=_parse_concept(t, "category"),
        type=_parse_concept(t, "type"),
        threshold=threshold,
        anatomic_region=None if region is None else _parse_concept(t, "anatomic_region"),
        min_volume_mm3=min_volume,
    )


def _parse_concept(parent: _Table, key: str) -> CodedConcept:
    t = parent.table(key, f"{parent.where}{key}.")
    t.only("code", "scheme", "meaning")
    code, scheme = t.text("code"), t.text("scheme")
    if scheme == "SCT" and not code.isdigit():
        t.fail("code", code, "a SNOMED CT (SCT) code is digits only")
    return CodedConcept(code, scheme, t.text("meaning"))


def _parse_quality(t: _Table) -> Mapping[str, QualityValue]:
    out: dict[str, QualityValue] = {}
    for key, value in t.data.items():
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            t.fail(key, value, "expected a number or a string")
        out[key] = value
    return MappingProxyType(out)


def _parse_provenance(t: _Table) -> Provenance:
    t.only("training_data", "shipped")
    training_data = t.text("training_data")
    shipped = t.flag("shipped", False)
    if shipped and "synthetic" not in training_data.lower():
        why = "a shipped model must say it was trained on synthetic phantoms"
        t.fail("training_data", training_data, why)
    return Provenance(training_data, shipped)


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in chunks.

    Parameters
    ----------
    path : Path
        The file to hash (an ONNX model, typically).

    Returns
    -------
    str
        64 lower-case hex digits.
    """
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


Dim = int | str | None


def onnx_io_shapes(onnx_path: Path) -> tuple[dict[str, list[Dim]], dict[str, list[Dim]]]:
    """The declared shapes of an ONNX model's graph inputs and outputs.

    Parameters
    ----------
    onnx_path : Path
        The model; external weight files are not read.

    Returns
    -------
    tuple[dict[str, list[Dim]], dict[str, list[Dim]]]
        (inputs, outputs), each name → dims; a dim is an int (fixed), a str (symbolic) or None
        (unknown). Initialisers listed as graph inputs are left out.
    """
    import onnx  # onnx is only needed where models are checked, not to run them
    from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except (OSError, DecodeError) as exc:
        raise ModelError(f"{onnx_path}: cannot read the ONNX model: {exc}") from exc
    weights = {init.name for init in model.graph.initializer}
    inputs = {v.name: _dims(v) for v in model.graph.input if v.name not in weights}
    return inputs, {v.name: _dims(v) for v in model.graph.output}


def _dims(value_info: Any) -> list[Dim]:
    shape = value_info.type.tensor_type.shape
    dims: list[Dim] = []
    for dim in shape.dim:
        kind = dim.WhichOneof("value")
        dims.append(dim.dim_value if kind == "dim_value" else dim.dim_param or None)
    return dims


def validate_against_onnx(card: ModelCard, onnx_path: Path | None = None) -> None:
    """Check that an ONNX model has the input and output its card describes.

    The input must exist, have rank 4 (slices) or 5 (3-D patches) with a dynamic batch axis
    (symbolic, unknown or -1), and its fixed channel, (depth,) height and width dims must equal
    the card's; the output must exist and
    its channel axis must equal the card's channel count. No other graph input may exist.

    Parameters
    ----------
    card : ModelCard
        The validated card.
    onnx_path : Path, optional
        The model to check; the card's own `model.onnx` by default.

    Raises
    ------
    ModelError
        Naming the model file, the tensor, the dim and both values.
    """
    path = onnx_path or card.onnx_path
    inputs, outputs = onnx_io_shapes(path)
    where = f"{path} (card {card.folder / CARD_FILE})"
    dims = inputs.get(card.input.name)
    if dims is None:
        raise ModelError(f"{where}: no input {card.input.name!r}; the model has {list(inputs)}")
    extra = sorted(set(inputs) - {card.input.name})
    if extra:
        raise ModelError(f"{where}: inputs {extra} are not on the card; one input is supported")
    _check_input_dims(where, card, dims)
    out = outputs.get(card.output.name)
    if out is None:
        raise ModelError(f"{where}: no output {card.output.name!r}; the model has {list(outputs)}")
    if len(out) < 2 or out[1] != card.output.channels:
        got = out[1] if len(out) >= 2 else "none"
        raise ModelError(
            f"{where}: output {card.output.name!r} {_fmt(out)} has {got} channels on axis 1, "
            f"the card says [output] channels = {card.output.channels}"
        )


def _check_input_dims(where: str, card: ModelCard, dims: list[Dim]) -> None:
    name = card.input.name
    rank = 1 + len(card.input_shape)
    if len(dims) != rank:
        raise ModelError(
            f"{where}: input {name!r} {_fmt(dims)} has rank {len(dims)}, expected {rank}"
        )
    batch = dims[0]
    if isinstance(batch, int) and batch > 0:
        raise ModelError(
            f"{where}: input {name!r} {_fmt(dims)} has a fixed batch axis of {batch}; "
            "export it with a dynamic batch axis (e.g. dynamic_axes={'image': {0: 'batch'}})"
        )
    expected = {"channels": card.input.channels}
    if card.input.depth:
        expected["depth"] = card.input.depth
    expected |= {"height": card.input.height, "width": card.input.width}
    for (axis, want), got in zip(expected.items(), dims[1:], strict=True):
        if isinstance(got, int) and got > 0 and got != want:
            raise ModelError(
                f"{where}: input {name!r} {_fmt(dims)} has {axis} {got}, the card says {want}"
            )


def _fmt(dims: list[Dim]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def discover_models(engines_dir: Path, *, check_onnx: bool = True) -> list[ModelCard]:
    """Load every model folder under `engines_dir`, sorted by folder name.

    A folder with neither `model.toml` nor `model.onnx` is skipped; one with only one of them
    is an error, so a hospital's half-copied model is noticed at start, not at the first study.

    Parameters
    ----------
    engines_dir : Path
        The folder of model folders (`engines/` in the repository).
    check_onnx : bool
        Also run `validate_against_onnx` on each model (needs the `onnx` package).

    Returns
    -------
    list[ModelCard]
        One card per model; names are unique.

    Raises
    ------
    ModelError
        The folder is missing, a card or model is invalid, or two cards share a name.
    """
    if not engines_dir.is_dir():
        raise ModelError(f"{engines_dir}: the models folder does not exist")
    cards: list[ModelCard] = []
    names: dict[str, Path] = {}
    for folder in sorted(p for p in engines_dir.iterdir() if p.is_dir()):
        if not (folder / CARD_FILE).exists() and not (folder / ONNX_FILE).exists():
            continue
        card = load_model_card(folder)
        if card.name in names:
            raise ModelError(
                f"{folder / CARD_FILE}: name {card.name!r} is also used by {names[card.name]}"
            )
        names[card.name] = folder / CARD_FILE
        if check_onnx:
            validate_against_onnx(card)
        cards.append(card)
    return cards

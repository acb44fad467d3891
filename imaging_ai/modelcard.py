"""Model folders (`engines/<model>/model.toml` + `model.onnx`) in; validated, frozen ModelCards out.

A model card says what a model takes, what it gives and what it is worth: its input tensor,
the preprocessing the pipeline must apply, the meaning of every output channel (with SNOMED CT
codes for DICOM SEG/SR), thresholds, measured quality and where the training data came from.
`engines/README.md` shows a complete card and documents every key.

The schema is the dataclasses below: their types and ranges are checked by pydantic (a TOML
table becomes its dataclass; unknown keys, wrong types and values out of range are refused,
naming the file, the key and the value). Checks that are a card's own (the name, SNOMED CT
codes, labels against the output, channels against context slices, a [patch] only on a
classifier) are coded by hand in ``_build``, which also turns the card's ``[preprocess]`` and
its input's size and context into the one :class:`~imaging_ai.preprocess.PreprocessSpec` the
pipeline applies. The dataclasses stay plain frozen dataclasses, built and replaced as before.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal, NoReturn, get_args, get_type_hints

from pydantic import (
    Field,
    PlainValidator,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import ErrorDetails

from imaging_ai.errors import ModelError
from imaging_ai.preprocess import Normalise, PreprocessSpec
from imaging_ai.schema import BOUNDS, TABLE

# "classification": a candidate classifier, which decides on each candidate lesion the detector
# proposed from a 3-D patch around it (LUNA16's false-positive reduction stage).
Task = Literal["segmentation", "detection", "classification"]
OutputKind = Literal["softmax", "sigmoid", "logits"]
QualityValue = float | int | str

CARD_FILE = "model.toml"
ONNX_FILE = "model.onnx"
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
# Every table of a card: unknown keys are refused, so a misspelt `threshhold` cannot silently
# fall back to a default.


def _quality_value(value: Any) -> QualityValue:
    """A ``[quality]`` figure: a number or a string, never a table, an array or a bool."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError("expected a number or a string")
    return value


Text = Annotated[StrictStr, Field(pattern=r"\S")]  # a string that is not blank
Quality = Annotated[QualityValue, PlainValidator(_quality_value)]


@dataclass(frozen=True)
class CodedConcept:
    """A coded concept as DICOM writes it: (code value, coding scheme designator, meaning)."""

    __pydantic_config__ = TABLE

    code: Text
    scheme: Text
    meaning: Text


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

    __pydantic_config__ = TABLE

    spacing_mm: tuple[Annotated[StrictFloat, Field(gt=0.0)], ...]


@dataclass(frozen=True)
class OutputSpec:
    """The output tensor the pipeline reads: name, activation kind and channel count."""

    __pydantic_config__ = TABLE

    name: Text
    kind: OutputKind
    channels: Annotated[StrictInt, Field(ge=1)]


@dataclass(frozen=True)
class Label:
    """One output class: its segment number, output channel, codes and threshold."""

    __pydantic_config__ = TABLE

    value: Annotated[StrictInt, Field(ge=1)]
    channel: Annotated[StrictInt, Field(ge=0)]
    name: Text
    category: CodedConcept
    type: CodedConcept
    threshold: StrictFloat
    anatomic_region: CodedConcept | None = None
    min_volume_mm3: Annotated[StrictFloat, Field(ge=0.0)] = 0.0


@dataclass(frozen=True)
class Provenance:
    """Where the training data came from, and whether the project ships this model."""

    __pydantic_config__ = TABLE

    training_data: Text
    shipped: StrictBool = False


@dataclass(frozen=True)
class ModelCard:
    """A validated model card plus the identity (path, sha256) of the ONNX file beside it.

    ``preprocess`` is the spec the pipeline applies as it stands: the card's ``[preprocess]``
    with the input size and context of ``input`` (replace both together).
    """

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


@dataclass(frozen=True)
class _Input:
    """``[input]`` as written: ``size`` is [height, width], or [depth, height, width] for a
    classifier's patches; ``layout`` left out is the task's own."""

    __pydantic_config__ = TABLE

    name: Text
    size: tuple[Annotated[StrictInt, Field(gt=0)], ...]
    channels: Annotated[StrictInt, Field(ge=1)] = 1
    dtype: Literal["float32"] = "float32"
    layout: Literal["NCHW", "NCDHW"] | None = None
    context_slices: Annotated[StrictInt, Field(ge=0)] = 0
    context_spacing_mm: Annotated[StrictFloat, Field(ge=0.0)] = 0.0


@dataclass(frozen=True)
class _Preprocess:
    """``[preprocess]`` as written: the part of :class:`PreprocessSpec` the card states; the
    input size and context come from ``[input]``. A card denoises with none, gaussian or
    median."""

    __pydantic_config__ = TABLE

    window_center: StrictFloat
    window_width: Annotated[StrictFloat, Field(gt=0.0)]
    normalise: Normalise
    denoise: Literal["none", "gaussian", "median"] = "none"
    denoise_sigma_mm: StrictFloat = 0.0


@dataclass(frozen=True)
class _Card:
    """A ``model.toml`` as written, its types and ranges checked; ``_build`` does the rest."""

    __pydantic_config__ = TABLE

    name: Text
    version: Text
    task: Task
    description: Text
    input: _Input
    preprocess: _Preprocess
    output: OutputSpec
    labels: tuple[Label, ...]
    quality: dict[str, Quality]
    provenance: Provenance
    patch: PatchSpec | None = None


_SCHEMA = TypeAdapter(_Card)


class _Refused(Exception):
    """A value the hand checks refuse; ``parse_model_card`` adds the file."""


def _refuse(key: str, value: object, why: str) -> NoReturn:
    """Refuse a value in the words the schema's refusals use: ``key = value: why``."""
    raise _Refused(f"{key} = {value!r}: {why}")


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

    Raises
    ------
    ModelError
        Naming the file, each refused key and its value.
    """
    try:
        return _build(_SCHEMA.validate_python(data), source)
    except ValidationError as exc:
        why = "; ".join(_describe(e) for e in exc.errors())
    except _Refused as exc:
        why = str(exc)
    raise ModelError(f"{source}: {why}")


# What a value must be, by pydantic's error type, in the words of a TOML file.
_EXPECTED = {
    "string_type": "expected a non-empty string",
    "string_pattern_mismatch": "expected a non-empty string",
    "int_type": "expected an integer",
    "float_type": "expected a number",
    "bool_type": "expected true or false",
    "tuple_type": "expected an array",
    "dict_type": "expected a table",
    "dataclass_type": "expected a table",
}


def _describe(error: ErrorDetails) -> str:
    """One refused value in words that name its key: ``[input] channels = 0: expected an
    integer >= 1``, ``[[labels]][1] threshhold = 0.5: unknown key; expected one of ...``."""
    loc, kind, ctx = error["loc"], error["type"], error.get("ctx", {})
    if kind == "missing":
        return f"{_key(loc)} is missing"
    if kind == "unexpected_keyword_argument":
        why = f"unknown key; expected one of {', '.join(_keys_of(loc[:-1]))}"
    elif kind in BOUNDS:
        bound = next(iter(ctx.values()))
        number = "an integer" if isinstance(bound, int) else "a number"
        why = f"expected {number} {BOUNDS[kind]} {bound:g}"
    elif kind == "literal_error":
        why = f"expected one of {ctx['expected']}"
    elif kind == "value_error":
        why = str(ctx["error"])
    else:
        why = _EXPECTED.get(kind, error["msg"])
    return f"{_key(loc)} = {error['input']!r}: {why}"


def _key(loc: tuple[int | str, ...]) -> str:
    """A key as a card writes it: ``task``, ``[input] size[1]``, ``[[labels]][0] type.code``."""
    head, rest = str(loc[0]), loc[1:]
    if rest and isinstance(rest[0], int):
        head, rest = f"[[{head}]][{rest[0]}]", rest[1:]
    elif rest:
        head = f"[{head}]"
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in rest).lstrip(".")
    return f"{head} {path}".rstrip()


def _keys_of(loc: tuple[int | str, ...]) -> list[str]:
    """The keys the table at ``loc`` takes, to name them when an unknown one is refused."""
    table: Any = _Card
    for part in loc:
        if isinstance(part, str):  # an index into an array of tables keeps the table's type
            hint = get_type_hints(table)[part]
            table = next((arg for arg in get_args(hint) if is_dataclass(arg)), hint)
    return [f.name for f in fields(table)]


def _build(card: _Card, source: Path) -> ModelCard:
    """The checks a schema cannot state, then the card as the pipeline reads it."""
    if not _NAME_RE.match(card.name):
        why = "expected lower-case letters, digits, '.', '_' or '-' (max 64)"
        _refuse("name", card.name, why)
    spec = _patch_input(card.input) if card.task == "classification" else _slice_input(card.input)
    _check_preprocess(card.preprocess)
    _check_labels(card.labels, card.output)
    _check_provenance(card.provenance)
    return ModelCard(
        name=card.name,
        version=card.version,
        task=card.task,
        description=card.description,
        input=spec,
        # One spec: the card's [preprocess] keys are PreprocessSpec's own.
        preprocess=PreprocessSpec(
            **asdict(card.preprocess),
            input_size=(spec.height, spec.width),
            context_slices=spec.context_slices,
            context_spacing_mm=spec.context_spacing_mm,
        ),
        output=card.output,
        labels=card.labels,
        quality=MappingProxyType(card.quality),
        provenance=card.provenance,
        folder=source.parent,
        sha256="",
        patch=_patch(card, spec),
    )


def _slice_input(t: _Input) -> InputSpec:
    """A slice model's input: [height, width], channels made only from neighbouring slices."""
    if len(t.size) != 2:
        _refuse("[input] size", list(t.size), "expected [height, width], two positive integers")
    if t.layout not in (None, "NCHW"):
        _refuse("[input] layout", t.layout, "expected NCHW: slices, (N, C, H, W)")
    if t.channels != 2 * t.context_slices + 1:
        k = t.context_slices
        why = f"context_slices = {k} gives {2 * k + 1} channel(s): the slice and "
        _refuse("[input] channels", t.channels, why + f"{k} neighbour(s) on each side")
    if t.context_spacing_mm and not t.context_slices:
        why = "expected >= 0 mm, with context_slices >= 1"
        _refuse("[input] context_spacing_mm", t.context_spacing_mm, why)
    height, width = t.size
    return InputSpec(
        t.name, t.channels, height, width,
        context_slices=t.context_slices, context_spacing_mm=t.context_spacing_mm,
    )  # fmt: skip


def _patch_input(t: _Input) -> InputSpec:
    """A candidate classifier's input: channels of 3-D patches, [depth, height, width] voxels."""
    if len(t.size) != 3:
        why = "expected [depth, height, width], three positive integers"
        _refuse("[input] size", list(t.size), why)
    if t.layout not in (None, "NCDHW"):
        _refuse("[input] layout", t.layout, "expected NCDHW: 3-D patches, (N, C, D, H, W)")
    for key in ("context_slices", "context_spacing_mm"):
        if getattr(t, key):
            _refuse(f"[input] {key}", getattr(t, key), "a 3-D patch has no context slices")
    depth, height, width = t.size
    return InputSpec(t.name, t.channels, height, width, layout="NCDHW", depth=depth)


def _patch(card: _Card, spec: InputSpec) -> PatchSpec | None:
    """A classifier's [patch], one spacing per input channel; no other card has one."""
    if card.task != "classification":
        if card.patch is not None:
            why = 'only a task = "classification" card has a [patch]'
            _refuse("[patch] spacing_mm", list(card.patch.spacing_mm), why)
        return None
    if card.patch is None:
        raise _Refused("patch is missing")
    if len(card.patch.spacing_mm) != spec.channels:
        why = f"expected {spec.channels} positive spacings in mm, one per input channel"
        _refuse("[patch] spacing_mm", list(card.patch.spacing_mm), why)
    return card.patch


def _check_preprocess(p: _Preprocess) -> None:
    """A sigma goes with a denoise other than none, and only with one."""
    if p.denoise == "none" and p.denoise_sigma_mm != 0:
        why = 'set denoise too, or leave the sigma out for "none"'
        _refuse("[preprocess] denoise_sigma_mm", p.denoise_sigma_mm, why)
    if p.denoise != "none" and p.denoise_sigma_mm <= 0:
        why = f"denoise = {p.denoise!r} needs a positive sigma in mm"
        _refuse("[preprocess] denoise_sigma_mm", p.denoise_sigma_mm, why)


def _check_labels(labels: tuple[Label, ...], output: OutputSpec) -> None:
    """One or more labels, each reading a channel the output has, with a threshold its kind can
    reach; values, channels and names are each used once; SNOMED CT codes are digits."""
    if not labels:
        _refuse("labels", [], "expected one or more [[labels]] tables")
    if output.kind == "softmax" and output.channels < 2:
        _refuse("[output] channels", output.channels, "expected an integer >= 2 for softmax")
    for i, label in enumerate(labels):
        _check_label(f"[[labels]][{i}] ", label, output)
    for attr in ("value", "channel", "name"):
        seen: set[object] = set()
        for i, label in enumerate(labels):
            value = getattr(label, attr)
            if value in seen:
                _refuse(f"labels[{i}].{attr}", value, "used by an earlier label")
            seen.add(value)


def _check_label(where: str, label: Label, output: OutputSpec) -> None:
    """One label against the output it reads (``where`` names it: ``[[labels]][0] ``)."""
    first = 1 if output.kind == "softmax" else 0
    if not first <= label.channel < output.channels:
        why = (
            f"expected {first}..{output.channels - 1} for {output.channels} {output.kind} channels"
        )
        _refuse(f"{where}channel", label.channel, why + (" (0 is background)" if first else ""))
    if output.kind != "logits" and not 0 < label.threshold <= 1:
        why = f"expected a probability in (0, 1] for {output.kind}"
        _refuse(f"{where}threshold", label.threshold, why)
    for key in ("category", "type", "anatomic_region"):
        concept = getattr(label, key)
        if concept is not None and concept.scheme == "SCT" and not concept.code.isdigit():
            _refuse(f"{where}{key}.code", concept.code, "a SNOMED CT (SCT) code is digits only")


def _check_provenance(p: Provenance) -> None:
    """A shipped model proves the pipeline, not a diagnosis: its card must say so."""
    if p.shipped and "synthetic" not in p.training_data.lower():
        why = "a shipped model must say it was trained on synthetic phantoms"
        _refuse("[provenance] training_data", p.training_data, why)


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

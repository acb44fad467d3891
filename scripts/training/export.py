"""ONNX export: takes a trained U-Net, gives ``model.onnx`` as the daemon's card check wants it.

float32 NCHW input named ``image`` with a symbolic batch axis, output ``probabilities``, opset 17,
and a check that ONNX Runtime on the CPU reproduces the PyTorch output before the file is kept.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from training.nets import set_layout
from training.recipes import OPSET


def onnx_bytes(model: nn.Module, shape: tuple[int, int, int]) -> bytes:
    """Serialise ``model`` (on the CPU, float32, eval mode) to ONNX; ``shape`` is (C, H, W).

    The TorchScript exporter (``dynamo=False``) is used: it needs no onnxscript, which the GPU
    machine lacks, and writes the plain Conv/BatchNorm/ConvTranspose graph every runtime reads.
    """
    model = set_layout(model.float().cpu(), torch.contiguous_format).eval()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        _export(model, shape, path)
        data = path.read_bytes()
    onnx.checker.check_model(onnx.load_from_string(data))
    return data


def _export(model: nn.Module, shape: tuple[int, int, int], path: Path) -> None:
    torch.onnx.export(
        model,
        (torch.zeros(2, *shape),),
        path,
        input_names=["image"],
        output_names=["probabilities"],
        dynamic_axes={"image": {0: "batch"}, "probabilities": {0: "batch"}},
        opset_version=OPSET,
        do_constant_folding=True,
        dynamo=False,
    )


def check_against_torch(
    model: nn.Module, data: bytes, shape: tuple[int, int, int], seed: int = 0
) -> float:
    """Largest |ONNX Runtime - PyTorch| on three random batches of different sizes.

    Raises
    ------
    RuntimeError
        If they differ by more than 1e-3 (a broken export).
    """
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    worst = 0.0
    for n in (1, 3, 8):
        x = rng.random((n, *shape), dtype=np.float32)
        (got,) = session.run(["probabilities"], {"image": x})
        with torch.no_grad():
            want = model.float().cpu().eval()(torch.from_numpy(x)).numpy()
        worst = max(worst, float(np.abs(got - want).max()))
    if worst > 1e-3:
        raise RuntimeError(f"ONNX Runtime differs from PyTorch by {worst:.2e}; export is broken")
    return worst


def export(model: nn.Module, shape: tuple[int, int, int], path: Path) -> float:
    """Write ``path`` after checking it; returns the largest difference from PyTorch.

    ``shape`` is one input's (channels, height, width).
    """
    data = onnx_bytes(model, shape)
    worst = check_against_torch(model, data, shape)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".onnx.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return worst

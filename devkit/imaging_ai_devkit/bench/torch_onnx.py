"""Takes a shipped model's ONNX file and gives the same network in PyTorch eager mode, FP32.

The engines benchmark compares the daemon's backends against PyTorch eager FP32, the way such
models usually run in research code. The shipped models carry no PyTorch weights, so this reads
the ONNX graph and runs each node as the PyTorch call a module's ``forward`` would make
(``F.conv2d``, ``F.max_pool2d``, ...), with the ONNX initializers as weights: the same network,
the same weights, eager execution, one kernel launch per operation. It knows the operators the
shipped 2-D U-Nets use and refuses any other by name.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

Tensor = Any  # torch.Tensor; torch is optional (the `train` extra)
Op = Callable[[list[Tensor], dict[str, Any]], Tensor]


class TorchEager:
    """An ONNX graph run node by node with PyTorch eager calls on ``device``."""

    def __init__(self, path: Path, device: str = "cpu") -> None:
        import torch

        self.torch = torch
        model = onnx.load(str(path))
        graph = model.graph
        self.device = device
        self.values: dict[str, Tensor] = {
            t.name: torch.from_numpy(np.array(numpy_helper.to_array(t))).to(device)
            for t in graph.initializer
        }
        self.input = graph.input[0].name
        self.output = graph.output[0].name
        self.nodes = [
            (n.op_type, list(n.input), list(n.output), _attributes(n)) for n in graph.node
        ]
        ops = _ops(torch)
        unknown = sorted({op for op, *_ in self.nodes} - set(ops))
        if unknown:
            raise ValueError(f"{path}: operators not supported here: {', '.join(unknown)}")
        self.ops = ops

    def __call__(self, batch: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """float32 [N, C, H, W] in, the model's output as numpy out (host to host)."""
        torch = self.torch
        with torch.inference_mode():
            values = dict(self.values)
            values[self.input] = torch.from_numpy(batch).to(self.device)
            for op, inputs, outputs, attrs in self.nodes:
                args = [values[name] if name else None for name in inputs]
                values[outputs[0]] = self.ops[op](args, attrs)
            return np.asarray(values[self.output].float().cpu().numpy())


def _attributes(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _pads(attrs: dict[str, Any]) -> tuple[int, int]:
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    if pads[:2] != pads[2:]:
        raise ValueError(f"asymmetric padding {pads} is not supported")
    return int(pads[0]), int(pads[1])


def _ops(torch: Any) -> dict[str, Op]:
    f = torch.nn.functional

    def convolution(fn: Callable[..., Tensor]) -> Op:
        def run(a: list[Tensor], k: dict[str, Any]) -> Tensor:
            return fn(
                a[0],
                a[1],
                a[2] if len(a) > 2 else None,
                stride=tuple(k.get("strides", (1, 1))),
                padding=_pads(k),
                dilation=tuple(k.get("dilations", (1, 1))),
                groups=int(k.get("group", 1)),
            )

        return run

    def pool(fn: Callable[..., Tensor]) -> Op:
        def run(a: list[Tensor], k: dict[str, Any]) -> Tensor:
            return fn(
                a[0],
                tuple(k["kernel_shape"]),
                stride=tuple(k.get("strides", k["kernel_shape"])),
                padding=_pads(k),
                ceil_mode=bool(k.get("ceil_mode", 0)),
            )

        return run

    def slice_(a: list[Tensor], k: dict[str, Any]) -> Tensor:
        starts, ends = a[1].tolist(), a[2].tolist()
        axes = a[3].tolist() if len(a) > 3 and a[3] is not None else list(range(len(starts)))
        steps = a[4].tolist() if len(a) > 4 and a[4] is not None else [1] * len(starts)
        index = [slice(None)] * a[0].dim()
        for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
            index[axis] = slice(start, min(end, a[0].shape[axis]), step)
        return a[0][tuple(index)]

    def resize(a: list[Tensor], k: dict[str, Any]) -> Tensor:
        if k.get("mode", b"nearest") != b"nearest":
            raise ValueError("only nearest Resize is supported")
        scales = a[2].tolist()
        return f.interpolate(a[0], scale_factor=tuple(scales[2:]), mode="nearest")

    return {
        "Conv": convolution(f.conv2d),
        "ConvTranspose": convolution(f.conv_transpose2d),
        "Relu": lambda a, k: torch.relu(a[0]),
        "Sigmoid": lambda a, k: torch.sigmoid(a[0]),
        "Softmax": lambda a, k: torch.softmax(a[0], dim=int(k.get("axis", -1))),
        "MaxPool": pool(f.max_pool2d),
        "AveragePool": pool(f.avg_pool2d),
        "Concat": lambda a, k: torch.cat(a, dim=int(k["axis"])),
        "Add": lambda a, k: a[0] + a[1],
        "Sub": lambda a, k: a[0] - a[1],
        "Mul": lambda a, k: a[0] * a[1],
        "Slice": slice_,
        "Resize": resize,
        "Constant": lambda a, k: torch.from_numpy(np.array(numpy_helper.to_array(k["value"]))),
    }

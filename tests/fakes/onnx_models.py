"""Takes a shape and writes a tiny ONNX model with known weights, for the engine and model tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from imaging_ai.infer.base import FloatArray


def write_conv_softmax_onnx(
    path: Path,
    *,
    in_channels: int = 1,
    classes: int = 3,
    size: tuple[int, int] = (16, 16),
    batch_dim: str | int = "batch",
    input_name: str = "image",
    output_name: str = "probabilities",
    seed: int = 0,
) -> tuple[FloatArray, FloatArray]:
    """Write a 1x1 Conv + Softmax(axis=1) ONNX model with known weights.

    Parameters
    ----------
    path : Path
        Where to write the model.
    in_channels, classes : int
        Input channels and output classes.
    size : tuple[int, int]
        Height and width, declared fixed.
    batch_dim : str or int
        A symbol for a dynamic batch axis, or an int to declare a fixed batch (for negative tests).
    input_name, output_name : str
        Tensor names.
    seed : int
        Seed of the random weights.

    Returns
    -------
    tuple[FloatArray, FloatArray]
        Weights [classes, in_channels] and bias [classes], to compute the expected output.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((classes, in_channels, 1, 1)).astype(np.float32)
    bias = rng.standard_normal(classes).astype(np.float32)
    x = helper.make_tensor_value_info(
        input_name, TensorProto.FLOAT, [batch_dim, in_channels, *size]
    )
    y = helper.make_tensor_value_info(output_name, TensorProto.FLOAT, [batch_dim, classes, *size])
    nodes = [
        helper.make_node("Conv", [input_name, "weight", "bias"], ["logits"]),
        helper.make_node("Softmax", ["logits"], [output_name], axis=1),
    ]
    inits = [numpy_helper.from_array(weight, "weight"), numpy_helper.from_array(bias, "bias")]
    graph = helper.make_graph(nodes, "conv_softmax", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9  # readable by every onnxruntime this project supports
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return weight[:, :, 0, 0], bias

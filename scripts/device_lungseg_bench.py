#!/usr/bin/env python3
"""The lung-seg model on one GPU: PyTorch eager FP32 against ONNX Runtime CUDA variants.

Run on the GPU machine from the repository root, with onnxruntime-gpu on PYTHONPATH:

    python3 scripts/device_lungseg_bench.py --weights WEIGHTS.pt

Two rows of experiments, one table:
- **as shipped**: `engines/lung-seg/model.onnx` (its card's input size) on ONNX Runtime CPU as
  the reference, then CUDA FP32 / FP16 / FP16+NHWC / +CUDA graphs; PyTorch eager FP32 runs the
  same network (`scripts/training/nets.py`) with the same trained weights.
- **the same network at 512×512**: the same module and weights exported to ONNX at 512×512
  (convolutions do not care about the size), run the same way.
max |diff| is against ONNX Runtime on the CPU. Slices/s are end to end, host numpy to host numpy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import device_engine_check as dec  # noqa: E402

from imaging_ai.modelcard import load_model_card  # noqa: E402


def torch_rows(
    net: Any, size: int, ref: tuple[Any, Any], batches: list[int], label: str
) -> list[dict[str, Any]]:
    """PyTorch eager FP32 on the GPU, host numpy in and out, like the engines."""
    import torch

    net = net.cuda().eval()

    def run(batch: Any) -> Any:
        with torch.inference_mode():
            return net(torch.from_numpy(batch).cuda()).float().cpu().numpy()

    diff = float(np.max(np.abs(run(ref[0]) - ref[1])))
    rows = []
    for b in batches:
        batch = np.random.default_rng(b).standard_normal((b, 1, size, size), dtype=np.float32)
        rows.append(
            {
                "variant": f"{label} torch eager fp32",
                "batch": b,
                "slices_per_s": dec.slices_per_second(run, batch, 1.0),
                "max_abs_diff": diff,
            }
        )
    return rows


def export_512(net: Any, path: Path) -> None:
    """The same module and weights as ONNX at 512×512 with a dynamic batch axis."""
    import torch

    dummy = torch.zeros(1, 1, 512, 512)
    torch.onnx.export(
        net.cpu().eval(),
        (dummy,),
        str(path),
        input_names=["image"],
        output_names=["probabilities"],
        opset_version=17,
        dynamic_axes={"image": {0: "batch"}, "probabilities": {0: "batch"}},
        dynamo=False,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--weights", type=Path, required=True, help="lung-seg weights.pt")
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32, 64])
    args = parser.parse_args()
    import torch
    from training.nets import UNet
    from training.recipes import LUNG_SEG

    torch.backends.cudnn.benchmark = True
    net = UNet(LUNG_SEG.net)
    net.load_state_dict(torch.load(args.weights, map_location="cpu"))
    rows: list[dict[str, Any]] = dec.check_cuda_mem([1, 64, 256])
    card = load_model_card(ROOT / "engines" / "lung-seg")
    size = card.input.height
    shipped, ref_in, ref_out = dec.check_ort(card, card.onnx_path, args.batches, 1.0)
    rows += [r | {"variant": f"as shipped {size}: {r['variant']}"} for r in shipped]
    rows += torch_rows(net, size, (ref_in, ref_out), args.batches, f"as shipped {size}:")
    with tempfile.TemporaryDirectory() as tmp:
        onnx_512 = Path(tmp) / "lung-seg-512.onnx"
        export_512(net, onnx_512)
        card_512 = dec.card_for(onnx_512, 512)
        at_512, ref_in, ref_out = dec.check_ort(card_512, onnx_512, args.batches, 1.0)
        rows += [r | {"variant": f"same net 512: {r['variant']}"} for r in at_512]
        rows += torch_rows(net, 512, (ref_in, ref_out), args.batches, "same net 512:")
    out = os.environ.get("OUT")
    if out:
        Path(out, "device_lungseg_bench.json").write_text(json.dumps(rows, indent=1, default=str))
    print(dec.table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

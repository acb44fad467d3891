#!/usr/bin/env python3
"""Train the candidate classifier ``nodule-fpr`` (LUNA16-style false-positive reduction) on
phantom patches plus real development scans' false candidates; export its ONNX.

Stages:

``real``  (here, with the daemon's dependencies)
    Run the daemon's analysis on the development scans (LIDC-IDRI-0001 and RIDER Lung CT, laid
    out by ``scripts/fetch_real_ct.py``; never the evaluation-only pycerr cases) with the
    detector's threshold lowered to ``--real-threshold``, keep the candidates that are not near
    any reference mark (LIDC: any reader's nodule or non-nodule mark within 15 mm; RIDER: within
    15 mm of the tumour's contours) and save their HU patches as negatives
    (``--real-out``, an npz). This is the only use of real CT in training: negatives.
``train``  (the GPU machine: numpy + torch + tqdm; imaging_ai's phantom, candidates and
progress modules)
    Generate ``--studies`` phantoms (seeds 100000 + i, the training range, with
    ``training.data.draw_spec``'s protocols) in ``--workers`` processes, sample patches
    (``training.candidates``), add the real negatives, train a small 3-D CNN with flips,
    in-plane rotations, shifts and noise, evaluate on phantoms of the validation range
    (seeds 200000 + i), export ``model.onnx`` (input ``patch`` (N, 2, 32, 32, 32), output
    ``probability`` (N, 1), dynamic batch, checked against torch) to ``--out``.

The card (``engines/nodule-fpr/model.toml``) is written by hand from what this prints; its
threshold is the operating point chosen on the development scans (docs/models.md).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "devkit"))

from training.candidates import (
    KIND_NAMES,
    PATCH_SIZE,
    PATCH_SPACINGS_MM,
    REAL,
    phantom_samples,
    volume_patches,
)

from imaging_ai import progress

WINDOW = (-300.0, 1600.0)  # centre, width: lung to bone and dense contrast stay apart
TRAIN_FIRST, VALIDATION_FIRST = 100_000, 200_000


MASS_SHARE = 0.25
"""Studies whose nodules are masses of 25-70 mm: real lung cancers (RIDER's, pycerr's) are."""


def _one_study(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from dataclasses import replace

    from imaging_ai_devkit.phantom import generate
    from training.data import draw_spec

    rng = np.random.default_rng([seed, 0xFB])
    spec = draw_spec(seed)
    if rng.random() < MASS_SHARE:
        spec = replace(spec, nodules=int(rng.integers(1, 4)), nodule_diameter_range_mm=(25, 70))
    while True:
        try:
            vol = generate(spec, workers=1)
            break
        except ValueError:  # "cannot fit N nodules": a small patient or a short slab
            if spec.nodules == 0:
                raise
            spec = replace(spec, nodules=spec.nodules - 1)
    centres, labels, kinds = phantom_samples(vol, rng)
    return volume_patches(vol.hu, vol.spacing_mm, centres), labels, kinds


def phantom_set(
    first: int, count: int, workers: int, budget_s: float, show: bool | None = None
) -> dict[str, np.ndarray]:
    """Patches of ``count`` phantoms from seed ``first`` on; stops early at ``budget_s``.
    ``show``: the progress bar's ``--progress`` / ``--no-progress`` (None: on a terminal)."""
    start, parts = time.time(), []
    ctx = multiprocessing.get_context("fork")
    bar = progress.progress(total=count, desc="phantoms", unit="study", force=show)
    with ctx.Pool(workers) as pool, bar:
        for n, part in enumerate(pool.imap_unordered(_one_study, range(first, first + count))):
            parts.append(part)
            bar.update()
            if n % 16 == 0:
                progress.echo(f"  {n + 1}/{count} phantoms, {time.time() - start:.0f} s")
            if time.time() - start > budget_s:
                pool.terminate()
                break
    return {
        "patches": np.concatenate([p[0] for p in parts]),
        "labels": np.concatenate([p[1] for p in parts]),
        "kinds": np.concatenate([p[2] for p in parts]),
        "studies": np.array(len(parts)),
    }


def normalise(x: Any) -> Any:
    low = WINDOW[0] - WINDOW[1] / 2
    return (x.clamp(low, low + WINDOW[1]) - low) / WINDOW[1]


def build_net() -> Any:
    import torch
    from torch import nn

    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv3d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm3d(cout), nn.ReLU(True)
        )

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                block(2, 16), nn.MaxPool3d(2),
                block(16, 32), block(32, 32), nn.MaxPool3d(2),
                block(32, 64), block(64, 64), nn.MaxPool3d(2),
                block(64, 64), nn.AdaptiveAvgPool3d(1),
            )  # fmt: skip
            self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.3), nn.Linear(64, 1))

        def logits(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.features(x))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(self.logits(x))

    return Net()


def augment(x: Any, gen: Any) -> Any:
    import torch

    n = x.shape[0]
    for axis in (2, 3, 4):
        flip = torch.rand(n, device=x.device, generator=gen) < 0.5
        x = torch.where(flip[:, None, None, None, None], x.flip(axis), x)
    turn = torch.rand(n, device=x.device, generator=gen) < 0.5
    x = torch.where(turn[:, None, None, None, None], x.transpose(3, 4), x)
    shift = [int(v) for v in torch.randint(-2, 3, (3,), generator=gen, device=x.device)]
    x = torch.roll(x, shifts=shift, dims=(2, 3, 4))
    noise = torch.rand(n, 1, 1, 1, 1, device=x.device, generator=gen) * 30.0
    return x + noise * torch.randn(x.shape, device=x.device, generator=gen)


def train(data: dict[str, np.ndarray], args: argparse.Namespace) -> Any:
    import torch

    torch.manual_seed(args.seed)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)  # a GPU run only
    x = torch.from_numpy(data["patches"]).cuda()
    y = torch.from_numpy(data["labels"].astype(np.float32)).cuda()
    weight = torch.ones_like(y)
    weight[torch.from_numpy(data["kinds"] == REAL).cuda()] = args.real_weight
    pos = float(y.sum())
    weight[y > 0] *= (len(y) - pos) / max(pos, 1.0) / 2.0  # balance the classes half way
    net = build_net().cuda()
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=1e-4)
    steps = args.epochs * (len(y) // args.batch + 1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps)
    loss_fn = torch.nn.BCEWithLogitsLoss(reduction="none")
    start = time.time()
    for epoch in progress.progress(
        range(args.epochs), desc="train", unit="epoch", force=args.progress
    ):
        order = torch.randperm(len(y), device="cuda", generator=gen)
        total = 0.0
        for i in range(0, len(y), args.batch):
            idx = order[i : i + args.batch]
            xb = normalise(augment(x[idx].float(), gen))
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logit = net.logits(xb)[:, 0]
            loss = (loss_fn(logit.float(), y[idx]) * weight[idx]).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss) * len(idx)
        progress.echo(
            f"  epoch {epoch + 1}: loss {total / len(y):.4f} ({time.time() - start:.0f} s)"
        )
    return net.eval()


def predict(net: Any, patches: np.ndarray) -> np.ndarray:
    import torch

    out = []
    with torch.no_grad():
        for i in range(0, len(patches), 512):
            xb = normalise(torch.from_numpy(patches[i : i + 512]).cuda().float())
            out.append(net(xb)[:, 0].float().cpu().numpy())
    return np.concatenate(out)


def report(name: str, prob: np.ndarray, labels: np.ndarray, kinds: np.ndarray) -> dict[str, Any]:
    pos, neg = prob[labels == 1], prob[labels == 0]
    auc = float((pos[:, None] > neg[None, :]).mean()) if len(pos) and len(neg) else float("nan")
    out: dict[str, Any] = {"auc": auc, "positives": len(pos), "negatives": len(neg)}
    for t in (0.5, 0.8, 0.9, 0.95):
        out[f"sens@{t}"] = float((pos >= t).mean()) if len(pos) else float("nan")
        out[f"fp_rate@{t}"] = float((neg >= t).mean()) if len(neg) else float("nan")
    out["fp_rate_by_kind@0.9"] = {
        KIND_NAMES[int(k)]: round(float((prob[(kinds == k) & (labels == 0)] >= 0.9).mean()), 4)
        for k in np.unique(kinds[labels == 0])
    }
    print(name, json.dumps(out))
    return out


def export(net: Any, path: Path) -> None:
    import torch

    net = net.float().cpu().eval()
    dummy = torch.rand(2, len(PATCH_SPACINGS_MM), *PATCH_SIZE)
    torch.onnx.export(
        net, dummy, str(path), input_names=["patch"], output_names=["probability"],
        dynamic_axes={"patch": {0: "batch"}, "probability": {0: "batch"}},
        opset_version=17, dynamo=False,
    )  # fmt: skip
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {"patch": normalise(dummy * 1600 - 1100).numpy()})[0]
    want = net(normalise(dummy * 1600 - 1100)).detach().numpy()
    print("onnx vs torch max diff", float(np.abs(got - want).max()))


def stage_train(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t = time.time()
    train_set = phantom_set(TRAIN_FIRST, args.studies, args.workers, args.budget_s, args.progress)
    valid = phantom_set(
        VALIDATION_FIRST, args.validation_studies, args.workers, 100.0, args.progress
    )
    print(f"phantoms: {int(train_set['studies'])} train, {int(valid['studies'])} validation, "
          f"{time.time() - t:.0f} s")  # fmt: skip
    if args.real:
        real = np.load(args.real)
        n = len(real["patches"])
        train_set["patches"] = np.concatenate([train_set["patches"], real["patches"]])
        train_set["labels"] = np.concatenate([train_set["labels"], np.zeros(n, np.int8)])
        train_set["kinds"] = np.concatenate([train_set["kinds"], np.full(n, REAL, np.uint8)])
        print(f"real negatives: {n}")
    net = train(train_set, args)
    results = {
        "train": report("train", predict(net, train_set["patches"]), train_set["labels"],
                        train_set["kinds"]),
        "validation": report("validation", predict(net, valid["patches"]), valid["labels"],
                             valid["kinds"]),
        "studies": int(train_set["studies"]), "validation_studies": int(valid["studies"]),
    }  # fmt: skip
    import torch

    torch.save(net.state_dict(), out / "weights.pt")
    export(net, out / "model.onnx")
    (out / "training.json").write_text(json.dumps(results, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stage", choices=["real", "train"])
    parser.add_argument("--out", default="engines/nodule-fpr")
    parser.add_argument("--studies", type=int, default=400)
    parser.add_argument("--validation-studies", type=int, default=32)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--real", default="", help="npz of real negatives (stage real)")
    parser.add_argument("--real-weight", type=float, default=2.0)
    parser.add_argument("--cases", default="", help="development CASES folder (stage real)")
    parser.add_argument("--real-threshold", type=float, default=0.5)
    parser.add_argument("--real-out", default=".train/real_negatives.npz")
    progress.add_argument(parser)
    args = parser.parse_args()
    if args.stage == "train":
        stage_train(args)
    else:
        from training.real_candidates import stage_real

        stage_real(args)


if __name__ == "__main__":
    main()

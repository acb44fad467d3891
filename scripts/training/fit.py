"""Training loops: take preprocessed samples and a U-Net, give trained weights and a short log.

Augmentation runs on the training device, per batch, on the already preprocessed slices: small
rotations, zooms and shifts, left-right flips, and intensity jitter, noise and blur. A left-right
flip moves the patient's right lung to the image's right, where the left lung belongs, so the lung
model's right and left channels are swapped with it; the label stays tied to the image side, as
it is on every standard axial CT (patient right on the image left).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from imaging_ai.progress import echo
from imaging_ai.progress import progress as progress_bar
from training.nets import UNet, set_layout

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class FitConfig:
    """How long and how to train one model.

    Attributes
    ----------
    steps : int
        Optimiser steps.
    batch : int
        Slices per step.
    lr : float
        Peak learning rate: linear warm-up over the first 5 %, then cosine decay to zero.
    seed : int
        Seeds the weights, the batch draws and the augmentation.
    positive_fraction : float
        Share of each batch drawn from slices whose target has foreground (0: uniform draws).
    max_seconds : float
        Wall-clock guard, so a device lease is never lost to an overrun: the schedule follows
        whichever of steps and seconds is further along, so a run cut short still ends with its
        learning rate decayed (the log says it was cut); the default never triggers.
    """

    steps: int
    batch: int
    lr: float = 3e-3
    seed: int = 0
    positive_fraction: float = 0.0
    max_seconds: float = math.inf


@dataclass
class FitLog:
    """What happened: steps run, seconds, loss trace and validation figures."""

    steps: int = 0
    seconds: float = 0.0
    stopped_early: bool = False
    losses: list[float] | None = None
    validation: list[dict[str, float]] | None = None


def _affine(
    n: int, flip_p: float, gen: torch.Generator, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random affine maps (output → input coordinates) and which samples were flipped."""

    def uniform(lo: float, hi: float) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(n, generator=gen, device=device)

    angle = uniform(-12.0, 12.0) * math.pi / 180.0
    zoom = uniform(0.85, 1.18)
    aspect = uniform(0.95, 1.05)
    flip = torch.rand(n, generator=gen, device=device) < flip_p
    sx = torch.where(flip, -1.0, 1.0) / (zoom * aspect)
    sy = aspect / zoom
    cos, sin = torch.cos(angle), torch.sin(angle)
    theta = torch.zeros(n, 2, 3, device=device)
    theta[:, 0, 0], theta[:, 0, 1] = cos * sx, -sin * sy
    theta[:, 1, 0], theta[:, 1, 1] = sin * sx, cos * sy
    theta[:, 0, 2], theta[:, 1, 2] = uniform(-0.06, 0.06), uniform(-0.06, 0.06)
    keep = torch.rand(n, generator=gen, device=device) < 0.2  # some slices stay untouched
    identity = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], device=device)
    theta = torch.where(keep[:, None, None], identity, theta)
    return theta, flip & ~keep


def _blur(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Separable Gaussian blur of ``sigma`` pixels (a softer reconstruction kernel), per channel."""
    taps = torch.arange(-2, 3, device=x.device, dtype=x.dtype)
    k = torch.exp(-0.5 * (taps / sigma) ** 2)
    k = k / k.sum()
    shape = x.shape
    x = x.reshape(-1, 1, *shape[2:])
    x = F.conv2d(F.pad(x, (2, 2, 0, 0), mode="replicate"), k.view(1, 1, 1, 5))
    return F.conv2d(F.pad(x, (0, 0, 2, 2), mode="replicate"), k.view(1, 1, 5, 1)).reshape(shape)


def _intensity(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Gain and offset (about ±10 % and ±40 HU), noise and blur, re-clipped to the window.

    Every choice is a per-sample mask applied with ``torch.where``, so nothing waits for the GPU.
    """
    n, dev = x.shape[0], x.device

    def draw() -> torch.Tensor:
        return torch.rand(n, 1, 1, 1, generator=gen, device=dev)

    x = (x - 0.4) * (0.9 + 0.2 * draw()) + 0.4 + 0.027 * (2 * draw() - 1)  # 0.4: about -750 HU
    noise = torch.randn(x.shape, generator=gen, device=dev)
    x = x + (draw() < 0.3) * 0.02 * draw() * noise
    sigma = 0.3 + 0.5 * torch.rand(1, generator=gen, device=dev)
    x = torch.where(draw() < 0.2, _blur(x, sigma), x)
    return x.clamp(0.0, 1.0)


def augment(
    x: torch.Tensor, y: torch.Tensor, swap_sides: bool, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Augment a batch of inputs ``(N, C', H, W)`` and soft targets ``(N, C, H, W)``.

    A 2.5-D input (``C'`` > 1: a slice and its neighbours) moves as one image, and its
    neighbours swap places in half the samples, so the network cannot lean on which way the
    series was sorted.

    Parameters
    ----------
    x, y : torch.Tensor
        Inputs in [0, 1] and area-fraction targets.
    swap_sides : bool
        Targets are (background, right lung, left lung): a flipped sample swaps channels 1 and 2
        and its background is recomputed so the classes still sum to one where the image was
        padded. Otherwise every channel is foreground that pads with zero.
    gen : torch.Generator
        Random stream on the batch's device.
    """
    theta, flip = _affine(x.shape[0], 0.5, gen, x.device)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    # Zero padding is the bottom of the window: air, as outside the reconstruction circle.
    x = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    if swap_sides:
        fg = F.grid_sample(y[:, 1:], grid, mode="bilinear", align_corners=False)
        fg = torch.where(flip[:, None, None, None], fg.flip(1), fg)
        y = torch.cat([(1.0 - fg.sum(1, keepdim=True)).clamp(0.0, 1.0), fg], dim=1)
    else:
        y = F.grid_sample(y, grid, mode="bilinear", align_corners=False)
    if x.shape[1] > 1:
        turn = torch.rand(x.shape[0], generator=gen, device=x.device) < 0.5
        x = torch.where(turn[:, None, None, None], x.flip(1), x)
    return _intensity(x, gen), y


def lung_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Soft-target cross-entropy plus (1 - mean soft Dice) of the two lungs."""
    logp = F.log_softmax(logits, dim=1)
    ce = -(target * logp).sum(1).mean()
    p = logp.exp()[:, 1:]
    t = target[:, 1:]
    dice = (2 * (p * t).sum((0, 2, 3)) + 1.0) / (p.sum((0, 2, 3)) + t.sum((0, 2, 3)) + 1.0)
    return ce + (1.0 - dice.mean())


def nodule_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy plus (1 - soft Dice) per slice that holds nodule, averaged.

    Dice per slice rather than over the batch gives a slice with one 5 mm nodule the same weight
    as a slice through a 25 mm mass; over the batch, the large nodules' pixels would dominate and
    the small ones, the hard ones, would hardly count. Slices without nodule are left to the
    cross-entropy, which is what keeps false positives down.
    """
    bce = F.binary_cross_entropy_with_logits(logits, target)
    p = torch.sigmoid(logits)
    inter, total = (p * target).sum((1, 2, 3)), (p + target).sum((1, 2, 3))
    positive = (target.amax((1, 2, 3)) > 0.3).float()
    dice = (2 * inter + 1.0) / (total + 1.0)
    return bce + ((1.0 - dice) * positive).sum() / positive.sum().clamp(min=1.0)


def soft_dice(p: torch.Tensor, t: torch.Tensor) -> float:
    """Dice of probabilities and area fractions, over everything given."""
    return float((2 * (p * t).sum() + 1e-6) / (p.sum() + t.sum() + 1e-6))


@torch.no_grad()
def validate(model: UNet, x: torch.Tensor, y: torch.Tensor, batch: int) -> dict[str, float]:
    """Dice on the model grid per foreground channel (a training-time check, not the card's)."""
    model.eval()
    probs = torch.cat([model(_slices(x, i, i + batch)) for i in range(0, len(x), batch)])
    model.train()
    target = y.float() if y.ndim == 4 else y[:, None].float()
    if model.spec.activation == "softmax":
        return {f"dice_{c}": soft_dice(probs[:, c], target[:, c]) for c in (1, 2)}
    return {"dice": soft_dice(probs, target)}


def fit(
    model: UNet,
    x: torch.Tensor,
    y: torch.Tensor,
    config: FitConfig,
    val: tuple[torch.Tensor, torch.Tensor] | None = None,
    log_every: int = 250,
    progress: bool | None = None,
) -> FitLog:
    """Train ``model`` in place on ``x`` ``(n, [C,] H, W)`` and targets ``y`` ``(n, [C,] H, W)``.

    Inputs and targets may be float16 on the training device; batches are drawn with a seeded
    generator, so a CPU run repeats exactly (a GPU run up to cuDNN's non-deterministic kernels).
    ``progress``: a bar of the steps on stderr (True), none (False), or one when stderr is a
    terminal (None); the reports every ``log_every`` steps are printed either way.

    Returns
    -------
    FitLog
        Steps, seconds, mean loss per ``log_every`` steps and validation Dice at those points.
    """
    device = x.device
    gen = torch.Generator(device=device).manual_seed(config.seed)
    softmax = model.spec.activation == "softmax"
    loss_fn: Loss = lung_loss if softmax else nodule_loss
    positives = torch.nonzero(y.flatten(1).amax(1) > 0.3).flatten() if not softmax else None
    # Channels-last lets cuDNN use its tensor-core kernels for these narrow bf16 convolutions.
    layout = torch.channels_last if device.type == "cuda" else torch.contiguous_format
    set_layout(model, layout)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=1e-4)
    log = FitLog(losses=[], validation=[])
    start, running, sampled = time.perf_counter(), 0.0, 0
    model.train()
    bar = progress_bar(total=config.steps, desc="train", unit="step", force=progress)
    for step in range(1, config.steps + 1):
        done = max(step / config.steps, (time.perf_counter() - start) / config.max_seconds)
        for group in opt.param_groups:
            group["lr"] = _learning_rate(config.lr, done)
        idx = _draw(len(x), positives, config, gen, device)
        xb = _slices(x, idx)
        yb = y[idx].float() if softmax else y[idx, None].float()
        xb, yb = augment(xb, yb, softmax, gen)
        xb = xb.contiguous(memory_format=layout)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model.logits(xb)
        loss = loss_fn(logits.float(), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch's stubs
        opt.step()
        bar.update()
        if step % 10 == 0 or step == config.steps:  # reading the loss waits for the GPU
            running, sampled = running + float(loss.detach()), sampled + 1
            bar.set_postfix(loss=f"{running / sampled:.4f}", refresh=False)
        if step % log_every == 0 or step == config.steps:
            _report(model, log, step, running / max(sampled, 1), start, val)
            running, sampled = 0.0, 0
        if done >= 1.0 and step < config.steps:
            log.stopped_early = True
            _report(model, log, step, running / max(sampled, 1), start, val)
            break
    bar.close()
    log.steps, log.seconds = step, time.perf_counter() - start
    set_layout(model, torch.contiguous_format).eval()
    return log


def _slices(x: torch.Tensor, start: torch.Tensor | int, stop: int | None = None) -> torch.Tensor:
    """``x[start]`` or ``x[start:stop]`` as float32 ``(n, C, H, W)`` (C = 1 for ``(n, H, W)``)."""
    part = x[start] if stop is None else x[start:stop]
    return (part if x.ndim == 4 else part[:, None]).float()


def _learning_rate(peak: float, progress: float) -> float:
    """Warm-up over the first 5 % of training, then cosine decay to zero at ``progress`` 1."""
    if progress < 0.05:
        return peak * progress / 0.05
    return 0.5 * peak * (1.0 + math.cos(math.pi * min(1.0, (progress - 0.05) / 0.95)))


def _draw(
    n: int,
    positives: torch.Tensor | None,
    config: FitConfig,
    gen: torch.Generator,
    device: torch.device,
) -> torch.Tensor:
    """Sample indices: uniform, with ``positive_fraction`` of them from foreground slices."""
    idx = torch.randint(0, n, (config.batch,), generator=gen, device=device)
    if positives is None or not len(positives) or config.positive_fraction <= 0:
        return idx
    k = round(config.batch * config.positive_fraction)
    pick = torch.randint(0, len(positives), (k,), generator=gen, device=device)
    idx[:k] = positives[pick]
    return idx


def _report(
    model: UNet,
    log: FitLog,
    step: int,
    loss: float,
    start: float,
    val: tuple[torch.Tensor, torch.Tensor] | None,
) -> None:
    """Record and print (above the bar) the running loss and, with a validation set, its Dice."""
    assert log.losses is not None and log.validation is not None
    log.losses.append(round(loss, 4))
    figures = validate(model, *val, batch=64) if val is not None else {}
    log.validation.append({"step": step, **{k: round(v, 4) for k, v in figures.items()}})
    shown = " ".join(f"{k}={v:.4f}" for k, v in figures.items())
    elapsed = time.perf_counter() - start
    echo(f"  step {step:5d}  loss {loss:.4f}  {shown}  {elapsed:.0f}s")


def to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A numpy array on the training device, kept in half precision to save memory."""
    return torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=torch.float16)


def init_seed(seed: int) -> None:
    """Seed torch's default generator, which draws the initial weights."""
    torch.manual_seed(seed)

"""Network definitions: takes a size recipe, gives the small 2-D U-Nets the reference models use.

Both models are plain U-Nets (two 3x3 conv + batch-norm + ReLU blocks per level, max-pool down,
transposed-conv up, skip concatenation) with the activation inside the graph, so the ONNX output
is already the probability the card promises. Batch norm folds into the convolutions when ONNX
Runtime optimises the graph, so it costs nothing at inference.
"""

from __future__ import annotations

import torch
from torch import nn

from training.recipes import NetSpec


def _block(cin: int, cout: int) -> nn.Sequential:
    """Two 3x3 conv + batch-norm + ReLU layers."""
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


class UNet(nn.Module):
    """A 2-D U-Net that returns probabilities (``forward``) or logits (``logits``)."""

    def __init__(self, spec: NetSpec) -> None:
        super().__init__()
        w = spec.widths
        self.spec = spec
        self.down = nn.ModuleList([_block(spec.in_channels, w[0])])
        self.down.extend(_block(w[i - 1], w[i]) for i in range(1, len(w)))
        self.pool = nn.MaxPool2d(2)
        self.up = nn.ModuleList(
            nn.ConvTranspose2d(w[i], w[i - 1], 2, stride=2) for i in range(len(w) - 1, 0, -1)
        )
        self.merge = nn.ModuleList(_block(2 * w[i - 1], w[i - 1]) for i in range(len(w) - 1, 0, -1))
        self.head = nn.Conv2d(w[0], spec.out_channels, 1)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Raw class scores, ``(N, out_channels, H, W)``; H and W divisible by 2**levels."""
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else self.pool(x))
            skips.append(x)
        skips.pop()
        for up, merge in zip(self.up, self.merge, strict=True):
            x = merge(torch.cat([up(x), skips.pop()], dim=1))
        out: torch.Tensor = self.head(x)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Probabilities: softmax over channels, or a per-pixel sigmoid."""
        z = self.logits(x)
        return torch.softmax(z, dim=1) if self.spec.activation == "softmax" else torch.sigmoid(z)


def set_layout(model: nn.Module, layout: torch.memory_format) -> nn.Module:
    """Move ``model``'s weights to ``layout`` (channels-last or contiguous), in place."""
    # Module.to accepts memory_format at run time; torch's type stubs leave it out.
    return model.to(memory_format=layout)  # type: ignore[call-overload,no-any-return]


def parameter_count(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class LungGatedDetector(nn.Module):
    """A nodule heat map multiplied by a dilated lung-field mask, in one network.

    A 2-D detector sees one slice and knows no anatomy beyond its receptive field, so it also
    fires on round bright things outside the lungs (bowel, neck, breast), which no threshold or
    minimum volume removes. The lung U-Net, run on a 2x average-pooled copy of the same input
    (both models use the same window and normalisation), gives the lung field; max-pooling
    dilates it by ``dilation_px`` pooled pixels (about 1 cm), so juxtapleural nodules keep their
    score. The daemon still sees one model, one input and one heat map. A 2.5-D detector's input
    has the slice itself as its middle channel, and that channel is what the lung U-Net sees.
    """

    def __init__(self, detector: UNet, lung: UNet, dilation_px: int = 3) -> None:
        super().__init__()
        self.detector, self.lung, self.dilation_px = detector, lung, dilation_px
        self.spec = detector.spec
        self.middle = detector.spec.in_channels // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Heat map ``(N, 1, H, W)``: detector probability times the lung-field gate."""
        heat: torch.Tensor = self.detector(x)
        centre = x[:, self.middle : self.middle + 1]
        lung = 1.0 - self.lung(nn.functional.avg_pool2d(centre, 2))[:, :1]
        r = self.dilation_px
        gate = nn.functional.max_pool2d(lung, 2 * r + 1, stride=1, padding=r)
        return heat * nn.functional.interpolate(gate, scale_factor=2.0, mode="nearest")


def inflate_input(state: dict[str, torch.Tensor], in_channels: int) -> dict[str, torch.Tensor]:
    """A single-slice U-Net's weights for a ``in_channels``-channel (2.5-D) one.

    The first convolution's weights go to the middle channel and the neighbours' start at zero,
    so the inflated network computes exactly what the single-slice one did, and training only
    has to learn what the neighbours add. Weights that already have ``in_channels`` pass through.
    """
    key = "down.0.0.weight"
    weight = state[key]
    if weight.shape[1] == in_channels:
        return state
    if weight.shape[1] != 1:
        raise ValueError(f"cannot inflate {weight.shape[1]} input channels to {in_channels}")
    wide = weight.new_zeros(weight.shape[0], in_channels, *weight.shape[2:])
    wide[:, in_channels // 2] = weight[:, 0]
    return {**state, key: wide}

"""Takes CT slices in HU and masks; gives key images: a lung-window picture with outlines (PNG).

Pillow only, so the daemon can draw what it found without a plotting library. Rows and columns
are drawn as stored (row down, column right), which for an axial CT slice is the radiological
view (patient's right on the image's left); pixels are assumed square.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from io import BytesIO

import numpy as np
from numpy.typing import NDArray
from PIL import Image, ImageDraw

Colour = tuple[int, int, int]

LUNG_CENTRE = -600.0
LUNG_WIDTH = 1500.0
# zlib level 1 with run-length matching only. On a key image of real chest CT (LIDC-IDRI-0001,
# 692×512) it took 6.4 ms and 175 KB, against 8.0 ms / 152 KB for level 1 with zlib's default
# strategy and 15 ms / 148 KB for level 6: CPU counts on the results' write path, bytes hardly
# on a status page.
PNG_COMPRESS_LEVEL = 1
PNG_COMPRESS_TYPE = zlib.Z_RLE
MARKER_RADIUS = 10.0
MARKER_WIDTH = 2
# Palette layout of a key image: grey levels first, then up to 256 - GREYS colours. 240 greys
# are finer than the eye tells apart in a 1500 HU window (about 6 HU a level).
GREYS = 240
_GREY_LEVELS = np.rint(np.arange(GREYS) * (255 / (GREYS - 1))).astype(np.uint8)
_GREY_PALETTE = [int(v) for v in np.repeat(_GREY_LEVELS, 3)]
_GREY_INDEX = np.rint(np.arange(256) * ((GREYS - 1) / 255)).astype(np.uint8)


def window_to_uint8(
    hu: NDArray[np.floating], centre: float = LUNG_CENTRE, width: float = LUNG_WIDTH
) -> NDArray[np.uint8]:
    """Map HU to grey levels through a window.

    ``centre - width / 2`` and below become 0, ``centre + width / 2`` and above 255, linearly in
    between, rounded to the nearest level (the lung window's centre, -600 HU, is 128).

    Parameters
    ----------
    hu
        Hounsfield units, any shape.
    centre, width
        The window, in HU; ``width`` must be positive.

    Returns
    -------
    NDArray[np.uint8]
        Grey levels, the shape of ``hu``.
    """
    if width <= 0:
        raise ValueError(f"window width must be positive, got {width}")
    low = centre - width / 2
    scaled = (np.asarray(hu, np.float32) - np.float32(low)) * np.float32(255.0 / width)
    grey: NDArray[np.uint8] = np.rint(np.clip(scaled, 0.0, 255.0)).astype(np.uint8)
    return grey


def outline(mask2d: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """The border pixels of a 2-D mask: in the mask, with a 4-neighbour outside it.

    Pixels on the image's edge count as border (outside the image is outside the mask).

    Parameters
    ----------
    mask2d
        A boolean image.

    Returns
    -------
    NDArray[np.bool_]
        True on the mask's border, the shape of ``mask2d``.
    """
    m = np.asarray(mask2d, bool)
    if m.ndim != 2:
        raise ValueError(f"outline needs a 2-D mask, got shape {m.shape}")
    padded = np.pad(m, 1)
    interior = padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:] & m
    border: NDArray[np.bool_] = m & ~interior
    return border


def key_image(
    hu_slice: NDArray[np.floating],
    overlays: Sequence[tuple[NDArray[np.bool_], Colour]] = (),
    *,
    centre: float = LUNG_CENTRE,
    width: float = LUNG_WIDTH,
    crop: tuple[int, int, int, int] | None = None,
    scale: float = 1.0,
    markers: Sequence[tuple[float, float, Colour]] = (),
    marker_radius: float = MARKER_RADIUS,
) -> Image.Image:
    """One slice in a window with the outline of each overlay drawn in its colour.

    Parameters
    ----------
    hu_slice
        One slice in HU, (rows, cols).
    overlays
        ``(mask, colour)`` pairs; each mask has the slice's shape. Their outlines are drawn in
        order, so a later one is drawn over an earlier one.
    centre, width
        The display window in HU (default: lung window, -600 / 1500).
    crop
        ``(row0, col0, row1, col1)``, half-open, in slice pixels: only this part is drawn.
        It is clipped to the slice.
    scale
        Output pixels per slice pixel. Above 1 pixels are repeated (outlines stay one slice
        pixel wide, sharp); below 1 the slice is averaged down (box filter) and the outlines
        are kept where any of the pixels they cover was on one.
    markers
        ``(row, col, colour)`` circles, in slice pixels (of the whole slice, not the crop),
        e.g. to show where a finding is on a full slice.
    marker_radius
        The circles' radius in output pixels.

    Returns
    -------
    PIL.Image.Image
        A palette image (mode ``"P"``: one byte a pixel, so its PNG encodes several times
        faster than RGB) of ``round(scale * size)`` of the (cropped) slice: indices below
        ``GREYS`` are grey levels, the colours follow. ``.convert("RGB")`` for pixel values.
    """
    row0, col0, row1, col1 = _clip(crop, hu_slice.shape)
    part = (slice(row0, row1), slice(col0, col1))
    colours = list(dict.fromkeys([c for _, c in overlays] + [c for *_, c in markers]))
    if len(colours) > 256 - GREYS:
        raise ValueError(f"at most {256 - GREYS} colours, got {len(colours)}")
    rings = []
    for mask, colour in overlays:
        if mask.shape != hu_slice.shape:
            raise ValueError(f"overlay shape {mask.shape} is not the slice's {hu_slice.shape}")
        rings.append((_outline_within(mask[part]), GREYS + colours.index(colour)))
    grey = window_to_uint8(hu_slice[part], centre, width)
    size = (max(1, round(grey.shape[1] * scale)), max(1, round(grey.shape[0] * scale)))
    image = _compose(grey, rings, size)
    draw = ImageDraw.Draw(image)
    for row, col, colour in markers:
        # The slice pixel's centre, in output pixels.
        y, x = (row - row0 + 0.5) * scale, (col - col0 + 0.5) * scale
        box = (x - marker_radius, y - marker_radius, x + marker_radius, y + marker_radius)
        draw.ellipse(box, outline=GREYS + colours.index(colour), width=MARKER_WIDTH)
    image.putpalette(_GREY_PALETTE + [v for c in colours for v in c])
    return image


def side_by_side(
    images: Sequence[Image.Image], gap: int = 4, background: Colour = (0, 0, 0)
) -> Image.Image:
    """Images placed left to right, top-aligned, ``gap`` pixels apart, on ``background``.

    Key images (palette images from :func:`key_image`) give a palette image whose colours
    are theirs merged; with any other image the result is RGB.
    """
    if not images:
        raise ValueError("side_by_side needs at least one image")
    width = sum(im.width for im in images) + gap * (len(images) - 1)
    height = max(im.height for im in images)
    if not all(_is_key_image(im) for im in images):
        canvas = Image.new("RGB", (width, height), background)
        _paste_in_a_row(canvas, [im.convert("RGB") for im in images], gap)
        return canvas
    colours = list(dict.fromkeys(c for im in images for c in _colours(im)))
    greys = {(int(g), int(g), int(g)): i for i, g in enumerate(_GREY_LEVELS)}
    fill = greys.get(background)
    if fill is None:
        colours.append(background)
        fill = GREYS + len(colours) - 1
    if len(colours) > 256 - GREYS:
        raise ValueError(f"at most {256 - GREYS} colours side by side, got {len(colours)}")
    canvas = Image.new("P", (width, height), fill)
    _paste_in_a_row(canvas, [_with_colours(im, colours) for im in images], gap)
    canvas.putpalette(_GREY_PALETTE + [v for c in colours for v in c])
    return canvas


def png_bytes(image: Image.Image) -> bytes:
    """The image as PNG (fast zlib settings: see ``PNG_COMPRESS_LEVEL``)."""
    buffer = BytesIO()
    image.save(
        buffer, format="PNG", compress_level=PNG_COMPRESS_LEVEL, compress_type=PNG_COMPRESS_TYPE
    )
    return buffer.getvalue()


def _outline_within(mask: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """:func:`outline`, worked out on the mask's bounding box only (a finding is small)."""
    ring = np.zeros(mask.shape, bool)
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    if rows.size:
        box = (slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1))
        ring[box] = outline(mask[box])
    return ring


def _compose(
    grey: NDArray[np.uint8],
    rings: Sequence[tuple[NDArray[np.bool_], int]],
    size: tuple[int, int],
) -> Image.Image:
    """Grey levels with outlines as palette indices, at ``size``.

    Enlarged, the indices are composed at the slice's size and repeated. Reduced, the grey
    levels are averaged (box filter) and an outline pixel is kept wherever it covered any
    part of an output pixel, so that a one-pixel outline does not fade away.
    """
    shape = grey.shape[::-1]
    if size[0] >= shape[0]:
        index = _GREY_INDEX.take(grey)  # take: twice as fast as indexing with an array
        for ring, ink in rings:
            index[ring] = ink
        image = Image.fromarray(index, "P")
        return image if size == image.size else image.resize(size, Image.Resampling.NEAREST)
    reduced = Image.fromarray(grey, "L").resize(size, Image.Resampling.BOX)
    index = _GREY_INDEX.take(np.asarray(reduced))
    for ring, ink in rings:
        covered = Image.fromarray(ring.view(np.uint8) * 255, "L").resize(size, Image.Resampling.BOX)
        index[np.asarray(covered) > 0] = ink
    return Image.fromarray(index, "P")


def _is_key_image(image: Image.Image) -> bool:
    palette = image.getpalette() if image.mode == "P" else None
    return palette is not None and palette[: len(_GREY_PALETTE)] == _GREY_PALETTE


def _colours(image: Image.Image) -> list[Colour]:
    palette = image.getpalette() or []
    extra = palette[len(_GREY_PALETTE) :]
    return [(extra[i], extra[i + 1], extra[i + 2]) for i in range(0, len(extra) - 2, 3)]


def _with_colours(image: Image.Image, colours: list[Colour]) -> Image.Image:
    """A key image's colour indices moved to where ``colours`` has them (often nowhere)."""
    lut = np.arange(256, dtype=np.uint8)
    for i, colour in enumerate(_colours(image)):
        lut[GREYS + i] = GREYS + colours.index(colour)
    if (lut == np.arange(256)).all():
        return image
    return Image.fromarray(lut[np.asarray(image)], "P")


def _paste_in_a_row(canvas: Image.Image, images: Sequence[Image.Image], gap: int) -> None:
    x = 0
    for im in images:
        canvas.paste(im, (x, 0))
        x += im.width + gap


def _clip(
    crop: tuple[int, int, int, int] | None, shape: tuple[int, ...]
) -> tuple[int, int, int, int]:
    if crop is None:
        return 0, 0, shape[0], shape[1]
    row0, col0 = max(0, crop[0]), max(0, crop[1])
    row1, col1 = min(shape[0], crop[2]), min(shape[1], crop[3])
    if row1 <= row0 or col1 <= col0:
        raise ValueError(f"crop {crop} leaves nothing of a {shape[0]}×{shape[1]} slice")
    return row0, col0, row1, col1

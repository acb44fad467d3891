"""render: window maths, outlines, key images and their PNGs."""

from __future__ import annotations

from io import BytesIO

import numpy as np
import pytest
from PIL import Image

from imaging_ai.render import (
    key_image,
    outline,
    png_bytes,
    side_by_side,
    window_to_uint8,
)

YELLOW = (255, 255, 0)
BLUE = (80, 120, 255)


def rgb(image: Image.Image) -> np.ndarray:
    """Pixel values (key images are palette images)."""
    return np.asarray(image.convert("RGB"))


def test_lung_window_maps_its_ends_and_centre() -> None:
    hu = np.array([-2000, -1350, -600, 150, 3000, -975], np.float32)
    assert window_to_uint8(hu).tolist() == [0, 0, 128, 255, 255, 64]


def test_other_windows() -> None:
    # Mediastinal window 40 / 400: -160 -> 0, 240 -> 255, 40 -> 127.5 rounds to 128.
    hu = np.array([-160, 40, 240, 140], np.float32)
    assert window_to_uint8(hu, 40, 400).tolist() == [0, 128, 255, 191]
    with pytest.raises(ValueError, match="width"):
        window_to_uint8(hu, 0, 0)


def test_outline_is_the_border_of_a_square() -> None:
    mask = np.zeros((9, 9), bool)
    mask[2:7, 3:8] = True
    ring = outline(mask)
    expected = mask.copy()
    expected[3:6, 4:7] = False
    assert (ring == expected).all()
    assert ring.sum() == 25 - 9


def test_outline_of_a_disc_touches_every_column_it_spans() -> None:
    rows, cols = np.mgrid[:21, :21]
    disc = (rows - 10) ** 2 + (cols - 10) ** 2 <= 36
    ring = outline(disc)
    assert not ring[10, 10] and ring[10, 4] and ring[10, 16] and ring[4, 10] and ring[16, 10]
    assert (ring <= disc).all()
    # Every pixel of the disc not on the ring has all four neighbours in the disc.
    inner = disc & ~ring
    for r, c in zip(*np.nonzero(inner), strict=True):
        assert disc[r - 1, c] and disc[r + 1, c] and disc[r, c - 1] and disc[r, c + 1]


def test_outline_counts_the_image_edge_as_outside() -> None:
    mask = np.ones((4, 5), bool)
    ring = outline(mask)
    assert ring[0].all() and ring[-1].all() and ring[:, 0].all() and ring[:, -1].all()
    assert not ring[1:-1, 1:-1].any()


def _slice() -> tuple[np.ndarray, np.ndarray]:
    hu = np.full((64, 48), -850.0, np.float32)
    mask = np.zeros(hu.shape, bool)
    mask[20:30, 10:18] = True
    hu[mask] = 30.0
    return hu, mask


def test_key_image_draws_the_outline_in_its_colour_on_lung_grey() -> None:
    hu, mask = _slice()
    image = key_image(hu, [(mask, YELLOW)])
    assert image.mode == "P" and image.size == (48, 64)
    pixels = rgb(image)
    ring = outline(mask)
    assert (pixels[ring] == YELLOW).all()
    assert (pixels[~ring] == pixels[~ring][:, :1]).all()  # grey elsewhere
    # Grey levels as the window gives them, to within the palette's step (255 / 239).
    assert abs(int(pixels[0, 0, 0]) - int(window_to_uint8(np.float32(-850.0)))) <= 1
    assert abs(int(pixels[24, 14, 0]) - int(window_to_uint8(np.float32(30.0)))) <= 1


def test_later_overlays_draw_over_earlier_ones() -> None:
    hu, mask = _slice()
    pixels = rgb(key_image(hu, [(mask, BLUE), (mask, YELLOW)]))
    assert (pixels[20, 10] == YELLOW).all()


def test_crop_and_scale() -> None:
    hu, mask = _slice()
    image = key_image(hu, [(mask, YELLOW)], crop=(16, 6, 34, 22), scale=2)
    assert image.size == (32, 36)
    pixels = rgb(image)
    # Slice pixel (20, 10) is crop pixel (4, 4), drawn as the 2×2 block at (8, 8).
    assert (pixels[8:10, 8:10] == YELLOW).all()
    assert not (pixels[6:8, 6:8] == YELLOW).all(axis=2).any()


def test_crop_is_clipped_and_refused_when_empty() -> None:
    hu, _ = _slice()
    assert key_image(hu, crop=(-10, -10, 10, 100)).size == (48, 10)
    with pytest.raises(ValueError, match="leaves nothing"):
        key_image(hu, crop=(70, 0, 80, 10))


def test_downscale_keeps_the_aspect_and_the_outline() -> None:
    hu = np.full((1024, 768), -600.0, np.float32)
    mask = np.zeros(hu.shape, bool)
    mask[101:121, 201:221] = True  # odd starts: the border shares 2×2 blocks with the inside
    image = key_image(hu, [(mask, YELLOW)], scale=0.5)
    assert image.size == (384, 512)
    yellow = (rgb(image) == YELLOW).all(axis=2)
    assert yellow[50, 100:111].all() and yellow[60, 100:111].all()
    assert not yellow[55, 105]


def test_side_by_side_merges_the_key_images_colours() -> None:
    hu, mask = _slice()
    left = key_image(hu, [(mask, YELLOW)])
    right = key_image(hu, [(mask, BLUE)])
    both = side_by_side([left, right], gap=2)
    assert both.mode == "P" and both.size == (98, 64)
    pixels = rgb(both)
    assert (pixels[20, 10] == YELLOW).all() and (pixels[20, 60] == BLUE).all()
    assert (pixels[0, 0] == rgb(left)[0, 0]).all() and (pixels[0, 48:50] == 0).all()


def test_overlay_of_another_shape_is_refused() -> None:
    hu, _ = _slice()
    with pytest.raises(ValueError, match="shape"):
        key_image(hu, [(np.zeros((3, 3), bool), YELLOW)])


def test_marker_is_a_circle_around_the_point() -> None:
    hu = np.full((64, 64), -1000.0, np.float32)
    image = key_image(hu, markers=[(32, 32, YELLOW)], marker_radius=10)
    pixels = rgb(image)
    yellow = (pixels == YELLOW).all(axis=2)
    assert not yellow[32, 32]
    rows, cols = np.nonzero(yellow)
    distance = np.hypot(rows + 0.5 - 32.5, cols + 0.5 - 32.5)
    assert distance.min() > 7.5 and distance.max() < 11.5


def test_png_decodes_with_the_right_size() -> None:
    hu, mask = _slice()
    data = png_bytes(key_image(hu, [(mask, YELLOW)], scale=3))
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    decoded = Image.open(BytesIO(data))
    assert decoded.format == "PNG" and decoded.size == (144, 192)
    assert (np.asarray(decoded.convert("RGB"))[60, 30] == YELLOW).all()


def test_side_by_side() -> None:
    a = Image.new("RGB", (10, 20), (255, 0, 0))
    b = Image.new("RGB", (5, 8), (0, 255, 0))
    both = side_by_side([a, b], gap=3)
    assert both.size == (18, 20)
    pixels = rgb(both)
    assert (pixels[0, 0] == (255, 0, 0)).all() and (pixels[0, 13] == (0, 255, 0)).all()
    assert (pixels[15, 15] == 0).all()  # background below the shorter one


def test_side_by_side_on_another_background_and_with_plain_images() -> None:
    hu, mask = _slice()
    key = key_image(hu, [(mask, YELLOW)])
    both = side_by_side([key, key_image(hu, crop=(0, 0, 10, 10))], gap=2, background=BLUE)
    assert both.mode == "P"
    assert (rgb(both)[0, 48] == BLUE).all() and (rgb(both)[20, 10] == YELLOW).all()
    plain = Image.new("RGB", (5, 5), (1, 2, 3))
    mixed = side_by_side([key, plain], gap=0)
    assert mixed.mode == "RGB" and (np.asarray(mixed)[0, 48] == (1, 2, 3)).all()

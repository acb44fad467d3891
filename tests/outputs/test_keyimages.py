"""keyimages: one PNG per finding, drawn through its centre with its outline where its border is."""

from __future__ import annotations

from dataclasses import replace
from io import BytesIO
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from imaging_ai.config import Config, StorageConfig
from imaging_ai.outputs import files
from imaging_ai.outputs.files import _save_bytes, write_results
from imaging_ai.outputs.keyimages import (
    FULL_MAX_PX,
    KEY_IMAGE_NAME,
    MAX_NOT_REPORTED,
    NOT_REPORTED,
    REPORTED,
    centre_slice,
    findings,
    key_image_name,
    lesion_key_image,
    write_key_images,
)
from imaging_ai.postprocess import Lesion
from imaging_ai.render import outline
from tests.outputs.conftest import CREATED, IMPRESSION, Study
from tests.outputs.scale import large_study


def _rgb(data: bytes) -> np.ndarray:
    image = Image.open(BytesIO(data))
    assert image.format == "PNG"
    return np.asarray(image.convert("RGB"))


def _mask(lesion: Lesion, k: int, shape: tuple[int, ...]) -> np.ndarray:
    on = lesion.voxel_index[lesion.voxel_index[:, 0] == k]
    mask = np.zeros(shape, bool)
    mask[on[:, 1], on[:, 2]] = True
    return mask


def test_one_file_per_lesion_with_the_outline_on_its_border(study: Study, tmp_path: Path) -> None:
    analysis = study.analysis
    paths = write_key_images(analysis, tmp_path, _save_bytes)
    assert [p.name for p in paths] == ["key-1.png", "key-2.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key-1.png", "key-2.png"]
    shape = analysis.volume.hu.shape[1:]
    assert max(shape) <= FULL_MAX_PX  # whole slice drawn 1:1, so pixels are slice pixels
    for lesion, path in zip(analysis.lesions, paths, strict=True):
        pixels = _rgb(path.read_bytes())
        assert pixels.shape[0] == shape[0] and pixels.shape[1] > shape[1]  # plus the close-up
        k = centre_slice(lesion)
        assert lesion.slices[0] <= k <= lesion.slices[1]
        mask = _mask(lesion, k, shape)
        whole = pixels[:, : shape[1]]
        yellow = (whole == REPORTED).all(axis=2)
        assert yellow[outline(mask)].all(), "the outline is drawn on the lesion's border"
        assert not yellow[mask & ~outline(mask)].any(), "its inside is left as the CT shows it"
        assert (pixels[:, shape[1] + 4 :] == REPORTED).all(axis=2).any(), "close-up outlined"


def test_candidates_not_reported_are_blue_and_listed(study: Study, tmp_path: Path) -> None:
    a, b = study.analysis.lesions
    analysis = replace(
        study.analysis,
        candidates=(replace(a, number=1), replace(b, number=2, reported=False, probability=0.1)),
        lesions=(replace(a, number=1),),
    )
    assert [x.number for x in findings(analysis)] == [1, 2]
    paths = write_key_images(analysis, tmp_path, _save_bytes)
    assert [p.name for p in paths] == ["key-1.png", "key-2.png"]
    blue = (_rgb(paths[1].read_bytes()) == NOT_REPORTED).all(axis=2)
    k = centre_slice(b)
    shape = analysis.volume.hu.shape[1:]
    assert blue[: shape[0], : shape[1]][outline(_mask(b, k, shape))].all()
    assert not (_rgb(paths[1].read_bytes()) == REPORTED).all(axis=2).any()


def test_only_the_most_probable_unreported_candidates_get_key_images(
    study: Study, tmp_path: Path
) -> None:
    a, b = study.analysis.lesions
    unreported = [replace(b, number=n, reported=False, probability=n / 100) for n in range(3, 23)]
    reported = replace(a, number=2, probability=0.01)  # reported whatever its probability
    analysis = replace(study.analysis, candidates=(reported, *unreported))
    paths = write_key_images(analysis, tmp_path, _save_bytes)
    numbers = [int(KEY_IMAGE_NAME.fullmatch(p.name).group(1)) for p in paths]
    assert numbers == [2, *range(23 - MAX_NOT_REPORTED, 23)]


def test_without_candidates_the_lesions_are_the_findings(study: Study) -> None:
    assert study.analysis.candidates == ()
    assert findings(study.analysis) == study.analysis.lesions


def test_no_findings_no_files(study: Study, tmp_path: Path) -> None:
    analysis = replace(study.analysis, lesions=(), candidates=())
    assert write_key_images(analysis, tmp_path, _save_bytes) == []
    assert list(tmp_path.iterdir()) == []


def test_centre_slice_of_a_lesion_that_misses_its_mean_slice(study: Study) -> None:
    lesion = study.analysis.lesions[0]
    # Four voxels on slice 2, three on slice 6: the mean (3.7) rounds to 4, which it misses.
    idx = np.array([[2, 5, 5], [2, 5, 6], [2, 6, 5], [2, 6, 6], [6, 5, 5], [6, 5, 6], [6, 6, 6]])
    assert round(idx[:, 0].mean()) == 4
    assert centre_slice(replace(lesion, voxel_index=idx)) == 2
    straight = np.array([[3, 5, 5], [4, 5, 5], [5, 5, 5], [5, 5, 6]])
    assert centre_slice(replace(lesion, voxel_index=straight)) == 4


def test_close_up_stays_on_the_slice_for_a_lesion_at_the_edge(study: Study) -> None:
    lesion = study.analysis.lesions[0]
    k = centre_slice(lesion)
    idx = np.array([[k, 0, 0], [k, 0, 1], [k, 1, 0], [k, 1, 1]])
    image = lesion_key_image(study.analysis, replace(lesion, voxel_index=idx))
    pixels = np.asarray(image.convert("RGB"))
    assert (pixels[0:2, 0:2] == REPORTED).all()


@pytest.mark.parametrize("number", [1, 17, 123456789])
def test_names_match_what_the_web_serves(number: int) -> None:
    match = KEY_IMAGE_NAME.fullmatch(key_image_name(number))
    assert match is not None and int(match.group(1)) == number


def test_write_results_writes_a_key_image_per_finding(tmp_path: Path) -> None:
    analysis, headers = large_study(slices=40, size=128, lesions=2)
    config = Config(storage=StorageConfig(data_dir=str(tmp_path)))
    written = write_results(analysis, [], 7, CREATED, IMPRESSION, config, headers=headers)
    assert [p.name for p in written.key_images] == ["key-1.png", "key-2.png"]
    assert all(p.parent == written.folder and p.stat().st_size > 0 for p in written.key_images)
    assert not list(written.folder.glob("*.tmp"))
    # Never delivered: no payload names a key image.
    assert not [p for p in written.payloads if p.path.suffix == ".png"]


def test_results_are_written_when_the_key_images_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object) -> list[Path]:
        raise MemoryError("no room for pictures")

    monkeypatch.setattr(files, "write_key_images", broken)
    analysis, headers = large_study(slices=40, size=128, lesions=1)
    config = Config(storage=StorageConfig(data_dir=str(tmp_path)))
    written = write_results(analysis, [], 8, CREATED, IMPRESSION, config, headers=headers)
    assert written.key_images == ()
    assert {p.kind for p in written.payloads} >= {"seg", "sr"}
    assert "job 8: key images not written" in caplog.text


def test_the_result_folders_are_fsynced_after_the_renames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deliveries committed next name these files: their renames must be on disk first."""
    synced: list[tuple[Path, set[str]]] = []

    def fsync_path(path: Path) -> None:
        synced.append((path, {p.name for p in path.iterdir()}))

    monkeypatch.setattr(files, "fsync_path", fsync_path)
    analysis, headers = large_study(slices=40, size=128, lesions=1)
    config = Config(storage=StorageConfig(data_dir=str(tmp_path)))
    written = write_results(analysis, [], 9, CREATED, IMPRESSION, config, headers=headers)
    folders = [path for path, _ in synced]
    assert folders[:3] == [written.folder, written.folder.parent, written.folder.parent.parent]
    names = synced[0][1]
    assert {p.path.name for p in written.payloads} <= names and not any(
        n.endswith(".tmp") for n in names
    )

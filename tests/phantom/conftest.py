"""A phantom with every negative feature drawn, built once for the phantom tests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from imaging_ai_devkit.phantom import PhantomSpec, PhantomVolume, generate
from imaging_ai_devkit.phantom.generate import Geometry, plan_geometry
from imaging_ai_devkit.phantom.patient import Patient, draw_patient, drawn_spec
from imaging_ai_devkit.phantom.scene import Scene, build_scene

FEATURES = PhantomSpec(
    slices=64,
    seed=21,
    nodules=2,
    slice_thickness_mm=5.0,
    contrast=True,
    dense_contrast=True,
    atelectasis=True,
)
"""Apex to upper abdomen in 5 mm slices, with contrast, a dense vein and atelectasis."""


@dataclass(frozen=True)
class Built:
    """What :func:`imaging_ai_devkit.phantom.generate` builds before it renders."""

    spec: PhantomSpec
    patient: Patient
    scene: Scene
    geometry: Geometry


@pytest.fixture(scope="package")
def built() -> Built:
    """The scene and slice geometry of :data:`FEATURES`."""
    spec = drawn_spec(FEATURES)
    patient = draw_patient(spec)
    scene = build_scene(patient)
    return Built(spec, patient, scene, plan_geometry(spec, patient, scene))


def vein_slices(built: Built) -> list[int]:
    """Indices of the slices whose centre lies within the dense vein's z range."""
    assert built.scene.streaks is not None
    b = built.scene.streaks.vein.bounds
    z = built.geometry.z
    return [int(k) for k in np.nonzero((z > b[4] + 3.0) & (z < b[5] - 3.0))[0]]


@pytest.fixture(scope="package")
def volume(built: Built) -> PhantomVolume:
    """Every sixth slice of :data:`FEATURES` and two slices through the dense vein."""
    vein = vein_slices(built)
    middle = len(vein) // 2
    chosen = sorted({*range(2, FEATURES.slices, 6), *vein[max(middle - 1, 0) : middle + 1]})
    return generate(FEATURES, slices=chosen)

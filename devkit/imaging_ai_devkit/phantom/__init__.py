"""Synthetic chest CT phantoms: take a :class:`PhantomSpec`, give HU volumes, truth and DICOM.

>>> vol = generate(PhantomSpec(slices=40, seed=7, nodules=2))   # doctest: +SKIP
>>> write_study(vol, "out", priority="urgent")                  # doctest: +SKIP

Besides lungs and nodules, the truth labels the structures that look like nodules to a detector
(vessels, airways, chest wall, diaphragm, bone, streaks, bowel, atelectasis, mediastinum) in
``PhantomVolume.structures``, named by :data:`STRUCTURE_NAMES`.

Patient coordinates are DICOM LPS in mm (+x patient left, +y posterior, +z head); slices run from
head to feet, so index 0 is the most superior image (InstanceNumber 1).
"""

from imaging_ai_devkit.phantom.dicom import PRIORITIES, Priority, default_accession, write_study
from imaging_ai_devkit.phantom.generate import Geometry, PhantomVolume, generate
from imaging_ai_devkit.phantom.nodules import Nodule
from imaging_ai_devkit.phantom.spec import PATIENT_SIZES, PhantomSpec
from imaging_ai_devkit.phantom.structures import STRUCTURE_NAMES

__all__ = [
    "PATIENT_SIZES",
    "PRIORITIES",
    "STRUCTURE_NAMES",
    "Geometry",
    "Nodule",
    "PhantomSpec",
    "PhantomVolume",
    "Priority",
    "default_accession",
    "generate",
    "write_study",
]

"""Structure labels: take painted part names, give the class each voxel of the truth belongs to.

The ``structures`` truth names what a voxel is when it is not lung parenchyma or a nodule, so
that a candidate classifier can learn "nodule versus vessel, airway, chest wall, diaphragm,
bone, streak, bowel, atelectasis or mediastinum" from phantoms. Nodule voxels are 0 here; the
``nodule_mask`` truth names them.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

NONE = 0
VESSEL = 1
AIRWAY = 2
CHEST_WALL = 3
DIAPHRAGM = 4
BONE = 5
STREAK = 6
BOWEL = 7
ATELECTASIS = 8
MEDIASTINUM = 9

STRUCTURE_NAMES: dict[int, str] = {
    NONE: "none",
    VESSEL: "vessel",
    AIRWAY: "airway",
    CHEST_WALL: "chest wall",
    DIAPHRAGM: "diaphragm",
    BONE: "bone",
    STREAK: "streak",
    BOWEL: "bowel",
    ATELECTASIS: "atelectasis",
    MEDIASTINUM: "mediastinum",
}
"""Label value to name. "none" is air, lung parenchyma, nodules and the table; "vessel" every
blood vessel outside the heart (lung trees, hilar and great vessels); "airway" trachea and
bronchi, lumen and wall; "chest wall" skin, fat, muscle, breasts and the pleural fat layer;
"diaphragm" the diaphragm and the solid upper abdomen under it (liver, spleen, kidneys, fat);
"bone" ribs, costal cartilage, vertebrae, sternum, clavicles and scapulae; "streak" lung pixels
that beam-hardening streaks from dense contrast shift by 40 HU or more; "bowel" stomach and
colon (gas, wall and contents); "mediastinum" heart, oesophagus, lymph nodes, mediastinal fat."""

COUNT = len(STRUCTURE_NAMES)

_BY_PART = {
    "aorta": VESSEL, "pulmonary trunk": VESSEL, "right pulmonary artery": VESSEL,
    "left pulmonary artery": VESSEL, "superior vena cava": VESSEL,
    "brachiocephalic vein": VESSEL, "brachiocephalic artery": VESSEL,
    "left carotid artery": VESSEL, "left subclavian artery": VESSEL, "azygos vein": VESSEL,
    "inferior vena cava": VESSEL, "pulmonary vein": VESSEL, "subclavian vein": VESSEL,
    "airway wall": AIRWAY, "airway lumen": AIRWAY,
    "pericardial fat": MEDIASTINUM, "myocardium": MEDIASTINUM, "left atrium": MEDIASTINUM,
    "left ventricle": MEDIASTINUM, "right ventricle": MEDIASTINUM, "right atrium": MEDIASTINUM,
    "esophagus": MEDIASTINUM, "lymph node": MEDIASTINUM,
    "glandular": CHEST_WALL, "chest wall muscle": CHEST_WALL, "erector spinae": CHEST_WALL,
    "neck": CHEST_WALL, "skin": CHEST_WALL,
    "diaphragm": DIAPHRAGM, "abdominal fat": DIAPHRAGM, "liver": DIAPHRAGM,
    "hepatic vein": DIAPHRAGM, "spleen": DIAPHRAGM, "kidney": DIAPHRAGM,
    "gallbladder": DIAPHRAGM,
    "stomach wall": BOWEL, "stomach contents": BOWEL, "stomach gas": BOWEL,
    "colon wall": BOWEL, "colon gas": BOWEL, "colon contents": BOWEL,
}  # fmt: skip


def structure_of(part: str) -> int:
    """Label of a painted part by its name (0 for parts no class names, such as the table)."""
    return _BY_PART.get(part, NONE)


def combine(planes: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """Label of a thick slice from the labels of the planes averaged into it.

    A class wins where it covers at least a third of the planes (the most planes if several
    do): on a 5 mm slice, two planes through the top of the diaphragm make a soft-tissue blob
    in the lung's grey, and it is labelled as diaphragm.

    Parameters
    ----------
    planes : ndarray
        uint8 ``(planes, rows, columns)`` labels of the sub-slices.

    Returns
    -------
    ndarray
        uint8 ``(rows, columns)``.
    """
    if len(planes) == 1:
        return np.array(planes[0], dtype=np.uint8)
    need = max(1, math.ceil(len(planes) / 3))
    best = np.zeros(planes.shape[1:], dtype=np.uint8)
    votes = np.zeros(planes.shape[1:], dtype=np.uint8)
    for label in np.unique(planes):
        if label == NONE:
            continue
        count = (planes == label).sum(axis=0, dtype=np.uint8)
        win = (count >= need) & (count > votes)
        best[win], votes[win] = label, count[win]
    return best

"""Takes the pixel decoders installed; gives the presentation contexts the storage SCP accepts.

CT Image Storage and Enhanced CT Image Storage with the uncompressed transfer syntaxes and the
lossless ones whose decoder is installed, and Verification (C-ECHO). The association offers
them at negotiation (`imaging_ai.dicom.negotiation`); the store path checks Pixel Data
against the uncompressed syntaxes (`imaging_ai.receive_store`).
"""

from __future__ import annotations

from pydicom.pixels.decoders.base import get_decoder
from pydicom.uid import (
    UID,
    DeflatedExplicitVRLittleEndian,
    ExplicitVRBigEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    JPEG2000Lossless,
    JPEGLosslessSV1,
    JPEGLSLossless,
    RLELossless,
)
from pynetdicom.presentation import PresentationContext, build_context
from pynetdicom.sop_class import (  # type: ignore[attr-defined]
    CTImageStorage,
    EnhancedCTImageStorage,
    Verification,
)

STORAGE_SOP_CLASSES = (CTImageStorage, EnhancedCTImageStorage)
UNCOMPRESSED_SYNTAXES = (
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    DeflatedExplicitVRLittleEndian,
    ExplicitVRBigEndian,
)
LOSSLESS_SYNTAXES = (JPEGLSLossless, JPEG2000Lossless, RLELossless, JPEGLosslessSV1)


def accepted_transfer_syntaxes() -> list[UID]:
    """Uncompressed syntaxes, plus the lossless ones whose decoder is installed.

    Refusing an undecodable syntax at negotiation makes PACS fall back to an
    uncompressed one instead of sending something that would fail later.
    """
    usable = [uid for uid in LOSSLESS_SYNTAXES if _decoder_available(uid)]
    return [*UNCOMPRESSED_SYNTAXES, *usable]


def _decoder_available(uid: UID) -> bool:
    try:
        return bool(get_decoder(uid).is_available)
    except (NotImplementedError, ValueError):
        return False


def supported_contexts() -> list[PresentationContext]:
    """CT and Enhanced CT storage with every usable syntax, and Verification."""
    syntaxes: list[str | UID] = list(accepted_transfer_syntaxes())
    contexts = [build_context(sop_class, syntaxes) for sop_class in STORAGE_SOP_CLASSES]
    return [*contexts, build_context(Verification)]

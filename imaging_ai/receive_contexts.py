"""Takes the configured Storage SOP classes and the pixel decoders installed; gives the
presentation contexts the storage SCP accepts.

Every Storage SOP class a PACS may send is offered (pynetdicom's list of them, or the
``[dicom] storage_sop_classes`` configured), so a whole study is stored: the dose SR, the
localizer, secondary captures and earlier results are kept beside the CT, and only the CT is
analysed (``imaging_ai.catalog.not_analysed``). The CT classes, whose pixels the daemon
decodes, take the uncompressed transfer syntaxes and the lossless ones whose decoder is
installed; the other classes are kept as received, never decoded, and also take the lossy
syntaxes. Verification (C-ECHO) is offered too. The association offers these at negotiation
and takes the sender's first choice among them (`imaging_ai.dicom.negotiation`); the store path
checks Pixel Data against the uncompressed syntaxes (`imaging_ai.receive_store`).
"""

from __future__ import annotations

from collections.abc import Iterable

from pydicom.pixels.decoders.base import get_decoder
from pydicom.uid import (
    JPEG2000,
    RE_VALID_UID,
    UID,
    DeflatedExplicitVRLittleEndian,
    ExplicitVRBigEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    JPEG2000Lossless,
    JPEGBaseline8Bit,
    JPEGExtended12Bit,
    JPEGLossless,
    JPEGLosslessSV1,
    JPEGLSLossless,
    JPEGLSNearLossless,
    RLELossless,
)
from pynetdicom.presentation import PresentationContext, build_context
from pynetdicom.sop_class import (  # type: ignore[attr-defined]
    _STORAGE_CLASSES,
    CTImageStorage,
    EnhancedCTImageStorage,
    LegacyConvertedEnhancedCTImageStorage,
    Verification,
)

# The classes whose pixels are decoded into a volume: only these are ever analysed.
ANALYSED_SOP_CLASSES = (
    CTImageStorage,
    EnhancedCTImageStorage,
    LegacyConvertedEnhancedCTImageStorage,
)
# Every Storage SOP class pynetdicom knows, by keyword ("all" in the configuration).
ALL_STORAGE_SOP_CLASSES: dict[str, str] = {k: str(v) for k, v in _STORAGE_CLASSES.items()}
UNCOMPRESSED_SYNTAXES = (
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    DeflatedExplicitVRLittleEndian,
    ExplicitVRBigEndian,
)
# The lossless compressed syntaxes PACS archives hold CT in; offered where a decoder imports.
LOSSLESS_SYNTAXES = (
    JPEGLosslessSV1,
    JPEGLossless,
    JPEGLSLossless,
    JPEG2000Lossless,
    RLELossless,
)
# Lossy syntaxes: never offered for CT (the models would measure compression error; PACS then
# sends the CT uncompressed or lossless), taken for the classes kept and never decoded
# (a dose screen as a JPEG secondary capture, say), so the study is stored whole.
LOSSY_SYNTAXES = (JPEGBaseline8Bit, JPEGExtended12Bit, JPEGLSNearLossless, JPEG2000)
_MAX_UID = 64


def accepted_transfer_syntaxes() -> list[UID]:
    """Uncompressed syntaxes, plus the lossless ones whose decoder is installed: the CT's.

    Refusing an undecodable syntax at negotiation makes PACS fall back to an
    uncompressed one instead of sending something that would fail later.
    """
    usable = [uid for uid in LOSSLESS_SYNTAXES if _decoder_available(uid)]
    return [*UNCOMPRESSED_SYNTAXES, *usable]


def kept_transfer_syntaxes() -> list[UID]:
    """What the classes that are kept but never decoded may come in: any of the above."""
    return [*UNCOMPRESSED_SYNTAXES, *LOSSLESS_SYNTAXES, *LOSSY_SYNTAXES]


def _decoder_available(uid: UID) -> bool:
    try:
        return bool(get_decoder(uid).is_available)
    except (NotImplementedError, ValueError):
        return False


def storage_sop_classes(entries: Iterable[str]) -> tuple[str, ...]:
    """The SOP Class UIDs that ``[dicom] storage_sop_classes`` names, in order, each once.

    ``"all"`` is every Storage SOP class pynetdicom knows; a keyword (``CTImageStorage``) is
    its UID; anything else must be a UID (a private class such as a vendor's raw data).

    Raises
    ------
    ValueError
        An entry is neither "all", a Storage SOP class keyword, nor a valid UID.
    """
    found: dict[str, None] = {}
    for entry in entries:
        if entry == "all":
            found.update(dict.fromkeys(ALL_STORAGE_SOP_CLASSES.values()))
        elif entry in ALL_STORAGE_SOP_CLASSES:
            found[ALL_STORAGE_SOP_CLASSES[entry]] = None
        elif len(entry) <= _MAX_UID and RE_VALID_UID.match(entry):
            found[entry] = None
        else:
            raise ValueError(
                f'has {entry!r}: not "all", a Storage SOP class keyword '
                "(such as CTImageStorage) or a UID"
            )
    return tuple(found)


def supported_contexts(sop_classes: Iterable[str] = ("all",)) -> list[PresentationContext]:
    """Storage of the given classes (see `storage_sop_classes`), and Verification.

    The CT classes take the syntaxes that are decoded (`accepted_transfer_syntaxes`); the
    others are stored as received (`kept_transfer_syntaxes`).
    """
    decoded: list[str | UID] = list(accepted_transfer_syntaxes())
    kept: list[str | UID] = list(kept_transfer_syntaxes())
    contexts = [
        build_context(uid, decoded if uid in ANALYSED_SOP_CLASSES else kept)
        for uid in storage_sop_classes(sop_classes)
    ]
    return [*contexts, build_context(Verification)]

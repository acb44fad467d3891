"""The one exception hierarchy of imaging-ai; every stage raises from here."""


class ImagingAIError(Exception):
    """Base class of every error imaging-ai raises on purpose."""


class ConfigError(ImagingAIError):
    """The configuration file or an environment override is invalid."""


class StartupError(ImagingAIError):
    """The daemon cannot start (port in use, database unreachable, bad model)."""


class StorageError(ImagingAIError):
    """The spool or the database could not keep an instance."""


class OutOfResources(StorageError):
    """Free disk space is below the configured low-water mark."""


class InvalidDataset(ImagingAIError):
    """A received DICOM dataset cannot be parsed or lacks required attributes."""


class SOPClassMismatch(InvalidDataset):
    """A dataset's SOP Class UID differs from the one it was sent as."""


class DuplicateSOPInstance(InvalidDataset):
    """A SOP Instance UID is already catalogued under another study."""


class UnsupportedInput(ImagingAIError):
    """A study is valid DICOM but not something the models can take (modality, geometry)."""


class GeometryError(UnsupportedInput):
    """A series cannot be assembled into a volume with consistent geometry."""


class ModelError(ImagingAIError):
    """A model folder is invalid or its ONNX does not match its card."""


class EngineError(ImagingAIError):
    """An inference backend failed (driver error, out of memory, runtime error)."""


class DeliveryError(ImagingAIError):
    """A result could not be delivered to PACS or RIS."""


class OutputError(ImagingAIError):
    """A study's results cannot be encoded from its data (the same data fails alike)."""


class ImagesPurged(ImagingAIError):
    """A study's instance files were deleted by retention: it must be sent again to be analysed."""

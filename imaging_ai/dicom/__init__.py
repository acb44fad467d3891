"""DICOM as bytes: the daemon's one codec of elements (``codec``), shared by the upper layer's
DIMSE command sets, the receiver's header reader, the volume loader and the result writer."""

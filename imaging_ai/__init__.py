"""imaging-ai: receives CT studies from PACS, runs AI models, returns SEG/SR and reports."""

__version__ = "0.1.0"

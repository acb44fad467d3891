"""Fixtures for the inference tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.infer.tiny_model import TinyModel, make_tiny


@pytest.fixture
def tiny(tmp_path: Path) -> TinyModel:
    """The tiny 1x1-conv + softmax model under tmp_path/engines/tiny."""
    return make_tiny(tmp_path)

"""Fixtures for the end-to-end tests (helpers live in lsp_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from lsp_helpers import SAXPY


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A workspace folder with ``saxpy.cu``."""
    (tmp_path / "saxpy.cu").write_text(SAXPY)
    return tmp_path

"""The security suite's set-up: the end-to-end helpers (``tests/e2e/lsp_helpers.py``) on the import path."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

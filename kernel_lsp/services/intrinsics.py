"""CUDA built-ins documented for hover (``data/intrinsics.json``), read once per process."""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass

PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "intrinsics.json")


@dataclass(frozen=True)
class Intrinsic:
    name: str
    kind: str
    """``warp shuffle``, ``atomic``, ``built-in variable``, …"""
    signature: str
    summary: str
    notes: str


@functools.lru_cache(maxsize=1)
def intrinsics() -> dict[str, Intrinsic]:
    """Name -> entry; empty when the data file is missing or unreadable (hover then has no built-ins)."""
    try:
        with open(PATH, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return {e["name"]: Intrinsic(e["name"], e["kind"], e["signature"], e["summary"], e.get("notes", ""))
            for e in data.get("entries", [])}

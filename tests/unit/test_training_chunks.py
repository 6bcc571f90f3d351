"""training/chunks.py: a file in parts under a size limit and back, every part and the whole checked."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "training"))
import chunks  # noqa: E402


@pytest.mark.parametrize("size", [0, 1000, 2048, 5000])
def test_split_and_join_give_the_file_back(tmp_path: Path, size: int) -> None:
    original = tmp_path / "model.gguf"
    original.write_bytes(os.urandom(size))
    manifest = chunks.split(original, tmp_path / "parts", max_mib=1024 / chunks.MIB)
    parts = json.loads(manifest.read_text())["parts"]
    assert all(p["size_bytes"] <= 1024 for p in parts) and len(parts) == max(1, -(-size // 1024))
    out = chunks.join(manifest, tmp_path / "joined.gguf")
    assert out.read_bytes() == original.read_bytes()


def test_a_changed_or_missing_part_stops_the_join_and_writes_nothing(tmp_path: Path) -> None:
    original = tmp_path / "a.bin"
    original.write_bytes(os.urandom(3000))
    manifest = chunks.split(original, tmp_path / "parts", max_mib=1024 / chunks.MIB)
    part = tmp_path / "parts" / "a.bin.part01"
    data = bytearray(part.read_bytes())
    data[10] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(chunks.JoinError, match="a.bin.part01 is not the part"):
        chunks.join(manifest, tmp_path / "out.bin")
    part.unlink()
    assert chunks.main(["join", str(manifest), "--out", str(tmp_path / "out.bin")]) == 1
    assert not list(tmp_path.glob("out.bin*"))

"""benchmarks/model_suite.py's model names: ``NAME+lora=FILE.gguf`` is that GGUF with the adapter, labelled apart
from the base, so that one verification holds both side by side."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import model_suite  # noqa: E402


def _gguf(path: Path) -> Path:
    # The header check reads the magic and the version; nothing else is loaded until the first chat.
    path.write_bytes(b"GGUF" + struct.pack("<I", 3) + bytes(16))
    return path


def test_a_lora_suffix_loads_the_adapter_under_its_own_label(tmp_path: Path) -> None:
    base = _gguf(tmp_path / "base.gguf")
    adapter = tmp_path / "adapter.gguf"
    plain = model_suite._model(str(base), threads=2, n_ctx=4096)
    distilled = model_suite._model(f"{base}+lora={adapter}", threads=2, n_ctx=4096)
    assert plain.options.lora_path is None and plain.name == "base.gguf"
    assert distilled.options.lora_path == str(adapter) and distilled.name == "base.gguf+lora"
    assert distilled.path == plain.path

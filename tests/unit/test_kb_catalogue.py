"""The shipped catalogue: techniques.json and states.json are complete, consistent and their CUDA compiles."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest

from kernel_lsp.core import kb_logic
from kernel_lsp.core.signature import SIGNATURE_KEYS
from kernel_lsp.services import proc

DATA = resources.files("kernel_lsp") / "data"
TECHNIQUES = json.loads((DATA / "techniques.json").read_text())["techniques"]
STATES = json.loads((DATA / "states.json").read_text())["states"]


def test_catalogue_sizes_and_fields():
    assert len(TECHNIQUES) >= 25
    assert len(STATES) >= 10
    names = [t["name"] for t in TECHNIQUES]
    assert len(names) == len(set(names))
    for t in TECHNIQUES:
        assert t["title"] and len(t["description"]) > 40 and t["preconditions"], t["name"]
        before, after = t["example"]["before"], t["example"]["after"]
        assert "__global__" in before and "__global__" in after and before != after, t["name"]
        assert len(before) + len(after) < 4000, f"{t['name']}: example too long for a prompt"


def test_states_refer_to_known_keys_and_techniques():
    techniques = {t["name"] for t in TECHNIQUES}
    names = [s["name"] for s in STATES]
    assert len(names) == len(set(names)) and kb_logic.FALLBACK_STATE in names
    for s in STATES:
        assert set(s["signature"]) <= set(SIGNATURE_KEYS), s["name"]
        for spec in s["signature"].values():
            assert spec["weight"] > 0 and spec.get("bound") in (None, "min", "max")
        assert s["entries"], s["name"]
        for e in s["entries"]:
            assert e["technique"] in techniques, (s["name"], e["technique"])
            assert 0.1 <= e["confidence"] <= 1.0 and e["predicted_speedup"] > 0
            assert 0 <= e["successes"] <= e["attempts"]
    used = {e["technique"] for s in STATES for e in s["entries"]}
    assert used == techniques, f"techniques no state suggests: {techniques - used}"


def _translation_unit() -> str:
    """Every example in its own namespace, with the #include lines hoisted to the top."""
    includes: set[str] = set()
    parts = []
    for t in TECHNIQUES:
        for side in ("before", "after"):
            lines = []
            for line in t["example"][side].splitlines():
                (includes.add(line) if line.startswith("#include") else lines.append(line))
            ns = "t_" + re.sub(r"\W", "_", t["name"]) + "_" + side
            parts.append(f"namespace {ns} {{\n" + "\n".join(lines) + f"\n}}  // namespace {ns}\n")
    return "\n".join(sorted(includes)) + "\n" + "\n".join(parts)


@pytest.mark.nvcc
def test_every_example_compiles(tmp_path):
    if proc.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    source = tmp_path / "catalogue.cu"
    source.write_text(_translation_unit())
    result = proc.run(["nvcc", "-arch=sm_90", "-c", str(source), "-o", str(tmp_path / "catalogue.o")], timeout_s=240)
    assert result.ok, result.stderr[-3000:]
    assert "warning" not in result.stderr.lower(), result.stderr[-3000:]

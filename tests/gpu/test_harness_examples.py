"""Every entry of examples/manifest.json, verified end to end on the GPU.

Skipped cleanly without pycuda, nvcc or a CUDA device (tests/gpu/conftest.py). Set ``HARNESS_RESULTS=FILE.json``
to keep the verdict table (reason, speedup and interval, timings, wall time).
"""

from __future__ import annotations

import json
import os

import pytest

from kernel_lsp.core.spec import with_candidate_launch
from kernel_lsp.services.harness import VerifyOptions, load_spec_file, verify
from kernel_lsp.services.toolchain import BuildFlags

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def _manifest() -> list[dict]:
    path = os.path.join(ROOT, "manifest.json")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return json.load(f)


ENTRIES = _manifest()
_RESULTS: list[dict] = []


@pytest.fixture(scope="module", autouse=True)
def keep_results():
    yield
    out = os.environ.get("HARNESS_RESULTS")
    if out and _RESULTS:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(_RESULTS, f, indent=2)


def _read(rel: str) -> str:
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


@pytest.mark.gpu
@pytest.mark.parametrize("entry", ENTRIES, ids=[f"{i:02d}-{e['candidate']}-{os.path.basename(e['spec'])}" for i, e in enumerate(ENTRIES)])
def test_example_verdict(entry):
    spec = load_spec_file(os.path.join(ROOT, entry["spec"]))
    if entry.get("candidate_launch"):
        spec = with_candidate_launch(spec, entry["candidate_launch"])
    options = VerifyOptions(sanitize=bool(entry.get("needs_sanitize")),
                            build=BuildFlags(flags=("-I", os.path.dirname(os.path.join(ROOT, entry["original"])))))
    verdict = verify(_read(entry["original"]), _read(entry["candidate"]), spec, options)
    _RESULTS.append({"entry": entry, "verdict": verdict.to_json()})
    expected = entry["expect"]
    print(f"{entry['candidate']} [{entry['spec']}]: {verdict.summary()} ({verdict.wall_s:.1f} s)")
    assert verdict.reason.value in expected["reason"], f"{verdict.summary()}\n{verdict.errors}\n{verdict.sanitizer or ''}"
    assert verdict.accepted == expected["accepted"]

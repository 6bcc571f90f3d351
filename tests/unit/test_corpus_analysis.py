"""The access analysis on every corpus kernel: it finds the kernel, classifies every access
(no unexplained "unknown") and finds what was recorded in ``tests/fixtures/corpus/analysis.json``
(made by ``record_analysis.py`` beside it; a change there is a change of what users are told)."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"
_spec = importlib.util.spec_from_file_location("record_analysis", _FIXTURES / "record_analysis.py")
_recorder = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_recorder)
CORPUS, record = _recorder.CORPUS, _recorder.record

EXPECTED = json.loads((_FIXTURES / "analysis.json").read_text())
ENTRIES = sorted(p.name for p in CORPUS.iterdir() if p.is_dir() and not p.name.startswith("_"))


def test_every_corpus_kernel_has_a_recorded_analysis():
    assert sorted(EXPECTED) == ENTRIES


@pytest.mark.parametrize("name", ENTRIES)
def test_corpus_kernel_analysis(name):
    found = record(name)
    assert found["accesses"], "no memory access found"
    # An unknown pattern carries its reason, and the reason is not the launch lacking a value:
    # every corpus spec gives every size its kernel uses.
    unknown = [a for a in found["accesses"] if " unknown" in a]
    assert all(a.endswith(")") and "launch does not give" not in a for a in unknown), unknown
    assert found == EXPECTED[name]


def test_coverage_over_the_corpus():
    accesses = Counter(a.split(" (", 1)[0].rsplit(" ", 1)[1] for entry in EXPECTED.values() for a in entry["accesses"])
    total = sum(accesses.values())
    assert accesses["unknown"] <= total // 20, accesses

"""``benchmarks/corpus_suite.py`` without a GPU: the held-out selection, its rows and the dry path.

The dry run goes through the same search as a measured run (``Session.optimize``) with
verification off, so it shows that a selected kernel reaches the optimizer and what its row
carries; it measures nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import script_module

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def suite():
    return script_module.load("benchmarks/corpus_suite.py")


def test_heldout_and_the_rest_split_the_corpus(suite):
    names = suite.entries(None)
    heldout, rest = suite.select(names, True), suite.select(names, False)
    assert len(heldout) >= 30 and rest
    assert sorted(heldout + rest) == names
    assert all(suite.is_heldout(suite.load_spec(n).notes) for n in heldout)
    assert not any(suite.is_heldout(suite.load_spec(n).notes) for n in rest)
    assert suite.select(names, None) == names


def test_a_dry_run_must_name_its_output(suite):
    # The default output is the committed results file; a run that measures nothing must not replace it.
    with pytest.raises(SystemExit):
        suite.main(["--dry-run", "--heldout"])


def test_heldout_and_no_heldout_exclude_each_other(suite):
    with pytest.raises(SystemExit):
        suite.main(["--heldout", "--no-heldout", "--dry-run", "--out", "unused.json"])


def test_dry_run_rows_carry_the_fields_of_a_measured_run(suite, tmp_path: Path):
    names = suite.entries(None)
    heldout = suite.select(names, True)[0]
    kept = suite.select(names, False)[0]
    out = tmp_path / "dry.json"
    # --only names one held-out and one other entry: --heldout keeps the first alone.
    assert suite.main(["--heldout", "--dry-run", "--only", f"{heldout},{kept}", "--budget", "2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["dry_run"] is True
    (row,) = result["kernels"]
    assert row["name"] == heldout and row["heldout"] is True
    assert row["suite"] == heldout.split("_", 1)[0]
    for key in ("name", "suite", "control", "heldout", "baseline_us", "floor_us", "best_speedup", "sequence", "candidates", "wall_s"):
        assert key in row, key
    assert row["baseline_us"] is None and row["best_speedup"] == 1.0 and row["sequence"] == []
    assert "error" not in row
    assert all(c["status"] != "accepted" for c in row["tried"])


def test_the_outside_set_runs_through_the_same_search(suite, tmp_path: Path, monkeypatch):
    """``--corpus benchmarks/outside``: the kernels from outside the corpus, read from their own folder."""
    monkeypatch.setattr(suite, "CORPUS", suite.CORPUS)
    monkeypatch.setattr(suite.corpus_baseline, "CORPUS", suite.corpus_baseline.CORPUS)
    out = tmp_path / "outside.json"
    assert suite.main(["--corpus", str(ROOT / "benchmarks" / "outside"), "--dry-run", "--only", "parboil_spmv_jds",
                       "--budget", "8", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["kernels"]
    assert row["name"] == "parboil_spmv_jds" and "error" not in row
    assert "rule:load-batch[batch=4]" in [c["generator"] for c in row["tried"]]


def test_skip_leaves_out_the_kernels_a_results_file_has(suite, tmp_path: Path):
    """A call cut off by its time limit is continued with ``--skip`` its results: only the kernels it did not reach run."""
    first, second = suite.select(suite.entries(None), True)[:2]
    done = tmp_path / "done.json"
    done.write_text(json.dumps({"kernels": [{"name": first}]}))
    out = tmp_path / "rest.json"
    assert suite.main(["--dry-run", "--only", f"{first},{second}", "--budget", "1", "--skip", str(done),
                       "--out", str(out)]) == 0
    assert [r["name"] for r in json.loads(out.read_text())["kernels"]] == [second]

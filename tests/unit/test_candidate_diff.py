"""``benchmarks/candidate_diff.py``'s replay: which candidates the search reaches within its budget when
each verdict is what the recorded GPU runs said (a winner that is still listed but no longer reached is a
change to check on the GPU)."""

from __future__ import annotations

import json

import pytest

import script_module


@pytest.fixture(scope="module")
def diff():
    return script_module.load("benchmarks/candidate_diff.py")


def _c(generator, after=None, after_correct=False):
    return {"generator": generator, "after": after, "after_correct": after_correct}


def test_a_sequence_is_reached_only_after_its_first_step(diff):
    listed = [_c("rule:a"), _c("rule:a+b", "rule:a"), _c("rule:a+c", "rule:a", True), _c("rule:d"), _c("rule:e")]
    # a accepted: both followers run; a correct and not faster: only the one it makes possible; a wrong: neither.
    assert diff.replay(listed, {"rule:a": "accepted"}) == ["rule:a", "rule:a+b", "rule:a+c", "rule:d", "rule:e"]
    assert diff.replay(listed, {"rule:a": "slower"}) == ["rule:a", "rule:a+c", "rule:d", "rule:e"]
    assert diff.replay(listed, {}) == ["rule:a", "rule:d", "rule:e"]


def test_the_budget_cuts_the_list(diff):
    listed = [_c(f"rule:r{k}") for k in range(10)] + [_c("rule:winner")]
    assert "rule:winner" not in diff.replay(listed, {"rule:winner": "accepted"})
    assert diff.replay(listed, {}, budget=3) == ["rule:r0", "rule:r1", "rule:r2"]


def test_compare_flags_a_winner_pushed_past_the_budget(diff, tmp_path):
    name, speeds = next(iter(diff._recorded()[0].items()))
    winner = max(speeds, key=speeds.get)
    won = {"generator": winner, "technique": "t", "sha": "w", "after": None, "launch": None, "grid_scale": None,
           "block": None, "grid_divide": None}
    others = [dict(won, generator=f"rule:other{k}", sha=f"o{k}") for k in range(diff.REPLAY_BUDGET)]
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    diff.write_json(before, {"commit": None, "kernels": [{"name": name, "candidates": [won, *others]}]})
    diff.write_json(after, {"commit": None, "kernels": [{"name": name, "candidates": [*others, won]}]})
    out = tmp_path / "cmp.json"
    assert diff.main(["compare", str(before), str(after), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    (row,) = [r for r in result["kernels"] if r["name"] == name]
    assert row["winner_now"] == f"identical, but not within the first {diff.REPLAY_BUDGET} tries any more"
    assert name in result["summary"]["winners_needing_gpu_check"]
    assert row["renamed"] == []

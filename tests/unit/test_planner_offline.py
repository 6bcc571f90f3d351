"""benchmarks/planner_offline.py's scoring: a first choice gets its entry's recorded speedup, compared with
the rules' first entry only where both are known."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import planner_offline  # noqa: E402


def _row(first: str, recorded: dict, voted: bool = True) -> dict:
    menu = list(recorded)
    best = max(menu, key=lambda e: recorded[e] or 0.0)
    return {"menu": menu, "best": best, "recorded": recorded, "first": first, "voted": voted,
            "wall_s": 2.0, "tokens": 100}


def test_first_choices_are_scored_beside_the_rules_order_on_the_rows_where_both_are_known() -> None:
    rows = [
        _row("b", {"a": 1.0, "b": 4.0}),             # the model finds the best, the rules' first is no gain
        _row("a", {"a": 2.0, "b": 1.0}),             # both take the rules' first, the best
        _row("c", {"a": 1.5, "b": 3.0, "c": None}),  # the model's choice never ran: not compared
        _row("b", {"a": None, "b": 2.0}, voted=False),  # the rules' first never ran: not compared
    ]
    s = planner_offline.summary(rows)
    assert s["rows"] == 4 and s["rows_compared"] == 2
    assert s["best_share"] == 0.5 + 0.25 and s["rules_first_best_share"] == 0.25
    assert s["geomean_first"] == pytest.approx((4.0 * 2.0) ** 0.5)
    assert s["geomean_rules_first"] == pytest.approx((1.0 * 2.0) ** 0.5)
    assert s["geomean_best"] == pytest.approx((4.0 * 2.0) ** 0.5)
    assert s["voted_share"] == 0.75 and s["seconds_per_row"] == 2.0


def test_no_rows_is_no_figures() -> None:
    s = planner_offline.summary([])
    assert s["rows"] == 0 and s["geomean_first"] is None and s["best_share"] is None

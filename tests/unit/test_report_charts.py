"""The report's charts on every recorded H200 full profile (``tests/fixtures/ncu/dataset``): what the legend
names is drawn; the charts are drawn once (the history twice, cropped to its labels) and without mathtext,
what made a page cost about a second; and the report module knows nothing of sweeps (the sweep's page is
drawn with its helpers, one import direction)."""

from __future__ import annotations

import ast
import gzip
import math
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_lsp.core.kb_logic import Attempt
from kernel_lsp.core.report_model import build_report, roofline
from kernel_lsp.services import report
from kernel_lsp.services.ncu_reader import parse_raw_csv, to_profiles

ROOT = Path(__file__).resolve().parents[2]
DATASET = ROOT / "tests" / "fixtures" / "ncu" / "dataset"


def _profiles():
    found = {}
    for path in sorted(DATASET.glob("*_full.csv.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for profile in to_profiles(parse_raw_csv(f.read())):
                found.setdefault(profile.kernel, profile)
    return found


PROFILES = _profiles()
ROOFS = {kernel: roof for kernel, p in PROFILES.items() if (roof := roofline(p.metrics)) is not None}


def test_the_dataset_has_rooflines_with_and_without_fp32_work():
    # Both cases below are exercised: kernels placed on the roofline and kernels doing no FP32 work.
    assert sum(r.achieved_flop_per_s > 0 for r in ROOFS.values()) >= 5
    assert sum(r.achieved_flop_per_s <= 0 for r in ROOFS.values()) >= 3


@pytest.mark.parametrize("kernel", sorted(ROOFS))
def test_every_legend_entry_of_a_roofline_is_drawn_inside_the_axes(kernel):
    from matplotlib.collections import PathCollection

    roof = ROOFS[kernel]
    fig = report.roofline_figure(kernel, roof)
    [ax] = fig.axes
    handles, labels = ax.get_legend_handles_labels()
    (x_low, x_high), (y_low, y_high) = ax.get_xlim(), ax.get_ylim()
    points = [h for h in handles if isinstance(h, PathCollection)]
    for point in points:
        for x, y in point.get_offsets():
            assert math.isfinite(x) and math.isfinite(y) and x > 0 and y > 0, (kernel, x, y)
            assert x_low <= x <= x_high and y_low <= y <= y_high, (kernel, x, y)
    if roof.achieved_flop_per_s > 0:
        assert len(points) == 1 and any(label.startswith(f"{kernel}: ") for label in labels)
    else:
        # No FP32 work: no point, so no legend marker for the kernel; the chart says why in words.
        assert points == [] and not any(kernel in label for label in labels)
        assert any("does no FP32 work: no point on this roofline" in t.get_text() for t in ax.texts)


def test_a_page_draws_its_charts_once_without_mathtext(monkeypatch):
    from matplotlib import mathtext
    from matplotlib.figure import Figure

    kernel = "z_reduce"
    attempts = [Attempt(kernel_hash="k", file="/zoo.cu", kernel=kernel, state="s", technique=t, candidate_hash=t,
                        verdict=v, accepted=a, speedup=s, generator="rule:test", created_at=None)
                for t, s, a, v in (("warp-shuffle-reduction", 1.8, True, "accepted"), ("unroll", None, False, "mismatch"))]
    page_report = build_report(kernel, "/zoo.cu", PROFILES[kernel], attempts)
    assert page_report.roofline is not None and page_report.stalls_pct and page_report.history
    draws, parses = [], []
    real_draw, real_parse = Figure.draw, mathtext.MathTextParser.parse
    monkeypatch.setattr(Figure, "draw", lambda self, renderer: draws.append(self) or real_draw(self, renderer))
    monkeypatch.setattr(mathtext.MathTextParser, "parse",
                        lambda self, s, *a, **k: parses.append(s) or real_parse(self, s, *a, **k))
    page = report.kernel_page(page_report)
    assert page.count("<svg") == 3
    # Three charts, one drawing pass each; the history's second pass crops it to its labels (technique names).
    assert len(draws) == 4 and len(set(map(id, draws))) == 3
    assert [draws.count(fig) for fig in dict.fromkeys(draws)] == [1, 1, 2]
    assert parses == []
    assert "10⁻¹" in page or "10⁰" in page  # the log axes' decades, as plain text


def test_decade_labels_are_plain_text():
    assert [report.decade_label(v) for v in (1e-3, 1.0, 10.0, 1e14, 3e4)] == ["10⁻³", "10⁰", "10¹", "10¹⁴", ""]


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_report_and_sweep_import_in_one_direction():
    services = ROOT / "kernel_lsp" / "services"
    assert not any(name.startswith("kernel_lsp.services.sweep") for name in _imports(services / "report.py"))
    assert "kernel_lsp.services.report" in _imports(services / "sweep.py")
    loaded = subprocess.run([sys.executable, "-c", "import sys, kernel_lsp.services.report; "
                             "print('kernel_lsp.services.sweep' in sys.modules)"],
                            capture_output=True, text=True, check=True, cwd=ROOT)
    assert loaded.stdout.strip() == "False"

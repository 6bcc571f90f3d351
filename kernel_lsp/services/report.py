"""The HTML profile report: one page per kernel, charts drawn with matplotlib and embedded as SVG.

:func:`write_reports` is what ``kernel-lsp report`` runs and what an editor command (a code
lens "Open profile report") can call: it finds each kernel's profile (given, or the profile
store's last good one), its attempts in the knowledge base, builds the pure model
(:mod:`kernel_lsp.core.report_model`) and writes ``<out>/<kernel>.html`` plus ``index.html``.
Pages are self-contained (inline SVG and CSS, no scripts, nothing fetched), so they open from
disk in any browser. The sweep's page (:mod:`kernel_lsp.services.sweep`) is drawn with this module's
:func:`figure`, :func:`svg` and :func:`html_page`; nothing here knows of sweeps.
"""

from __future__ import annotations

import html
import io
import logging
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel_lsp.core.index import build_index
from kernel_lsp.core.kb_logic import Attempt
from kernel_lsp.core.profile import KernelProfile
from kernel_lsp.core.report_model import KernelReport, Roofline, build_report

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReportResult:
    index_path: Path
    pages: Mapping[str, Path]
    """Kernel name -> its page."""
    messages: tuple[str, ...] = ()


# Charts are drawn once each, on fixed margins: ``bbox_inches="tight"`` draws a figure twice (once to
# measure it), and matplotlib's default log-axis labels are mathtext (``$10^{3}$``, parsed by pyparsing per
# label) with eight minor ticks per decade; together they made a kernel's page cost about 1.2 s.
_SUPERSCRIPT = str.maketrans("-0123456789", "\u207b\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079")


def figure(width_in: float, height_in: float, *, left_in: float, right_in: float = 0.25, bottom_in: float,
           top_in: float = 0.45) -> tuple[Any, Any]:
    """A figure with one axes and fixed margins in inches (no pyplot: nothing global is kept per figure)."""
    # Imported on first use: matplotlib costs about a second to import.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in))
    fig.subplots_adjust(left=left_in / width_in, right=1 - right_in / width_in,
                        bottom=bottom_in / height_in, top=1 - top_in / height_in)
    return fig, fig.add_subplot()


def svg(fig: Any, *, tight: bool = False) -> str:
    """The figure as SVG to inline in HTML (the XML prologue and DOCTYPE are not allowed there).

    ``tight``: crop to what is drawn (a second drawing pass), for a chart whose labels' lengths no margin
    can foresee."""
    import matplotlib

    buffer = io.StringIO()
    # Text as SVG text, not as glyph outlines: a third of the size and of the drawing time, and selectable.
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buffer, format="svg", bbox_inches="tight" if tight else None)
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def decade_label(value: float, _position: Any = None) -> str:
    """``10⁶`` for a power of ten (plain text with Unicode superscripts, no mathtext)."""
    exponent = math.log10(value) if value > 0 else math.nan
    return "10" + str(round(exponent)).translate(_SUPERSCRIPT) if abs(exponent - round(exponent)) < 1e-9 else ""


def _log_axes(ax: Any) -> None:
    from matplotlib.ticker import FuncFormatter, NullLocator

    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(FuncFormatter(decade_label))
        axis.set_minor_locator(NullLocator())


def roofline_figure(kernel: str, roof: Roofline) -> Any:
    """Log-log roofline: the DRAM and FP32 ceilings and, where the kernel has a place on it, its point, labelled.

    A kernel that does no FP32 work has no point (its FP32 rate is zero, off a log axis): the chart says so
    in words, and the legend names only what is drawn."""
    fig, ax = figure(7.0, 4.2, left_in=0.85, bottom_in=0.6)
    ridge = roof.ridge_flop_per_byte
    intensity = roof.intensity_flop_per_byte
    placed = roof.achieved_flop_per_s > 0
    centre = intensity if placed and intensity is not None else ridge
    low, high = min(ridge / 1000.0, centre / 10.0), max(ridge * 1000.0, centre * 10.0)
    xs = [low * (high / low) ** (i / 200) for i in range(201)]
    ax.plot(xs, [min(roof.peak_dram_bytes_per_s * x, roof.peak_flop_per_s) for x in xs], color="#1f4e79", lw=2,
            label=f"roofline: DRAM {roof.peak_dram_bytes_per_s / 1e12:.2f} TB/s, FP32 {roof.peak_flop_per_s / 1e12:.1f} TFLOP/s")
    ax.axvline(ridge, color="#999999", ls=":", lw=1)
    floor = roof.peak_flop_per_s * 1e-6
    if placed:
        if intensity is None:
            # No DRAM traffic: the data stayed in cache; the point sits at the right edge.
            x, note = high, "no DRAM traffic"
        else:
            x, note = intensity, f"{intensity:.3g} FLOP/B"
        y = max(roof.achieved_flop_per_s, floor)
        # Unclipped: a point on the edge (no DRAM traffic, or below the floor) is drawn whole.
        ax.scatter([x], [y], s=90, color="#c0392b", zorder=5, clip_on=False,
                   label=f"{kernel}: {roof.achieved_flop_per_s / 1e12:.3g} TFLOP/s")
        ax.annotate(note, (x, y), textcoords="offset points", xytext=(8, 8), fontsize=9)
    else:
        ax.text(0.03, 0.92, f"{kernel} does no FP32 work: no point on this roofline\n(DRAM at {roof.dram_pct:.0f}% of peak)",
                transform=ax.transAxes, fontsize=9, va="top")
    _log_axes(ax)
    ax.set_xlim(low, high)
    ax.set_ylim(floor, roof.peak_flop_per_s * 3)
    ax.set_xlabel("arithmetic intensity (FLOP per DRAM byte)")
    ax.set_ylabel("FP32 FLOP/s")
    where = f"{kernel} is {roof.bound}-bound here" if roof.bound else f"{kernel} does no FP32 work"
    ax.set_title(f"Roofline: {where} (FP32 {roof.compute_pct:.1f}% of peak, DRAM {roof.dram_pct:.1f}%)", fontsize=10)
    ax.grid(True, alpha=0.25)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def roofline_svg(kernel: str, roof: Roofline) -> str:
    return svg(roofline_figure(kernel, roof))


#: Room for the longest stall reason's label ("long scoreboard", "math pipe throttle") left of the bars.
_STALL_LABELS_IN = 1.45


def stalls_svg(stalls: Sequence[tuple[str, float]]) -> str:
    """Horizontal bars: each stall reason's share of warp stall cycles, largest on top."""
    fig, ax = figure(7.0, 0.35 * len(stalls) + 1.2, left_in=_STALL_LABELS_IN, bottom_in=0.55, top_in=0.35)
    reasons = [reason.replace("_", " ") for reason, _ in stalls][::-1]
    shares = [pct for _, pct in stalls][::-1]
    bars = ax.barh(reasons, shares, color="#2e86c1")
    ax.bar_label(bars, labels=[f"{s:.1f}%" for s in shares], padding=3, fontsize=8)
    ax.set_xlabel("share of warp stall cycles (%)")
    ax.set_xlim(0, max(shares) * 1.18)
    ax.set_title("Warp stall reasons", fontsize=10)
    return svg(fig)


def history_svg(report: KernelReport) -> str:
    """One bar per verified attempt: its speedup (failed ones at 0), accepted ones in green; 1x marked."""
    entries = report.history
    labels = [f"{i}. {h.technique}" for i, h in enumerate(entries, 1)]
    fig, ax = figure(7.0, 3.2, left_in=0.7, bottom_in=0.5, top_in=0.4)
    values = [h.speedup or 0.0 for h in entries]
    colours = ["#27ae60" if h.accepted else ("#bbbbbb" if h.speedup else "#e74c3c") for h in entries]
    bars = ax.bar(range(len(entries)), values, color=colours)
    ax.bar_label(bars, labels=[f"{v:.2f}x" if v else h.verdict for v, h in zip(values, entries)], fontsize=8, padding=2)
    ax.axhline(1.0, color="#555555", ls="--", lw=1)
    ax.set_xticks(range(len(entries)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("speedup (baseline / candidate)")
    ax.set_ylim(0, max([1.2, *values]) * 1.2)
    ax.set_title("Optimization history (green: accepted, grey: correct but not faster, red: failed)", fontsize=10)
    # Cropped to what is drawn: the technique names hang below the bars at 30 degrees, any length, the first
    # one left of the axes as far as it is long; no fixed margin fits them all.
    return svg(fig, tight=True)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #222; background: #fff; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
.facts { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1.2em; }
.note { color: #666; } table { border-collapse: collapse; } td, th { padding: 0.2em 0.8em; border-bottom: 1px solid #eee; text-align: left; }
.accepted { color: #1e8449; font-weight: 600; } svg { max-width: 100%; height: auto; }
"""


def html_page(title: str, body: str) -> str:
    """A self-contained page: the report's style inline, no scripts, nothing fetched."""
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style></head><body>\n{body}\n</body></html>\n")


def kernel_page(report: KernelReport) -> str:
    """The HTML page of one kernel (charts inline)."""
    esc = html.escape
    facts = [("file", esc(report.source_path))]
    if report.duration_us is not None:
        facts.append(("duration", f"{report.duration_us:.1f} µs"))
    if report.bottleneck:
        facts.append(("bottleneck", esc(report.bottleneck)))
    if report.best_speedup is not None:
        facts.append(("best verified speedup", f"{report.best_speedup:.2f}x"))
    if report.profile_note:
        facts.append(("profile", esc(report.profile_note) + (" (stale)" if report.stale else "")))
    parts = [f"<h1>Profile report: <code>{esc(report.kernel)}</code></h1>",
             "<div class=\"facts\">" + "".join(f"<b>{k}</b><span>{v}</span>" for k, v in facts) + "</div>"]
    parts.append("<h2>Roofline</h2>")
    if report.roofline is not None:
        parts.append(f"<figure id=\"roofline\">{roofline_svg(report.kernel, report.roofline)}</figure>")
    elif report.duration_us is not None:
        parts.append("<p class=\"note\">This profile has no roofline metrics; <code>kernel-lsp profile --full</code> collects them.</p>")
    else:
        parts.append("<p class=\"note\">No profile yet: save the file with a launch spec on a machine with a GPU, "
                     "or run <code>kernel-lsp profile FILE.cu --spec SPEC.json --full</code>.</p>")
    parts.append("<h2>Stall reasons</h2>")
    if report.stalls_pct:
        parts.append(f"<figure id=\"stalls\">{stalls_svg(report.stalls_pct)}</figure>")
    else:
        parts.append("<p class=\"note\">No warp-state metrics in this profile.</p>")
    parts.append("<h2>Optimization history</h2>")
    if report.history:
        parts.append(f"<figure id=\"history\">{history_svg(report)}</figure>")
        rows = "".join(
            f"<tr><td>{i}</td><td>{esc(h.technique)}</td><td>{esc(h.generator)}</td>"
            f"<td class=\"{'accepted' if h.accepted else ''}\">{esc(h.verdict)}</td>"
            f"<td>{'' if h.speedup is None else f'{h.speedup:.2f}x'}</td><td>{esc(h.created_at or '')}</td></tr>"
            for i, h in enumerate(report.history, 1))
        parts.append("<table><tr><th>#</th><th>technique</th><th>from</th><th>verdict</th><th>speedup</th><th>when</th></tr>"
                     f"{rows}</table>")
    else:
        parts.append("<p class=\"note\">No verified attempts yet (\"Optimize\" in the editor, or <code>kernel-lsp optimize</code>).</p>")
    return html_page(f"kernel-lsp: {report.kernel}", "\n".join(parts))


def index_page(source_path: str, reports: Sequence[KernelReport], pages: Mapping[str, Path]) -> str:
    esc = html.escape
    rows = "".join(
        f"<tr><td><a href=\"{esc(pages[r.kernel].name)}\">{esc(r.kernel)}</a></td>"
        f"<td>{'' if r.duration_us is None else f'{r.duration_us:.1f} µs'}</td><td>{esc(r.bottleneck or r.profile_note or '')}</td>"
        f"<td>{'' if r.best_speedup is None else f'{r.best_speedup:.2f}x'}</td></tr>"
        for r in reports)
    body = (f"<h1>kernel-lsp report: <code>{esc(os.path.basename(source_path))}</code></h1>"
            "<table><tr><th>kernel</th><th>duration</th><th>bottleneck</th><th>best verified speedup</th></tr>"
            f"{rows}</table>")
    return html_page(f"kernel-lsp: {os.path.basename(source_path)}", body)


def page_name(kernel: str) -> str:
    """A file name for the kernel's page (template arguments and odd characters replaced)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", kernel).strip("_") + ".html"


def default_out_dir(source_path: str) -> str:
    """``<file>.report/`` beside the source."""
    return f"{source_path}.report"


def write_reports(source_path: str, source: str, out_dir: str | None = None, *,
                  kernels: Iterable[str] | None = None,
                  profiles: Mapping[str, KernelProfile] | None = None,
                  store: Any = None, attempts: Sequence[Attempt] = (),
                  profile_source: str | None = None) -> ReportResult:
    """Write one page per kernel of ``source`` (or of ``kernels``) and an index; return their paths.

    A kernel's profile is ``profiles[kernel]`` when given, else ``store.last_good(source_path,
    kernel)`` (a :class:`~kernel_lsp.services.profiler.ProfileStore`), else none (the page says so).
    ``attempts`` is the knowledge base's log (``KnowledgeBase.attempts()``).
    """
    path = os.path.abspath(source_path)
    names = list(kernels) if kernels is not None else list(dict.fromkeys(f.name for f in build_index(source).kernels))
    out = Path(out_dir or default_out_dir(path))
    out.mkdir(parents=True, exist_ok=True)
    reports: list[KernelReport] = []
    pages: dict[str, Path] = {}
    messages: list[str] = []
    for kernel in names:
        profile = (profiles or {}).get(kernel)
        note = profile_source if profile is not None else None
        if profile is None and store is not None:
            try:
                profile = store.last_good(path, kernel)
            except Exception as exc:  # an unreadable store entry: the page is made without a profile
                log.exception("profile store lookup for %s failed", kernel)
                messages.append(f"{kernel}: stored profile unreadable ({exc})")
            note = "last profile in the profile store" if profile is not None else None
        report = build_report(kernel, path, profile, attempts, note)
        page = out / page_name(kernel)
        page.write_text(kernel_page(report), encoding="utf-8")
        reports.append(report)
        pages[kernel] = page
        if profile is None:
            messages.append(f"{kernel}: no profile (the page shows the history only)")
    index = out / "index.html"
    index.write_text(index_page(path, reports, pages), encoding="utf-8")
    return ReportResult(index, pages, tuple(messages))


def intensity_text(roof: Roofline) -> str:
    """One line for terminals: where the kernel sits on the roofline."""
    intensity = roof.intensity_flop_per_byte
    where = "no DRAM traffic" if intensity is None else f"{intensity:.3g} FLOP/B (ridge {roof.ridge_flop_per_byte:.3g})"
    if roof.bound is None:
        return f"no FP32 work; DRAM {roof.dram_pct:.1f}% of peak"
    return (f"{roof.achieved_flop_per_s / 1e12:.3g} TFLOP/s at {where}: {roof.bound}-bound, "
            f"FP32 {roof.compute_pct:.1f}% of peak, DRAM {roof.dram_pct:.1f}%")

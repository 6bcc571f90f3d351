"""Text for people: a profile as Markdown (hover) and plain lines (CLI), and a tree as text.

Pure: profiles and trees in, strings out. The server wraps these strings in LSP
hover/diagnostic objects; the CLI prints them.
"""

from __future__ import annotations

from kernel_lsp.core.classify import Bottleneck
from kernel_lsp.core.profile import COLLECTOR_CUPTI, COLLECTOR_NCU, KernelProfile, LineCounters, Regression
from kernel_lsp.core.profiling_tree import Leaf, Tree


#: How the hover names what collected a profile (:attr:`KernelProfile.collector`).
COLLECTORS = {COLLECTOR_NCU: "Nsight Compute", COLLECTOR_CUPTI: "CUPTI"}


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} %"


def kernel_markdown(profile: KernelProfile, bottleneck: Bottleneck | None, message: str | None = None) -> str:
    """Hover section for a kernel: summary, bottleneck with its evidence, ncu's top advice."""
    tool = COLLECTORS.get(profile.collector or "")
    out = [f"**Profile** ({tool})" if tool else "**Profile**"]
    if profile.stale:
        out.append(f"*stale: the last profiling attempt failed ({profile.stale_reason or message or 'unknown'})*")
    duration = "n/a" if profile.duration_us is None else f"{profile.duration_us:.1f} µs"
    out.append(
        f"duration {duration} · memory {_pct(profile.memory_throughput_pct)} · "
        f"compute {_pct(profile.compute_throughput_pct)} · occupancy {_pct(profile.achieved_occupancy_pct)}"
    )
    if bottleneck is not None:
        out.append(f"**Bottleneck:** {bottleneck.summary}")
        for evidence in bottleneck.evidence[:3]:
            out.append(f"- {evidence.text()}")
    top = profile.top_rule
    if top is not None:
        speedup = f" (estimated speedup {top.estimated_speedup_pct:.0f} %)" if top.estimated_speedup_pct else ""
        out.append(f"**ncu advice — {top.title}**{speedup}: {top.message}")
    hot = profile.hottest_lines(3)
    if hot:
        out.append("Hottest lines: " + ", ".join(f"{c.line} ({_share(c, profile)})" for c in hot))
    elif not profile.lines:
        out.append("*No per-line counters in this profile (the profiling tree leaves them out): set "
                   "`profileLineCounters` for line hovers on every save, or run `kernel-lsp profile --full`.*")
    if profile.tree_leaf:
        out.append(f"*collected: {', '.join(profile.sections) or 'n/a'} (tree leaf `{profile.tree_leaf}`)*")
    return "\n\n".join(out)


def _share(counters: LineCounters, profile: KernelProfile) -> str:
    total = sum(c.samples_total or 0.0 for c in profile.lines.values())
    if not total or not counters.samples_total:
        return "n/a"
    return f"{100.0 * counters.samples_total / total:.0f} % of samples"


def line_markdown(counters: LineCounters, profile: KernelProfile) -> str:
    """Hover section for one source line inside a profiled kernel."""
    out = [f"**Line {counters.line}** ({_share(counters, profile)})"]
    if counters.stall_samples:
        total = sum(counters.stall_samples.values())
        top = sorted(counters.stall_samples.items(), key=lambda kv: -kv[1])[:4]
        out.append("stalls: " + ", ".join(f"{reason} {100.0 * n / total:.0f} %" for reason, n in top))
    for label, value in (
        ("excessive global sectors (uncoalesced)", counters.excessive_global_sectors),
        ("excessive shared wavefronts (bank conflicts)", counters.shared_excessive_wavefronts),
        ("divergent branches", counters.divergent_branches),
        ("instructions executed", counters.instructions_executed),
    ):
        if value:
            out.append(f"{label}: {value:,.0f}")
    return "\n\n".join(out)


def hot_line_message(counters: LineCounters, profile: KernelProfile) -> str:
    """One-line text for a hint diagnostic on a hot line."""
    parts = [f"hot line: {_share(counters, profile)}"]
    top = counters.top_stall
    if top is not None:
        parts.append(f"mostly {top[0].replace('_', ' ')} stalls")
    if counters.excessive_global_sectors:
        parts.append(f"{counters.excessive_global_sectors:,.0f} excessive global sectors")
    if counters.shared_excessive_wavefronts:
        parts.append(f"{counters.shared_excessive_wavefronts:,.0f} excessive shared wavefronts")
    return "; ".join(parts)


def regression_message(kernel: str, slower: Regression) -> str:
    return (
        f"{kernel} is slower than its previous profile: {slower.current_us:.1f} µs vs {slower.previous_us:.1f} µs "
        f"(+{slower.slowdown_pct:.1f} %, above the {slower.noise_pct:.1f} % noise)"
    )


def tree_text(tree: Tree) -> str:
    """The tree as indented text (``kernel-lsp tree show``)."""
    lines = [f"profiling tree '{tree.name}' (format version {tree.version})"]
    if tree.doc:
        lines.append(f"  {tree.doc}")
    budget = []
    if tree.max_passes is not None:
        budget.append(f"{tree.max_passes} passes")
    if tree.max_seconds is not None:
        budget.append(f"{tree.max_seconds:g} s")
    lines.append(f"first pass: {', '.join(tree.first_pass) or '(none)'}; budget: {', '.join(budget) or 'none'}")

    def visit(node_id: str, depth: int, label: str, seen: frozenset[str]) -> None:
        node = tree.node(node_id)
        pad = "  " * depth
        if isinstance(node, Leaf):
            what = ", ".join(node.collect + node.metrics) or "nothing more"
            ranks = "; the optimizer ranks by the source's state" if node.state_from == "source" else ""
            lines.append(f"{pad}{label}[{node.id}] collect: {what}{ranks}")
            if node.doc:
                lines.append(f"{pad}    # {node.doc}")
            return
        lines.append(f"{pad}{label}[{node.id}] {node.feature} {node.op} {node.threshold:g} ?")
        if node.doc:
            lines.append(f"{pad}    # {node.doc}")
        if node_id in seen:
            return
        visit(node.then, depth + 1, "yes: ", seen | {node_id})
        visit(node.else_, depth + 1, "no:  ", seen | {node_id})
        if node.missing and node.missing != node.else_:
            visit(node.missing, depth + 1, "unknown: ", seen | {node_id})

    visit(tree.root, 0, "", frozenset())
    return "\n".join(lines)

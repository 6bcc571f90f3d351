"""The host side of a rewrite that needs another launch: the ``k<<<grid, block>>>`` sites edited too.

A transformation that changes how many threads do the work (a warp per row: 32 times the blocks)
states it as a grid scale; the harness verified the kernel under the spec's launch scaled the same
way, and this module applies that scale to every launch of the kernel in the file, whatever the
grid is written as: ``dim3(dim3(G).x * 32, dim3(G).y, dim3(G).z)`` holds for an integer and for a
``dim3`` alike. Where the file has no launch of the kernel, the result says what the host must
change instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernel_lsp.core.index import build_index


@dataclass(frozen=True)
class HostLaunchEdit:
    source: str
    """The file with every launch of the kernel rescaled (unchanged when none was found)."""
    lines: tuple[int, ...]
    """1-based lines of the launches that were edited."""
    instruction: str | None
    """What the host must change by hand, when no launch was edited; None otherwise."""


def applied_source(candidate, original: str | None = None) -> HostLaunchEdit:  # noqa: ANN001 - core.candidates.Candidate
    """What "Apply" writes for a verified candidate: its source, with the launches rescaled when it needs it.
    With ``original`` (the file the user has now), ``lines`` are the launches' lines there."""
    if candidate.grid_scale is None:
        return HostLaunchEdit(candidate.source, (), None)
    edit = scale_launches(candidate.source, candidate.kernel, tuple(candidate.grid_scale))
    if original is not None and edit.lines:
        before = tuple(sorted(launch.span.start.line + 1 for launch in build_index(original).launches_of(candidate.kernel)))
        if len(before) == len(edit.lines):
            return HostLaunchEdit(edit.source, before, None)
    return edit


def scaled_grid(grid: str, scale: tuple[int, int, int]) -> str:
    g = grid.strip()
    parts = [f"dim3({g}).{axis}" + (f" * {k}" if k != 1 else "") for axis, k in zip("xyz", scale)]
    return f"dim3({', '.join(parts)})"


def scale_launches(source: str, kernel: str, scale: tuple[int, int, int]) -> HostLaunchEdit:
    """Every ``kernel<<<grid, …>>>`` of ``source`` launched with ``scale`` times the blocks per axis."""
    data = source.encode("utf-8")
    index = build_index(source)
    edits: list[tuple[int, int, str, int]] = []
    for launch in index.launches_of(kernel):
        start, end = launch.span.start_byte, launch.span.end_byte
        open_at = data.find(b"<<<", start, end)
        grid = launch.grid.encode("utf-8")
        at = data.find(grid, open_at + 3, end) if open_at >= 0 else -1
        if at < 0:
            continue
        edits.append((at, at + len(grid), scaled_grid(launch.grid, scale), launch.span.start.line + 1))
    if not edits:
        factors = " x ".join(str(k) for k in scale)
        return HostLaunchEdit(source, (), f"no launch of {kernel} in this file: launch it with {factors} times the "
                                           "blocks of the original grid (the block stays)")
    out = data
    for start, end, text, _ in sorted(edits, reverse=True):
        out = out[:start] + text.encode("utf-8") + out[end:]
    return HostLaunchEdit(out.decode("utf-8"), tuple(sorted(line for *_, line in edits)), None)

"""The host side of a rewrite that needs another launch: the ``k<<<grid, block>>>`` sites edited too.

A transformation that changes how many threads do the work (a warp per row: 32 times the blocks)
states it as a grid scale; the harness verified the kernel under the spec's launch scaled the same
way, and this module applies that scale to every launch of the kernel in the file, whatever the
grid is written as: ``dim3(dim3(G).x * 32, dim3(G).y, dim3(G).z)`` holds for an integer and for a
``dim3`` alike. A rewrite that launches the same threads in other blocks (smaller blocks over more
SMs, fuller 2-D blocks, another block size) names its block; the grid becomes
``(dim3(G).x * dim3(B).x + b - 1) / b`` per axis, in the host's own terms. A rewrite whose block serves several of the original blocks (a group of
32 neighbouring blocks as the lanes of one warp) names that many per axis as a grid division, with its
new block: the grid becomes ``dim3((dim3(G).x + k - 1) / k, …)`` and the block is replaced as written. Where the file has
no launch of the kernel, the result says what the host must change instead.
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
    divide = candidate.grid_divide
    if candidate.grid_scale is None and candidate.block is None and divide is None:
        return HostLaunchEdit(candidate.source, (), None)
    block = tuple(candidate.block) if candidate.block is not None else None
    edit = scale_launches(candidate.source, candidate.kernel, tuple(candidate.grid_scale or (1, 1, 1)), block,
                          tuple(divide) if divide is not None else None)
    if original is not None and edit.lines:
        before = tuple(sorted(launch.span.start.line + 1 for launch in build_index(original).launches_of(candidate.kernel)))
        if len(before) == len(edit.lines):
            return HostLaunchEdit(edit.source, before, None)
    return edit


def scaled_grid(grid: str, scale: tuple[int, int, int]) -> str:
    g = grid.strip()
    parts = [f"dim3({g}).{axis}" + (f" * {k}" if k != 1 else "") for axis, k in zip("xyz", scale)]
    return f"dim3({', '.join(parts)})"


def reshaped_grid(grid: str, block: str, new_block: tuple[int, int, int]) -> str:
    """The grid that keeps the threads per axis of ``<<<grid, block>>>`` in blocks of ``new_block``, rounded
    up: where the threads per axis are a multiple of the new block (smaller blocks, fuller blocks) that is
    exactly as many; where they are not (another block size over a guarded kernel), the last block's extra
    threads fail the guard, as in the launch the harness verified."""
    g, b = grid.strip(), block.strip()
    parts = [f"(dim3({g}).{axis} * dim3({b}).{axis} + {k - 1}) / {k}" if k != 1 else f"dim3({g}).{axis} * dim3({b}).{axis}"
             for axis, k in zip("xyz", new_block)]
    return f"dim3({', '.join(parts)})"


def divided_grid(grid: str, divide: tuple[int, int, int]) -> str:
    """The grid with one block for every ``divide`` blocks of ``grid`` per axis, rounded up (the last block
    of an axis serves the remainder; the rewrite guards the original blocks it does not have)."""
    g = grid.strip()
    parts = [f"(dim3({g}).{axis} + {k - 1}) / {k}" if k != 1 else f"dim3({g}).{axis}" for axis, k in zip("xyz", divide)]
    return f"dim3({', '.join(parts)})"


def scale_launches(source: str, kernel: str, scale: tuple[int, int, int],
                   block: tuple[int, int, int] | None = None,
                   divide: tuple[int, int, int] | None = None) -> HostLaunchEdit:
    """Every ``kernel<<<grid, …>>>`` of ``source`` launched with ``scale`` times the blocks per axis, and
    with ``block`` (when given) instead of its block, the grid grown to keep the threads per axis. With
    ``divide``, one block serves that many original blocks per axis: the grid is divided (rounded up)
    instead, and ``block`` replaces the host's block as it is."""
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
        if block is None and divide is None:
            edits.append((at, at + len(grid), scaled_grid(launch.grid, scale), launch.span.start.line + 1))
            continue
        old_block = launch.block.encode("utf-8")
        at_block = data.find(old_block, at + len(grid), end)
        if at_block < 0:
            continue
        if divide is not None:
            new_grid = divided_grid(launch.grid, divide)
            new_grid = new_grid if scale == (1, 1, 1) else scaled_grid(new_grid, scale)
            edits.append((at, at + len(grid), new_grid, launch.span.start.line + 1))
            if block is not None:
                edits.append((at_block, at_block + len(old_block), f"dim3({', '.join(str(k) for k in block)})",
                              launch.span.start.line + 1))
            continue
        new_grid = reshaped_grid(launch.grid, launch.block, block)
        new_grid = new_grid if scale == (1, 1, 1) else scaled_grid(new_grid, scale)
        edits.append((at, at + len(grid), new_grid, launch.span.start.line + 1))
        edits.append((at_block, at_block + len(old_block), f"dim3({', '.join(str(k) for k in block)})",
                      launch.span.start.line + 1))
    if not edits:
        factors = " x ".join(str(k) for k in scale)
        if divide is not None:
            per = " x ".join(str(k) for k in divide)
            return HostLaunchEdit(source, (), f"no launch of {kernel} in this file: launch one block for every {per} "
                                               "blocks of the original grid, rounded up"
                                               + (f", in blocks of {' x '.join(str(k) for k in block)} threads" if block else ""))
        if block is not None:
            return HostLaunchEdit(source, (), f"no launch of {kernel} in this file: launch it in blocks of "
                                               f"{' x '.join(str(k) for k in block)} threads, the grid grown to keep the "
                                               f"threads per axis" + (f", then {factors} times the blocks" if scale != (1, 1, 1) else ""))
        return HostLaunchEdit(source, (), f"no launch of {kernel} in this file: launch it with {factors} times the "
                                           "blocks of the original grid (the block stays)")
    out = data
    for start, end, text, _ in sorted(edits, reverse=True):
        out = out[:start] + text.encode("utf-8") + out[end:]
    return HostLaunchEdit(out.decode("utf-8"), tuple(sorted({line for *_, line in edits})), None)


def launch_bounds_for(source: str, function, threads: int) -> str | None:  # noqa: ANN001 - core.index.Function
    """``source`` with the kernel's ``__launch_bounds__`` made to allow a block of ``threads`` (its
    first argument set to it, the others kept): a rewrite that launches other blocks changes the
    bound with them. Unchanged when the kernel has none; None when its declaration is not found."""
    from kernel_lsp.core.analysis import parse_text

    if not function.launch_bounds:
        return source
    src, root = parse_text(source)
    at = function.name_span.start_byte
    node = root.descendant_for_byte_range(at, at)
    while node is not None and node.type != "function_definition":
        node = node.parent
    bounds = next((c for c in node.children if c.type == "launch_bounds"), None) if node is not None else None
    first = bounds.named_children[0] if bounds is not None and bounds.named_children else None
    if first is None:
        return None
    return (src[:first.start_byte] + str(threads).encode() + src[first.end_byte:]).decode("utf-8")

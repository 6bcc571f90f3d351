"""The preprocessed view and access analysis of a file on disk or in an editor buffer.

The core's :func:`~kernel_lsp.core.source.preprocess` is pure and reads headers only through a
callable; this module supplies one. A header is read only when it is a regular file under one
of the allowed folders (the file's own folder, the configured include paths and the workspace root) and smaller
than :data:`MAX_HEADER_BYTES`, so a workspace cannot make the analysis read ``/dev/zero`` or
a file outside it. Open editor buffers win over the disk, as they do for the compiler.

Every preprocessing run here has a :class:`~kernel_lsp.core.source.Budget`: the core's token limit
and a wall-time limit read from the clock here (:func:`timed_budget`), so a hostile file's macros
cost seconds at most, never the server's memory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kernel_lsp.core.analysis import KernelFacts, analyze
from kernel_lsp.core.source import Budget, Preprocessed, preprocess

MAX_HEADER_BYTES = 2_000_000
#: Wall time a macro view (a file's directive lines) or one index build's unit expansions may take, seconds.
MACRO_TIME_BUDGET_S = 2.0
#: Wall time the full preprocessed view may take: the base, plus this per line of the file (pcpp reads
#: ~5,000 plain lines a second on a loaded 2-core machine), up to :data:`MAX_FULL_VIEW_S`.
FULL_VIEW_S_PER_LINE = 0.001
MAX_FULL_VIEW_S = 30.0


def timed_budget(seconds: float = MACRO_TIME_BUDGET_S, give_way: Callable[[], None] | None = None) -> Budget:
    """The default token budget and a deadline ``seconds`` from now; ``give_way``: the run's yield point."""
    deadline = time.monotonic() + seconds
    return Budget(should_stop=lambda: time.monotonic() > deadline, give_way=give_way)


def full_view_budget(text: str, give_way: Callable[[], None] | None = None) -> Budget:
    """The budget of the full preprocessed view of ``text`` (it grows with the file)."""
    return timed_budget(min(MACRO_TIME_BUDGET_S + FULL_VIEW_S_PER_LINE * text.count("\n"), MAX_FULL_VIEW_S), give_way)


@dataclass(frozen=True)
class FileAnalysis:
    preprocessed: Preprocessed
    kernels: Mapping[str, KernelFacts]


def header_reader(allowed_dirs: tuple[str, ...], buffers: Mapping[str, str] | None = None) -> Callable[[str], str | None]:
    roots = tuple(os.path.realpath(d) for d in allowed_dirs if d)

    def read(path: str) -> str | None:
        if buffers is not None and path in buffers:
            return buffers[path]
        real = os.path.realpath(path)
        if not any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in roots):
            return None
        try:
            if not os.path.isfile(real) or os.path.getsize(real) > MAX_HEADER_BYTES:
                return None
            with open(real, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return None

    return read


def analyze_source(text: str, path: str | None, include_dirs: tuple[str, ...] = (),
                   defines: Mapping[str, str] | None = None, buffers: Mapping[str, str] | None = None,
                   workspace_root: str | None = None, give_way: Callable[[], None] | None = None) -> FileAnalysis:
    """Preprocess ``text`` (the file at ``path``, absolute) and analyse every kernel in it.

    Headers are read from the file's folder, the include folders and the workspace root (a
    project's ``#include "../common/sizes.h"`` is the project's own)."""
    folder = os.path.dirname(path) if path else ""
    absolute = os.path.abspath(path) if path else None
    reader = header_reader((folder, *include_dirs, *((workspace_root,) if workspace_root else ())), buffers)
    pre = preprocess(text, absolute, reader, tuple(include_dirs), defines, full_view_budget(text, give_way))
    return FileAnalysis(pre, analyze(pre))

"""How much work kernel-lsp takes on for one file: the budgets the server and ``kernel-lsp check`` share.

A file is served in part, with a message saying what is left out and why, when the work one feature
would do for it is past that feature's budget; no file makes the server stall or grow without bound.
The work is estimated from what is known before doing it: the file's size, and, once tree-sitter has
parsed it (about 1 s and 230 MB for 4.9 MB of small kernels), the number of top-level declarations the
index would analyse. Figures are from this project's 2-core test machine (issue 27's measurements,
``benchmarks/results/security_bounds.json``).

Pure: numbers in, a :class:`WorkBudget` out.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Source size above which a file is not parsed or indexed (compiler diagnostics only): a 50 MB file's
#: tree alone took gigabytes.
REDUCED_BYTES = 5 * 1024 * 1024
#: Top-level declarations above which a file is not indexed either: indexing is per declaration, and
#: 84,412 small kernels (4.9 MB) took 5.4 s and 320 MB to index.
MAX_INDEX_UNITS = 20_000
#: Source size above which the memory-access analysis does not run: it holds the GIL about 0.3 s per
#: 100 KB, and its preprocessed view of a 50 MB file grew past 8 GB.
MAX_ANALYSIS_BYTES = 1024 * 1024
#: Source size above which nvcc is not run at all: 4.9 MB of small kernels did not compile within the
#: default 60 s timeout, so a file over 16 MB would only keep a core busy until it is killed. The server
#: does not even read the text of such a document (a message over this size): decoding 50 MB of JSON held
#: the event loop 0.2 s, for a text nothing would be done with.
MAX_COMPILE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class WorkBudget:
    """Why each part of the work is left out for a file; None where it is done."""

    index: str | None = None
    """No kernel index (so no hovers, symbols, code lenses or profiles): reduced mode."""
    analysis: str | None = None
    """No memory-access analysis."""
    compile: str | None = None
    """No nvcc run."""

    @property
    def reduced(self) -> bool:
        return self.index is not None


def _mb(size_bytes: int) -> str:
    return f"{size_bytes / 2**20:.1f} MB"


def budget(size_bytes: int, units: int | None = None) -> WorkBudget:
    """The work done for a file of ``size_bytes`` bytes with ``units`` top-level declarations (None: not
    parsed yet, or not parsed because of its size)."""
    index = analysis = None
    if size_bytes > MAX_COMPILE_BYTES:
        refused = (f"is {_mb(size_bytes)} (over {MAX_COMPILE_BYTES >> 20} MB): not indexed, analysed or compiled "
                   "(nvcc did not finish 4.9 MB of small kernels within its default 60 s)")
        return WorkBudget(refused, refused, refused)
    if size_bytes > REDUCED_BYTES:
        index = (f"is {_mb(size_bytes)} (over {REDUCED_BYTES >> 20} MB): reduced mode, compiler diagnostics only "
                 "(no kernel index, hovers, symbols or profiles)")
    elif units is not None and units > MAX_INDEX_UNITS:
        index = (f"has {units:,} top-level declarations (over {MAX_INDEX_UNITS:,}): reduced mode, compiler "
                 "diagnostics only (no kernel index, hovers, symbols or profiles)")
    if index is not None:
        analysis = "is in reduced mode: no memory-access analysis"
    elif size_bytes > MAX_ANALYSIS_BYTES:
        analysis = f"is {_mb(size_bytes)} (over {MAX_ANALYSIS_BYTES >> 20} MB): no memory-access analysis"
    return WorkBudget(index, analysis)

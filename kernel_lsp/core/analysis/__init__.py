"""What a kernel means: every memory access, its index as a polynomial, loops and reductions.

The analysis reads the preprocessed view (:mod:`kernel_lsp.core.source`), so a body written as a
macro or split into ``__device__`` helpers is seen whole: helpers defined in the file are
inlined for analysis (up to :data:`_MAX_INLINE_DEPTH` deep), their pointer parameters bound to
the caller's arrays.

For every subscript of a pointer parameter, a local pointer into one, a ``__shared__`` array or
a local array it records an :class:`Access`: the array, read / write / update / atomic, and the
index as a :class:`~kernel_lsp.core.poly.Poly` over ``tid.*``, ``bid.*``, ``bdim.*``, ``gdim.*``,
scalar parameters and loop iteration counters. Anything it cannot model (a value loaded from
memory, a division by a variable, a variable assigned in a branch) becomes an opaque term that
remembers whether it depends on the thread index: a gather is reported as a gather, never
guessed as coalesced.

:func:`bind` then evaluates the accesses under a launch (a spec's block shape and scalar values):
for the 32 lanes of a warp it computes the addresses, hence the 32-byte sectors one request
touches, and names the pattern (coalesced, strided, broadcast, gather). Pure: no IO.

The package, by stage: :mod:`.syntax` (reading tree-sitter's tree), :mod:`.program` (what the file
defines around a kernel: struct layouts, function objects, type aliases, templates, constants),
:mod:`.walk` (the walk over a kernel's body that records the facts), :mod:`.facts` (the results),
:mod:`.binding` (the facts under a launch) and :mod:`.summaries` (kernel-level conclusions drawn
from the facts). Everything other modules use is importable from the package itself.
"""

from __future__ import annotations

from kernel_lsp.core.analysis.binding import (
    Binding, Pattern, _data_dependent, _data_term, bind, describe, evaluate, trip_count,
)
from kernel_lsp.core.analysis.facts import (
    Access, Barrier, Comparison, Condition, IndexUse, KernelFacts, LoopFact, Opaque, Reduction, WarpOperation, implied,
    thread_dependence,
)
from kernel_lsp.core.analysis.program import (
    Alias, Functor, alias_table, call_operators, redeclared_parameters,
)
from kernel_lsp.core.analysis.summaries import (
    block_strided_loops, global_index, grid_threads, helper_reading_thread_index, index_bound, outside_global_index,
    per_block_outputs, shared_combine_loops, split_block_base, stencil_offsets, summary, thread_mapping,
    threads_cooperate, threads_differ_only_by, value_range,
)
from kernel_lsp.core.analysis.syntax import (
    assigned_names, conditional_update, declared_anywhere, function_definitions, has_effects, has_node, identifiers_in, is_integer_type,
    is_pure_math,
    member_path, node_text, parse_text,
)
from kernel_lsp.core.analysis.walk import analyze

__all__ = [
    "Access", "Alias", "alias_table", "analyze", "assigned_names", "Barrier", "bind", "Binding",
    "block_strided_loops", "call_operators", "Comparison", "Condition", "conditional_update", "declared_anywhere",
    "describe", "evaluate", "function_definitions", "Functor", "global_index",
    "grid_threads", "has_effects", "has_node", "helper_reading_thread_index", "identifiers_in", "implied", "index_bound", "IndexUse",
    "is_integer_type", "is_pure_math", "KernelFacts", "LoopFact", "member_path", "node_text", "Opaque", "outside_global_index", "parse_text", "Pattern",
    "per_block_outputs", "redeclared_parameters", "Reduction", "shared_combine_loops", "split_block_base", "stencil_offsets", "summary",
    "thread_dependence", "thread_mapping", "threads_cooperate", "threads_differ_only_by", "trip_count", "value_range",
    "WarpOperation", "_data_dependent", "_data_term",
]

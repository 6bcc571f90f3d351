"""A knowledge-base state guessed from the source alone, for a kernel that has no profile yet.

The knowledge base matches states on a measured signature (:mod:`kernel_lsp.core.kb_logic`).
Before the first profile there is none, and the generic fallback state offers the same
techniques for every kernel (a transpose was offered "one-atomic-per-block"). The static
features (:mod:`kernel_lsp.core.features`) already say what the code does, so the rules
below map them to the catalogue state (``data/states.json``) whose techniques answer what
the code shows. The first rule that fires wins; each rule carries the reason that is shown
to the user. Pure: features in, a state name out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kernel_lsp.core.features import StaticFeatures


@dataclass(frozen=True)
class StaticState:
    state: str
    """A catalogue state name (``data/states.json``)."""
    why: str
    """What in the source chose it, in words."""


@dataclass(frozen=True)
class _Rule:
    state: str
    why: str
    fires: Callable[[StaticFeatures], bool]


def _global_atomics(f: StaticFeatures) -> int:
    return f.atomics - f.shared_atomics


# Order matters: the most specific evidence first. A 2-D kernel that loops over global
# loads without staging them in shared memory re-reads its inputs (the naive matmul), which
# tiling answers better than an index swap, so it precedes the uncoalesced-access rule.
_RULES: tuple[_Rule, ...] = (
    _Rule("memory-instruction-throttled", "atomics on global memory (every thread queues one)",
          lambda f: _global_atomics(f) > 0),
    _Rule("shared-bank-conflicts", "shared-memory accesses whose threadIdx.x stride shares a factor with the 32 banks",
          lambda f: f.shared_column_access > 0),
    _Rule("barrier-stalls", "a shared-memory reduction tree with barriers and no warp shuffles",
          lambda f: f.shared_tree_reduction and f.syncs > 0 and f.warp_shuffles == 0),
    _Rule("barrier-stalls", "shared memory exchanged between barriers, no warp shuffles",
          lambda f: f.shared_decls > 0 and f.syncs > 0 and f.warp_shuffles == 0),
    _Rule("cache-inefficient", "a 2-D kernel looping over global loads with no shared-memory staging",
          lambda f: f.uses_2d_index and f.loops > 0 and f.shared_decls == 0 and f.global_loads_per_thread_est > 1),
    _Rule("uncoalesced-access", "global accesses indexed by a multiple of threadIdx.x (or a transposed store)",
          lambda f: f.transposed_store or f.strided_global_loads > 0 or f.strided_global_stores > 0),
    _Rule("latency-bound", "loops over global memory without shared-memory staging",
          lambda f: f.loops > 0 and f.shared_decls == 0),
    _Rule("memory-bandwidth-saturated", "straight-line loads and stores of global memory",
          lambda f: f.loops == 0 and f.global_loads_per_thread_est + f.global_stores_per_thread_est > 0),
)


def static_state(features: StaticFeatures) -> StaticState | None:
    """The state the source suggests, or None when no rule fires (the knowledge base's fallback then)."""
    for rule in _RULES:
        if rule.fires(features):
            return StaticState(rule.state, rule.why)
    return None


def rule_states() -> tuple[str, ...]:
    """Every state a rule can name (tests check they exist in the catalogue)."""
    return tuple(rule.state for rule in _RULES)

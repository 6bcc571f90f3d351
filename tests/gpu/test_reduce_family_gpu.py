"""The reduction and atomic transformations' rewrites of the unit tests' kernels, verified by the harness on
the GPU: correctness at the spec's sizes, its variants and the sizes it does not name, module state
across launches (the last-block counter), no timing (``skip_timing``: the verdict is ``not_faster`` when
every check passed). Skipped cleanly without a GPU (tests/gpu/conftest.py).

Set ``REDUCE_RESULTS=FILE.json`` to keep each rewrite's verdict.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from kernel_lsp.core.rules import evaluate, rule_by_name
from kernel_lsp.core.spec import parse_spec, with_candidate_launch
from kernel_lsp.services.harness import VerifyOptions, verify

# The kernels are the unit tests' own (written as real code is: macros, helpers, templates, cooperative groups).
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "unit"))

import test_atomics as atomics  # noqa: E402
import test_block_reduce as block_reduce  # noqa: E402
import test_load_batch as load_batch  # noqa: E402
import test_transforms as transforms  # noqa: E402
import test_trees as trees  # noqa: E402
import test_warp_columns as warp_columns  # noqa: E402

pytestmark = pytest.mark.gpu

CASES = [
    ("tree-to-shuffle", "unrolled", trees.UNROLLED, trees.spec("block_sums")),
    ("tree-to-shuffle", "helper-tail", trees.HELPER_TAIL, trees.spec("block_sums")),
    ("tree-to-shuffle", "side-by-side", trees.SIDE_BY_SIDE, trees.spec("stats", outputs=3)),
    ("tree-to-shuffle", "last-slot", trees.LAST_SLOT, trees.spec("block_sums_last", outputs=2)),
    ("tree-coarsen", "macros", trees.COARSEN, trees.spec("block_sums")),
    ("tree-coarsen", "unrolled", trees.UNROLLED, trees.spec("block_sums")),
    ("tree-coarsen", "cooperative-groups", trees.CG_TREE, trees.spec("block_sums")),
    ("atomic-to-block-reduce", "stats", atomics.STATS, atomics.STATS_SPEC),
    ("atomic-to-block-reduce", "tree-then-tile", block_reduce.TREE_THEN_TILE,
     block_reduce.tree_then_tile_spec(({"n": 1000}, {"n": 77777}))),
    ("tree-to-shuffle", "under-a-block-uniform-if", block_reduce.UNDER_IF.replace("TEST", "blockIdx.x != gridDim.x - 1"),
     block_reduce.spec_of("partial", 256, [{"n": 1000}])),
    ("load-batch", "grid-stride", load_batch.NORMS, load_batch.NORMS_SPEC),
    ("load-batch", "while", load_batch.WHILE, load_batch.WHILE_SPEC),
    ("load-batch", "search", load_batch.SEARCH, load_batch.WHILE_SPEC),
    ("register-accumulate", "shared-slot", transforms.SHARED_SUM, transforms.SHARED_SUM_SPEC),
    ("warp-columns", "cooperative-groups", warp_columns.COLUMNS, warp_columns.SPEC),
    ("warp-columns", "shuffles", warp_columns.SHUFFLES, warp_columns.SPEC),
    ("warp-aggregate", "helpers", atomics.AGGREGATED, atomics.AGGREGATED_SPEC),
    *[("shared-privatize", f"{t}-{op}", *atomics.histo(t, op))
      for t, op in (("int", "atomicAdd"), ("u64", "atomicAdd"), ("float", "atomicAdd"), ("int", "atomicMin"))],
    *[("warp-aggregate", f"{t}-{op}", *atomics.histo(t, op)) for t, op in (("float", "atomicAdd"), ("unsigned int", "atomicMax"))],
]
_RESULTS: list[dict] = []


@pytest.fixture(scope="module", autouse=True)
def keep_results():
    yield
    out = os.environ.get("REDUCE_RESULTS")
    if out and _RESULTS:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(_RESULTS, f, indent=2)


@pytest.mark.parametrize("rule,name,source,spec_json", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_rewrites_are_correct_on_the_gpu(rule, name, source, spec_json):
    spec = parse_spec(spec_json)
    outcome = evaluate(source, spec.kernel, spec, [rule_by_name(rule)])[0]
    assert outcome.applicable, outcome.why
    for rw in outcome.rewrites:
        run_spec = with_candidate_launch(spec, rw.launch_override) if rw.launch_override else spec
        verdict = verify(source, rw.source, run_spec, VerifyOptions(skip_timing=True))
        _RESULTS.append({"rule": rule, "kernel": name, "variant": rw.variant, "reason": verdict.reason.value,
                         "errors": list(verdict.errors)[:3], "wall_s": round(verdict.wall_s, 1)})
        print(f"{rule}[{rw.variant}] on {name}: {verdict.summary()}")
        assert verdict.reason.value == "not_faster", f"{rule}[{rw.variant}] on {name}: {verdict.summary()}\n{verdict.errors}"

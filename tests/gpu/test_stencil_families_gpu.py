"""The stencil, under-filled, row and tiled families on the GPU: every rewrite of the unit tests' snippets through
the verification harness (correctness at the spec's sizes, at sizes it does not name, red zones, timing).

A rewrite may be slower than its original (the harness then says ``not_faster``); it may never be wrong. Set
``FAMILY_RESULTS=FILE.json`` to keep each verdict (reason, speedup and interval, wall time).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from kernel_lsp.core.rules import evaluate, rule_by_name
from kernel_lsp.core.spec import parse_spec, with_candidate_launch
from kernel_lsp.services.harness import VerifyOptions, verify

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

import test_load_batch as batch  # noqa: E402
import test_more_parallelism as more  # noqa: E402
import test_rules as rules  # noqa: E402
import test_split_reduction as split  # noqa: E402
import test_split_scan as scan  # noqa: E402
import test_store_forward as forward  # noqa: E402
import test_stencil_reuse as reuse  # noqa: E402
import test_stencil_window as window  # noqa: E402
import test_tiled_coarsen as tiled  # noqa: E402

#: (name, rule, source, spec): the snippets the unit tests run on the CPU, at sizes worth timing.
CASES = [
    ("conv2d-5x5", "stencil-shared-window", window.CONV2D, window.CONV2D_SPEC),
    ("conv1d-radius-param", "stencil-shared-window", window.CONV1D, window.CONV1D_SPEC),
    ("jacobi-cross", "stencil-shared-window", window.JACOBI, window.JACOBI_SPEC),
    ("heat-3d-block", "stencil-shared-window", window.HEAT3D, window.HEAT3D_SPEC),
    ("conv3-planes", "stencil-shared-window", window.PLANES, window.PLANES_SPEC),
    ("blur-tap-loops", "stencil-row-reuse", reuse.TAPS, {
        **reuse.spec("blur"), "params": [reuse.arr("in", "h*w"), reuse.arr("out", "h*w", "out"),
                                         {"name": "h", "scalar": "int32", "value": 4096},
                                         {"name": "w", "scalar": "int32", "value": 4096}],
        "grid": ["ceil_div(w,32)", "ceil_div(h,8)", 1], "variants": [{"h": 53, "w": 37}]}),
    ("tiled-matmul", "tiled-register-block", tiled.MATMUL, tiled.MATMUL_SPEC),
    ("lu-update", "tiled-register-block", tiled.LU, tiled.LU_SPEC),
    ("column-stats", "split-reduction", split.STATS, split.STATS_SPEC),
    ("row-filter", "store-forward", forward.FILTER, forward._spec()),
    ("row-blend-one-lane-tail", "warp-per-row", more.BLEND, more._blend_spec()),
    ("strided-scan-in-place", "load-batch", batch.SCAN, {**batch.SPEC, "variants": [{"count": 1001}]}),
    ("bucket-offsets-split-scan", "split-scan", scan.OFFSETS, scan._offsets_spec()),
    ("running-sum-split-scan", "split-scan", scan.RUNNING, scan._running_spec()),
    ("row-cumsum", "warp-per-row-scan", scan.CUMSUM, scan._cumsum_spec()),
    ("border-branch-rows", "stencil-row-reuse", reuse.BORDERS, {**reuse._borders_spec(), "variants": [{"n": 45}]}),
    ("copy-2d-block-shapes", "block-size", rules.COPY_2D, {
        **rules.SPEC_2D, "params": [*rules.SPEC_2D["params"][:2], {"name": "rows", "scalar": "int32", "value": 4096},
                                    {"name": "cols", "scalar": "int32", "value": 4096}],
        "variants": [{"rows": 45, "cols": 70}]}),
]
_RESULTS: list[dict] = []
WRONG = {"mismatch", "nan_or_inf", "input_modified", "nondeterministic", "out_of_bounds", "history_dependent",
         "timed_mismatch", "size_dependent", "sanitizer", "compile_error", "launch_error", "timeout", "signature_changed"}


@pytest.fixture(scope="module", autouse=True)
def keep_results():
    yield
    out = os.environ.get("FAMILY_RESULTS")
    if out and _RESULTS:
        Path(out).write_text(json.dumps(_RESULTS, indent=2), encoding="utf-8")


@pytest.mark.gpu
@pytest.mark.parametrize("name,rule,source,data", CASES, ids=[c[0] for c in CASES])
def test_every_rewrite_is_correct_on_the_gpu(name, rule, source, data):
    spec = parse_spec(data)
    found = evaluate(source, spec.kernel, spec, [rule_by_name(rule)])[0]
    assert found.applicable, found.why
    for rw in found.rewrites:
        run_spec = with_candidate_launch(spec, rw.launch_override) if rw.launch_override else spec
        verdict = verify(source, rw.source, run_spec, VerifyOptions())
        _RESULTS.append({"case": name, "rule": rule, "variant": rw.variant, "verdict": verdict.to_json()})
        print(f"{name} {rule}[{rw.variant}]: {verdict.summary()} ({verdict.wall_s:.1f} s)")
        assert verdict.reason.value not in WRONG, f"{verdict.summary()}\n{verdict.errors}"

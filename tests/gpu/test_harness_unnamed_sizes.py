"""Sizes the spec does not name, on the GPU: the tile transpose that needs multiples of 32, rejected at a
size the harness tries itself, and accepted, saying so, when the spec fixes both sizes.

Skipped cleanly without pycuda, nvcc or a CUDA device (tests/gpu/conftest.py).
"""

from __future__ import annotations

import json
import os

import pytest

from kernel_lsp.core.spec import parse_spec, with_candidate_launch
from kernel_lsp.core.verdict import Reason
from kernel_lsp.services.harness import VerifyOptions, verify

from test_harness_examples import ROOT  # tests/gpu is on sys.path (pytest's prepend import mode)

pytestmark = pytest.mark.gpu

ROUNDED_DOWN = {"grid": ["cols/32", "rows/32", "1"], "block": [32, 8, 1], "dynamic_smem": 0}


def _read(rel: str) -> str:
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def _spec(**extra):
    with open(os.path.join(ROOT, "transpose", "spec_main_only.json"), encoding="utf-8") as f:
        data = json.load(f)
    return with_candidate_launch(parse_spec({**data, **extra}), ROUNDED_DOWN)


def test_a_tile_without_edge_checks_is_rejected_at_a_size_the_harness_tries():
    verdict = verify(_read("transpose/original.cu"), _read("transpose/cheat_tile_no_edges.cu"), _spec(), VerifyOptions())
    assert verdict.reason is Reason.SIZE_DEPENDENT, verdict.summary()
    assert verdict.errors[0].startswith("rows = 8191 (a size the spec does not name") and "never written" in verdict.errors[0]
    # Timing ran before the sizes were tried: the cheat is fast at the spec's own size.
    assert verdict.timed_checks and verdict.wall_s < 10


def test_the_same_kernel_with_both_sizes_fixed_is_accepted_at_that_size_only():
    verdict = verify(_read("transpose/original.cu"), _read("transpose/cheat_tile_no_edges.cu"), _spec(fixed=["rows", "cols"]), VerifyOptions())
    assert verdict.accepted, verdict.summary()
    assert verdict.sizes_tried == () and verdict.fixed_sizes == {"rows": 8192, "cols": 8192}
    assert "(verified at rows = 8192, cols = 8192 only)" in verdict.summary()
    # The speedup shown is the series with the lower interval bound, of the two that both ran.
    assert verdict.redrawn_speedup is not None
    assert verdict.speedup_ci_low == min(verdict.unchanged_speedup[1], verdict.redrawn_speedup[1])

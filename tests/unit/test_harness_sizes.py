"""Sizes the spec does not name: which scalars are varied, to which values, the probes and what they catch.

The probes run on :class:`test_harness_protocol.NumpyBackend`; the kernels are numpy models of the CUDA
ones in ``examples/`` (float4 loads without a tail, a 32x32 tile without edge checks and a grid rounded
down, and their honest twins), each reading only its own arguments, as a kernel does.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from kernel_lsp.core.spec import SpecError, parse_spec
from kernel_lsp.services.harness.protocol import ORIGINAL, LaunchFailed, Verification
from kernel_lsp.services.harness.sizes import MAX_PROBES, plan_probes, probe_values, sizing_scalars
from test_harness_protocol import SPEC, NumpyBackend, axpy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: SPEC without variants: every size other than the spec's comes from the probes.
MAIN_ONLY = parse_spec({**SPEC.to_json(), "variants": []})


def _example_spec(name: str):
    return parse_spec(json.loads((EXAMPLES / name / "spec.json").read_text()))


@pytest.mark.parametrize("example, sizing", [
    ("gemv", ("rows", "cols")), ("histogram", ("n", "seg")), ("matmul", ("M", "N", "K")), ("transpose", ("rows", "cols")),
    ("reduction", ("n", "chunk")), ("spmv", ("rows", "cols", "k")), ("layernorm", ("rows", "cols")), ("streaming", ("n",)),
])
def test_the_scalars_that_size_arrays_or_the_grid(example, sizing):
    assert sizing_scalars(_example_spec(example)) == sizing


def test_a_scalar_in_a_block_expression_chooses_the_division_of_work_and_is_not_varied():
    spec = parse_spec({**SPEC.to_json(), "params": [*SPEC.to_json()["params"], {"name": "bs", "scalar": "int32", "value": 256}],
                       "grid": ["ceil_div(n,bs)", 1, 1], "block": ["bs", 1, 1], "variants": []})
    assert sizing_scalars(spec) == ("n",)


def test_probe_values():
    assert probe_values(8192) == (8191, 8189, 4097, 5)
    assert probe_values(4096) == (4095, 4093, 2049, 5)
    assert probe_values(7) == (6, 4, 3, 5)
    assert probe_values(4) == (3, 1)
    assert probe_values(1) == ()


def test_probes_go_one_dimension_at_a_time_and_re_evaluate_the_launch():
    plan = plan_probes(_example_spec("transpose"))
    assert [p.label for p in plan.probes] == ["rows = 8191", "cols = 8191", "rows = 8189", "cols = 8189", "rows = 4097", "cols = 4097",
                                              "rows = 5", "cols = 5"]
    rows = plan.probes[0]
    assert rows.values["cols"] == 8192 and rows.sizes == {"out": 8191 * 8192, "in": 8191 * 8192}
    # The original's grid ["(cols+31)/32", "(rows+7)/8"] and the candidate's ["(cols+31)/32", "(rows+31)/32"] at rows = 8191.
    assert rows.original.grid == (256, 1024, 1) and rows.candidate.grid == (256, 256, 1)
    # Float inputs past the probed size read as NaN, as past an allocation.
    assert rows.nan_tails == ("in",)


def test_values_the_spec_buffers_cannot_hold_are_not_tried():
    # hist has (n+seg-1)/seg*256 elements: a smaller seg means more segments than the spec's buffer holds.
    plan = plan_probes(_example_spec("histogram"))
    assert plan.untried == {"seg": (65535, 65533, 32769, 5)}
    assert [p.label for p in plan.probes] == ["n = 67108863", "n = 67108861", "n = 33554433", "n = 5"]
    assert plan.probes[-1].sizes["hist"] == 256


def test_index_arrays_drawn_for_the_spec_size_keep_real_values_past_the_probed_size():
    # colidx = csr_colidx(rows,cols,k) was drawn for the spec's cols: its indices may point past a smaller cols.
    plan = plan_probes(_example_spec("spmv"))
    assert all(p.nan_tails == () for p in plan.probes)
    gemv = plan_probes(_example_spec("gemv"))
    assert {p.label: p.nan_tails for p in gemv.probes}["cols = 8191"] == ("A", "x")


def test_probes_are_capped_keeping_the_nearest_values_of_every_scalar():
    params = [{"name": f"d{i}", "scalar": "int32", "value": 64} for i in range(6)]
    spec = parse_spec({"kernel": "k", "params": [*params, {"name": "y", "array": "float32", "size": "*".join(f"d{i}" for i in range(6)), "role": "out"}],
                       "grid": ["d0", 1, 1], "block": [32, 1, 1]})
    plan = plan_probes(spec)
    assert len(plan.probes) == MAX_PROBES and {p.value for p in plan.probes} == {63, 61, 33}
    assert len(plan.dropped) == 6 * 4 - MAX_PROBES


def test_fixed_scalars_are_not_varied():
    spec = parse_spec({**_example_spec("transpose").to_json(), "fixed": ["cols"]})
    plan = plan_probes(spec)
    assert plan.fixed == ("cols",) and plan.sizing == ("rows",) and {p.name for p in plan.probes} == {"rows"}
    assert parse_spec(spec.to_json()) == spec


@pytest.mark.parametrize("fixed, message", [
    ("cols", "expected a list of integer scalar names"),
    (["width"], "fixed[0]: 'width' is not an integer scalar parameter"),
    (["a"], "fixed[0]: 'a' is not an integer scalar parameter"),
    (["n", "n"], "fixed[1]: 'n' is listed twice"),
    ([3], "fixed[0]: 3 is not an integer scalar parameter"),
])
def test_a_bad_fixed_list_is_a_spec_error_naming_the_entry(fixed, message):
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_spec({**SPEC.to_json(), "fixed": fixed})


# --- the probes on the numpy device ---------------------------------------------------------------


def _probed(candidate, spec=MAIN_ONLY, original=axpy, **probe_options):
    backend = NumpyBackend(original, candidate)
    verification = Verification(backend, spec)
    outcome = verification.check([1, 2, 3])
    assert outcome.reason is None, outcome.errors
    return verification.probe(1, **probe_options), backend


def float4_no_tail(args, launch, backend):
    n, a, x, z = args
    m = n - n % 4
    z[:m] = a * x[:m]


def float4_with_tail(args, launch, backend):
    n, a, x, z = args
    m = n - n % 4
    z[:m] = (a * x[:m].reshape(-1, 4)).reshape(-1)
    z[m:n] = a * x[m:n]


def test_float4_loads_without_a_tail_are_size_dependent_and_their_twin_is_not():
    outcome, _ = _probed(float4_no_tail)
    assert outcome.reason == "size_dependent" and outcome.errors[0].startswith("n = 4095 (a size the spec does not name; its n = 4096)")
    assert "3 of 4096 elements never written (first at index 4092)" in outcome.errors[0]
    outcome, _ = _probed(float4_with_tail)
    assert outcome.reason is None and outcome.sizes_tried == ["n = 4095", "n = 4093", "n = 2049", "n = 5"]


TRANSPOSE = parse_spec({
    "kernel": "transpose",
    "params": [
        {"name": "out", "array": "float32", "size": "rows*cols", "role": "out"},
        {"name": "in", "array": "float32", "size": "rows*cols", "init": "uniform(-1,1)", "role": "in"},
        {"name": "rows", "scalar": "int32", "value": 256},
        {"name": "cols", "scalar": "int32", "value": 128},
    ],
    "grid": ["(cols+31)/32", "(rows+7)/8", "1"], "block": [32, 8, 1],
    "candidate": {"grid": ["(cols+31)/32", "(rows+31)/32", "1"], "block": [32, 8, 1]},
})


def transpose_naive(args, launch, backend):
    out, inp, rows, cols = args
    out[: rows * cols] = inp[: rows * cols].reshape(rows, cols).T.reshape(-1)


def tiled(edges):
    """A 32x32 tile per block of the grid it is launched with; without edge checks it moves whole tiles only."""

    def kernel(args, launch, backend):
        out, inp, rows, cols = args
        gx, gy, _ = launch.grid
        for by in range(gy):
            for bx in range(gx):
                r0, c0 = by * 32, bx * 32
                r1, c1 = (min(r0 + 32, rows), min(c0 + 32, cols)) if edges else (r0 + 32, c0 + 32)
                for r in range(r0, r1):
                    out[c0 * rows + r : c1 * rows + r : rows][: c1 - c0] = inp[r * cols + c0 : r * cols + c1]

    return kernel


def test_a_tile_without_edge_checks_on_a_grid_rounded_down_is_size_dependent():
    rounded_down = parse_spec({**TRANSPOSE.to_json(), "candidate": {"grid": ["cols/32", "rows/32", "1"], "block": [32, 8, 1]}})
    outcome, _ = _probed(tiled(edges=False), rounded_down, transpose_naive)
    assert outcome.reason == "size_dependent" and outcome.errors[0].startswith("rows = 255 (a size the spec does not name")
    assert "never written" in outcome.errors[0]
    outcome, _ = _probed(tiled(edges=True), TRANSPOSE, transpose_naive)
    assert outcome.reason is None and outcome.sizes_tried == ["rows = 255", "cols = 127", "rows = 253", "cols = 125", "rows = 129",
                                                              "cols = 65", "rows = 5", "cols = 5"]


def test_a_read_past_the_probed_size_shows_as_nan():
    def reads_one_past(args, launch, backend):
        n, a, x, z = args
        z[:n] = a * x[:n] + np.float32(0) * x[1 : n + 1] if n < x.size else a * x[:n]

    outcome, _ = _probed(reads_one_past)
    assert outcome.reason == "size_dependent" and "NaN/Inf where the original's are finite" in outcome.errors[0]


def test_a_write_past_the_probed_size_names_the_elements():
    def writes_a_float4_past(args, launch, backend):
        n, a, x, z = args
        m = -(-n // 4) * 4
        z[:m] = a * x[:m]

    outcome, _ = _probed(writes_a_float4_past)
    assert outcome.reason == "size_dependent"
    assert "'z' has 1 elements written from index 4095 on (first at z[4095])" in outcome.errors[0]


def test_an_input_changed_only_at_another_size_is_size_dependent():
    def scribbles(args, launch, backend):
        n, a, x, z = args
        axpy(args, launch)
        if n % 2:
            x[0] = 0

    outcome, _ = _probed(scribbles)
    assert outcome.reason == "size_dependent" and "'x' is an input" in outcome.errors[0]


def test_a_candidate_that_hangs_or_faults_at_another_size_is_rejected_for_that():
    def hangs_small(args, launch, backend):
        axpy(args, launch)
        return float("inf") if args[0] < 100 else None

    outcome, _ = _probed(hangs_small)
    assert outcome.reason == "timeout" and outcome.errors[0].startswith("n = 5") and outcome.abandoned

    def faults_odd(args, launch, backend):
        if args[0] % 2:
            raise LaunchFailed("an illegal memory access was encountered")
        axpy(args, launch)

    outcome, _ = _probed(faults_odd)
    assert outcome.reason == "launch_error" and "n = 4095" in outcome.errors[0] and "the original runs at this size" in outcome.errors[0]


def test_an_original_that_ignores_the_size_is_skipped_not_held_against_the_candidate():
    def hard_coded(args, launch, backend):
        n, a, x, z = args
        z[:] = a * x[: z.size]

    outcome, _ = _probed(axpy, original=hard_coded)
    assert outcome.reason is None and outcome.sizes_tried == []
    assert any("skipped, not held against the candidate: the original writes past the size" in w and "'z' has 1 elements" in w
               for w in outcome.warnings)


def test_an_original_that_disagrees_with_itself_at_another_size_is_skipped():
    def racy_when_odd(args, launch, backend):
        axpy(args, launch)
        if args[0] % 2:
            args[3][0] = backend.rng.standard_normal()

    def candidate(args, launch, backend):
        axpy(args, launch)

    outcome, _ = _probed(candidate, original=racy_when_odd)
    assert outcome.reason is None and outcome.sizes_tried == []
    assert sum("two runs of the original disagree" in w for w in outcome.warnings) == 4


def test_an_original_that_faults_at_another_size_ends_the_probes_with_a_warning():
    def faults_small(args, launch, backend):
        if args[0] < 100:
            raise LaunchFailed("an illegal memory access was encountered")
        axpy(args, launch)

    outcome, _ = _probed(axpy, original=faults_small)
    assert outcome.reason is None and outcome.sizes_tried == ["n = 4095", "n = 4093", "n = 2049"]
    assert any(w.startswith("n = 5") and "the original fails" in w and "no further sizes" in w for w in outcome.warnings)


def test_an_original_that_hangs_at_another_size_ends_the_probes_and_the_process():
    def hangs_small(args, launch, backend):
        axpy(args, launch)
        return float("inf") if args[0] < 100 else None

    outcome, _ = _probed(axpy, original=hangs_small)
    assert outcome.reason is None and outcome.abandoned and outcome.sizes_tried == ["n = 4095", "n = 4093", "n = 2049"]
    # The original's launches at other sizes get the allowance the candidate had at the spec's size, not minutes.
    assert any("did not finish within 1 s" in w for w in outcome.warnings)


def test_the_inputs_are_the_spec_size_ones_restored_after_every_probe():
    seen = []

    def recording(args, launch, backend):
        seen.append(args[2].copy())
        axpy(args, launch)

    backend = NumpyBackend(axpy, recording)
    verification = Verification(backend, MAIN_ONLY)
    verification.check([1])
    first = seen[0]
    start = len(seen)
    assert verification.probe(1).reason is None
    probed = seen[start:]
    assert len(probed) == 4
    for values, n in zip(probed, (4095, 4093, 2049, 5)):
        assert np.array_equal(values[:n], first[:n]) and np.isnan(values[n:]).all()
    main = verification.main
    x = next(a for a in main.arrays if a.param.name == "x")
    assert np.array_equal(backend.download(x.work), first) and np.array_equal(backend.download(x.pristine), first)


def test_probes_launch_the_original_once_and_the_candidate_once_when_they_match():
    backend = NumpyBackend(axpy, axpy)
    verification = Verification(backend, MAIN_ONLY)
    verification.check([1])
    before = len(backend.launches)
    verification.probe(1)
    launched = backend.launches[before:]
    assert [w for w, _, _, _ in launched] == [ORIGINAL, "candidate"] * 4
    assert [launch.grid for _, launch, _, _ in launched[::2]] == [(16, 1, 1), (16, 1, 1), (9, 1, 1), (1, 1, 1)]


def test_the_apply_title_says_which_sizes_were_the_only_ones_verified():
    from kernel_lsp.core.candidates import Candidate
    from kernel_lsp.core.verdict import Reason, Verdict
    from kernel_lsp.server.optimize_actions import apply_title
    from kernel_lsp.services.optimizer import CandidateResult

    def title(**fields):
        verdict = Verdict(accepted=True, reason=Reason.OK, speedup=2.5, speedup_ci_low=2.4, speedup_ci_high=2.6, **fields)
        candidate = Candidate("k", "", "tile-transpose", "rule:tile", "")
        return apply_title(CandidateResult(candidate, "h", verdict))

    assert title() == "Apply tile-transpose: 2.50x faster (verified)"
    assert title(fixed_sizes={"width": 8192}) == "Apply tile-transpose: 2.50x faster (verified at width = 8192 only)"
    assert title(fixed_sizes={"rows": 64, "cols": 96}) == "Apply tile-transpose: 2.50x faster (verified at rows = 64, cols = 96 only)"
    round_trip = Verdict(accepted=True, reason=Reason.OK, sizes_tried=("cols = 8191",), fixed_sizes={"rows": 8192})
    assert Verdict.from_json(json.loads(json.dumps(round_trip.to_json()))) == round_trip


def test_sizes_past_the_time_for_them_are_left_untried_with_a_warning():
    def slow_original(args, launch, backend):
        axpy(args, launch)
        return 1500.0

    def candidate(args, launch, backend):
        axpy(args, launch)
        return 1.0

    outcome, _ = _probed(candidate, original=slow_original, budget_s=3.5)
    # 1.5 s of the original per size: 4.5 s are spent once three sizes were tried, past the 3.5 s.
    assert outcome.reason is None and outcome.sizes_tried == ["n = 4095", "n = 4093", "n = 2049"]
    assert any("sizes not tried (the original's launches at other sizes took their 3.5 s): n = 5" in w for w in outcome.warnings)


def test_a_slow_candidate_cannot_choose_which_sizes_are_tried():
    def slow_candidate(args, launch, backend):
        axpy(args, launch)
        return 40.0

    outcome, _ = _probed(slow_candidate, budget_s=0.01)
    # The original's 1 ms launches spend the 10 ms only after every size; the candidate's 40 ms count for nothing.
    assert outcome.reason is None and len(outcome.sizes_tried) == 4

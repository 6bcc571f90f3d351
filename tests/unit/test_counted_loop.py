"""Counted loops however they are written (a ``for`` with or without an initializer, a ``while`` stepped by
one statement of its body): where their counter starts and steps, when its value is dead after the loop,
and the loop-splitting transformations run on the CPU against the original for each way of writing."""

from __future__ import annotations

import shutil

import pytest

from kernel_lsp.core.analysis import analyze, parse_text
from kernel_lsp.core.rules import evaluate, rule_by_name
from kernel_lsp.core.spec import parse_spec, with_candidate_launch
from kernel_lsp.core.transforms.counted_loop import counted_loop
from kernel_lsp.core.transforms.emit import node_at
from rule_specs import arr, scalar, spec_of


def _counted(source: str):
    facts = analyze(source)["k"]
    src, root = parse_text(source)
    loop = facts.loops[-1]
    found, why = counted_loop(loop, node_at(src, root, loop.span), facts.body_span, src)
    return found, why, src


def _kernel(body: str) -> str:
    return "__global__ void k(const float* a, float* out, int n, int m) {\n  int r = blockIdx.x;\n" + body + "\n}\n"


@pytest.mark.parametrize("body,start", [
    ("for (int j = 0; j < m; j++) out[r] += a[j];", "0"),
    ("int j = 2; for (; j < m; j++) out[r] += a[j];", None),
    ("int j = 2; while (j < m) { out[r] += a[j]; j++; }", None),
    ("int j; for (int t = 0; t < 4; t++) { j = t; while (j < m) { out[r] += a[j]; j += 1; } }", None),
    ("int j; for (j = 0; j < m; ++j) out[r] += a[j]; j = 5; out[r] += j;", "0"),
])
def test_the_counter_is_found_however_the_loop_is_written(body, start):
    found, why, src = _counted(_kernel(body))
    assert found is not None, why
    assert found.var == "j"
    assert (found.start is None and start is None) or src[found.start.start_byte:found.start.end_byte].decode() == start


@pytest.mark.parametrize("body,why", [
    ("int j = 0; for (; j < m; j++) out[r] += a[j]; out[r] = j;", "is read after it"),
    ("int j = 0; while (j < m) { out[r] += a[j]; j++; } out[r] += j;", "is read after it"),
    # Round an enclosing loop, the next entry starts where this one ended.
    ("int j = 0; for (int t = 0; t < 4; t++) { for (; j < m; j++) out[r] += a[j]; }", "is read after it"),
    ("int j = 0; for (int t = 0; t < 4; t++) { out[r] += j; for (j = 0; j < m; j++) out[r] += a[j]; }",
     "is read after it"),
    # A ``continue`` skips the step: the counter does not advance once per iteration.
    ("int j = 0; while (j < m) { if (a[j] > 0) continue; out[r] += a[j]; j++; }", "finds no counter"),
    ("int j = 0; while (j < m) { j++; out[r] += a[j]; }", "after stepping it"),
    ("int j = 0; do { out[r] += a[j]; j++; } while (j < m);", "do loop"),
])
def test_a_counter_whose_start_or_step_cannot_move_is_refused_with_the_fact(body, why):
    found, message, _ = _counted(_kernel(body))
    assert found is None and why in message, message


ROWSUM = """
__global__ void rowsum(const float* a, float* out, int n, int m) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < n) {
    float s = 0.0f;
    LOOP
    out[r] = s * 0.5f;
  }
}
"""
LOOPS = {
    "for": "for (int j = 0; j < m; j++) s += a[r * m + j];",
    "for without an initializer": "int j = 1; for (; j < m; ++j) s += a[r * m + j];",
    "while": "int j = 0; while (j < m) { s += a[r * m + j] * 2.0f; j += 1; }",
}
MAIN = r"""
int main() {
  const int n = 45, m = 77;
  std::vector<float> a(n * m), out(n);
  for (int i = 0; i < n * m; i++) a[i] = (float)((i * 13) % 17) - 8.0f;
  kl_launch({GX, GY, 1}, {BX, BY, 1}, [&] { rowsum(a.data(), out.data(), n, m); });
  for (float v : out) printf("%a\n", v);
}
"""


def _spec(rows: int) -> dict:
    return spec_of("rowsum", [arr("a", "n*m"), arr("out", "n", "out"), scalar("n", rows), scalar("m", 1024)],
                   ["ceil_div(n,64)", 1, 1], [64, 1, 1], [{"n": 45, "m": 77}])


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
@pytest.mark.parametrize("way", sorted(LOOPS))
@pytest.mark.parametrize("rule,rows", [("warp-per-row", 1 << 16), ("block-per-row", 1 << 16), ("split-loop", 64),
                                       ("split-reduction", 64)])
def test_a_split_loop_sums_each_row_as_the_original_does(way, rule, rows, tmp_path):
    from cpu_cuda import run_on_cpu

    source = ROWSUM.replace("LOOP", LOOPS[way])
    spec = _spec(rows)
    found = evaluate(source, "rowsum", parse_spec(spec), [rule_by_name(rule)])[0]
    assert found.applicable, found.why
    original = parse_spec(spec).resolve(0).original
    before = run_on_cpu(source, _main(original.grid, original.block), tmp_path, "before")
    for n, rewrite in enumerate(found.rewrites):
        launch = with_candidate_launch(parse_spec(spec), rewrite.launch_override).resolve(0).candidate
        after = run_on_cpu(rewrite.source, _main(launch.grid, launch.block), tmp_path, f"after{n}")
        sums, expected = _floats(after), _floats(before)
        # The partial sums add in another order: within float rounding of the original.
        assert len(sums) == len(expected) and all(abs(x - y) <= 1e-5 * max(1.0, abs(y)) for x, y in zip(sums, expected))


def _main(grid, block) -> str:
    return (MAIN.replace("GX", str(grid[0])).replace("GY", str(grid[1]))
            .replace("BX", str(block[0])).replace("BY", str(block[1])))


def _floats(out: str) -> list[float]:
    return [float.fromhex(v) for v in out.split()]


def test_a_rule_that_fails_is_a_refusal_and_the_other_rules_still_run():
    from kernel_lsp.core.rules.base import Rule

    class Broken(Rule):
        name = "broken"
        technique = "loop-unrolling"

        def check(self, ctx):
            return True, "applies"

        def rewrite(self, ctx):
            raise RuntimeError("no rewrite")

    source = ROWSUM.replace("LOOP", LOOPS["for"])
    outcomes = evaluate(source, "rowsum", parse_spec(_spec(1 << 16)), [Broken(), rule_by_name("warp-per-row")])
    assert not outcomes[0].applicable and "a defect in kernel-lsp: RuntimeError: no rewrite" in outcomes[0].why
    assert outcomes[1].applicable and outcomes[1].rewrites


@pytest.mark.parametrize("body,var,first", [
    ("for (i = 0; i < n; i++) s += a[i];", "i", True),
    ("t = a[j]; s += t;", "t", True),
    ("s += t; t = a[j];", "t", False),
    ("if (j > 2) t = a[j]; s += t;", "t", False),
    ("for (i = i; i < n; i++) s += a[i];", "i", False),
    ("s += a[j];", "t", False),
])
def test_a_name_set_before_it_is_read_in_every_run_of_a_body(body, var, first):
    from kernel_lsp.core.transforms.counted_loop import set_first

    src, root = parse_text(f"void f() {{ {body} }}")
    block = root.named_children[0].child_by_field_name("body")
    assert set_first(block, var, src) is first


# PolyBench-GPU covariance's shape: ``int i, j;`` declared at the top, the inner loop counted by ``for (i = 0; …)``.
OUTER_COUNTER = """
__global__ void k(const float* a, float* out, int n, int m) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  int i, j;
  if (r < m) {
    for (j = 0; j < n; j++) {
      float s = 0.0f;
      for (i = 0; i < 4; i++) s += a[(j * 4 + i) * m + r];
      out[j * m + r] = s;
    }
  }
}
"""


def test_an_inner_loops_counter_declared_further_out_is_not_carried():
    """PolyBench-GPU covariance declares ``int i, j2;`` at the top and counts the inner loop with ``for (i = 0; …)``:
    each iteration of the outer loop sets i before reading it."""
    source = OUTER_COUNTER
    spec = spec_of("k", [arr("a", "n*4*m"), arr("out", "n*m", "out"), scalar("n", 4096), scalar("m", 256)],
                   ["ceil_div(m,128)", 1, 1], [128, 1, 1])
    found = evaluate(source, "k", parse_spec(spec), [rule_by_name("split-reduction")])[0]
    assert "carries i" not in found.why, found.why
    read_after = source.replace("      out[j * m + r] = s;\n    }", "      out[j * m + r] = s;\n    }\n    out[r] += i;")
    found = evaluate(read_after, "k", parse_spec(spec), [rule_by_name("split-reduction")])[0]
    assert "carries i" in found.why, found.why


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
def test_the_split_outer_loop_with_an_outer_counter_gives_the_same_rows(tmp_path):
    from cpu_cuda import run_on_cpu

    source = OUTER_COUNTER
    spec = spec_of("k", [arr("a", "n*4*m"), arr("out", "n*m", "out"), scalar("n", 4096), scalar("m", 64)],
                   ["ceil_div(m,32)", 1, 1], [32, 1, 1], [{"n": 7, "m": 40}])
    found = evaluate(source, "k", parse_spec(spec), [rule_by_name("split-reduction")])[0]
    assert found.applicable, found.why
    rw = found.rewrites[0]
    launch = with_candidate_launch(parse_spec(spec), rw.launch_override).resolve(0).candidate
    main = r"""
int main() {
  const int n = 7, m = 40;
  std::vector<float> a(n * 4 * m), out(n * m, -1.0f);
  for (int t = 0; t < n * 4 * m; t++) a[t] = (float)((t * 13) % 17) / 4.0f;
  kl_launch({GRID, 1, 1}, {BX, BY, 1}, [&] { k(a.data(), out.data(), n, m); });
  for (int t = 0; t < n * m; t++) printf("%a\n", out[t]);
}
"""
    before = run_on_cpu(source, main.replace("GRID", "2").replace("BX", "32").replace("BY", "1"), tmp_path, "before")
    after = main.replace("GRID", str(launch.grid[0])).replace("BX", str(launch.block[0])).replace("BY", str(launch.block[1]))
    assert run_on_cpu(rw.source, after, tmp_path, "after") == before

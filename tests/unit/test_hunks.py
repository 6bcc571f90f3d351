"""Search/replace hunks as the model's editor and repairer send them."""

from __future__ import annotations

from kernel_lsp.core.hunks import Hunk, apply_hunks

KERNEL = """__global__ void scale(float *out, const float *in, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = a * in[i];
    }
}"""


def test_an_exact_hunk_replaces_its_text_once():
    result = apply_hunks(KERNEL, [Hunk("out[i] = a * in[i];", "out[i] = a * __ldg(&in[i]);")])
    assert result.applied == (1,) and result.failures == ()
    assert "out[i] = a * __ldg(&in[i]);" in result.text
    assert result.text.replace("__ldg(&in[i])", "in[i]") == KERNEL


def test_a_reindented_search_matches_line_by_line_and_keeps_the_kernels_indentation():
    search = "if (i < n) {\nout[i] = a * in[i];\n}"
    replace = "if (i < n) {\nout[i] = in[i] * a;\n}"
    result = apply_hunks(KERNEL, [Hunk(search, replace)])
    assert result.failures == ()
    assert "    if (i < n) {\n    out[i] = in[i] * a;\n    }\n}" in result.text


def test_a_replacement_with_its_own_indentation_is_kept_as_written():
    search = "  if (i < n) {\n      out[i] = a * in[i];\n  }"
    replace = "if (i < n) {\n        out[i] = in[i] * a;\n    }"
    result = apply_hunks(KERNEL, [Hunk(search, replace)])
    assert "    if (i < n) {\n        out[i] = in[i] * a;\n    }\n}" in result.text


def test_hunks_that_match_nowhere_or_twice_or_change_nothing_are_reported():
    result = apply_hunks(KERNEL, [
        Hunk("out[j]", "out[i]"),
        Hunk("i", "j"),
        Hunk("a * in[i]", "a * in[i]"),
        Hunk("  ", "x"),
        Hunk("int i =", "const int i ="),
    ])
    assert result.applied == (5,)
    reasons = {f.index: f.why for f in result.failures}
    assert "not found" in reasons[1]
    assert "more than once" in reasons[2]
    assert "changes nothing" in reasons[3]
    assert "empty" in reasons[4]
    assert result.text.startswith(KERNEL.split("int i =")[0]) and "const int i =" in result.text
    assert result.report().splitlines()[0].startswith("hunk 1: not found")


def test_hunks_apply_in_order_each_to_the_result_of_the_last():
    result = apply_hunks(KERNEL, [Hunk("a * in[i]", "a * v"), Hunk("out[i] = a * v;", "float v = in[i];\n        out[i] = a * v;")])
    assert result.applied == (1, 2)
    assert "float v = in[i];\n        out[i] = a * v;" in result.text

"""The preprocessed view: expansion of the file's own macros and local headers, and the line map."""

from __future__ import annotations

from kernel_lsp.core.source import Budget, blank_comments, expand_snippet, preprocess


def lines_of(pre):
    return [(line, pre.origin(i)) for i, line in enumerate(pre.text.split("\n")) if pre.origin(i) is not None]


def test_body_macro_expands_and_keeps_its_line():
    src = "#define BODY a[i] = b[i] + s * c[i];\n__global__ void k(float* a) {\n  BODY;\n}\n"
    pre = preprocess(src, "/w/k.cu")
    line = next(i for i, text in enumerate(pre.text.split("\n")) if "b[i] + s * c[i]" in text)
    assert pre.user_line(line) == 2
    assert pre.object_macros() == {"BODY": "a[i] = b[i] + s * c[i];"}


def test_multi_line_comments_keep_the_map_true():
    src = "#define H 16 // rows\n/* a\n   b\n*/ int a = H;\n// x\nint b = H * 2; /* y */ int c;\n"
    pre = preprocess(src, "/w/k.cu")
    found = {text.strip(): origin for text, origin in lines_of(pre) if text.strip()}
    assert found == {"int a = 16;": ("/w/k.cu", 3), "int b = 16 * 2;         int c;": ("/w/k.cu", 5)}


def test_local_header_expanded_system_header_passed_through():
    headers = {"/w/inc/common.cuh": "#pragma once\n#define BLOCK_SIZE 256\n__device__ int twice(int v) { return 2 * v; }\n"}
    src = '#include <cuda_runtime.h>\n#include "common.cuh"\n#include "missing.h"\nint n = BLOCK_SIZE;\n'
    pre = preprocess(src, "/w/k.cu", headers.get, include_dirs=("/w/inc",))
    assert pre.includes == ("/w/inc/common.cuh",)
    assert set(pre.passed_through) == {"cuda_runtime.h", "missing.h"}
    assert "int n = 256;" in pre.text
    helper_line = next(i for i, t in enumerate(pre.text.split("\n")) if "twice" in t)
    assert pre.origin(helper_line) == ("/w/inc/common.cuh", 2)
    assert pre.user_line(helper_line) is None


def test_command_line_defines_and_device_view():
    src = "#ifndef THREADS\n#define THREADS 64\n#endif\n#ifdef __CUDA_ARCH__\nint dev = THREADS;\n#else\nint host;\n#endif\n"
    pre = preprocess(src, "/w/k.cu", defines={"THREADS": "512"})
    assert "int dev = 512;" in pre.text and "int host" not in pre.text


def test_self_including_header_and_error_directives_do_not_stop_expansion():
    headers = {"/w/a.h": '#include "a.h"\n#define A 1\n'}
    src = '#include "a.h"\n#error stop here\nint x = A;\n'
    pre = preprocess(src, "/w/k.cu", headers.get)
    assert "int x = 1;" in pre.text
    assert any("#error stop here" in e for e in pre.errors)


def test_input_the_preprocessor_cannot_take_gives_the_raw_text_and_says_so():
    src = "#if\n#endif\nint x = A;\n"
    pre = preprocess(src, "/w/k.cu")
    assert pre.text == src
    assert pre.user_line(2) == 2
    assert any("preprocessing stopped" in e for e in pre.errors)


def test_comment_blanking_leaves_strings_alone():
    text = 'a = "// not /* a comment"; // gone\nb = \'/\'; /* gone\n too */ c;\n'
    out = blank_comments(text)
    assert out.count("\n") == text.count("\n") and len(out) == len(text)
    assert '"// not /* a comment"' in out and "'/'" in out and "gone" not in out and "c;" in out


# --- budget ---------------------------------------------------------------------------------------

def _doubling(levels: int, first: str = "x") -> str:
    """``#define A0 x`` ... ``#define A<levels> A<levels-1> A<levels-1>``: 2^levels tokens from one name."""
    return f"#define A0 {first}\n" + "".join(f"#define A{i} A{i - 1} A{i - 1}\n" for i in range(1, levels + 1))


def test_a_doubling_macro_in_a_directive_stops_at_the_token_budget_and_says_where():
    src = _doubling(40) + "#if A40\nint y;\n#endif\nint z;\n"
    pre = preprocess(src, "/w/k.cu", budget=Budget(tokens=20_000))
    assert pre.text == src and pre.macros == {}
    assert pre.over_budget is not None and "over 20,000 tokens (expanding A40)" in pre.over_budget
    # Where the use is (the #if, 0-based line 41), not where the macro was defined.
    assert pre.over_budget_at == ("/w/k.cu", 41)
    assert pre.over_budget in pre.errors


def test_the_time_budget_is_the_callers_clock():
    calls = []

    def stop() -> bool:
        calls.append(1)
        return len(calls) > 3

    pre = preprocess(_doubling(40) + "int v = A40;\n", "/w/k.cu", budget=Budget(should_stop=stop))
    assert pre.over_budget is not None and "time budget" in pre.over_budget
    assert len(calls) == 4


def test_an_ordinary_file_is_well_within_the_default_budget():
    src = "#define BODY(i) out[i] = a[i] + s * b[i];\n" + "".join(f"BODY({i})\n" for i in range(500))
    pre = preprocess(src, "/w/k.cu")
    assert pre.over_budget is None and "out[499] = a[499] + s * b[499];" in pre.text


def test_code_macros_are_those_whose_replacement_holds_code_also_through_another_macro():
    src = ("#define N 256\n#define IDX(i, j) ((i) * N + (j))\n#define BODY out[i] = a[i];\n"
           "#define GLOBAL __global__\n#define KERNEL GLOBAL void\n#define DEF(name) void name() {}\n"
           "#define GO(k) k<<<1, 32>>>(x)\n")
    assert preprocess(src, "/w/k.cu").code_macros == {"BODY", "GLOBAL", "KERNEL", "DEF", "GO"}


def test_a_snippet_expands_with_the_views_macros_and_keeps_its_lines():
    view = preprocess("#define BODY out[i] = a[i];\n#define K __global__ void\n", "/w/k.cu", defines={"S": "2"})
    snippet = expand_snippet(view, "K f(float *out) {\n  if (i < S) { BODY }\n}\n")
    lines = snippet.text.split("\n")
    found = {snippet.origins[i][1]: line for i, line in enumerate(lines) if snippet.origins[i] is not None and line}
    assert found == {0: "__global__ void f(float *out) {", 1: "  if (i < 2) { out[i] = a[i]; }", 2: "}"}
    bomb = preprocess(_doubling(30), "/w/k.cu")
    over = expand_snippet(bomb, "int v = A30;\n", Budget(tokens=1_000))
    assert over.text == "int v = A30;\n" and over.over_budget is not None

"""The index's macro pass: kernels that macros define or fill, read from their expansion, positions on
the user's text, syntax errors only where the expansion is wrong too."""

from __future__ import annotations

from pathlib import Path

from kernel_lsp.core.analysis import analyze
from kernel_lsp.core.index import IncrementalIndexer, build_index
from kernel_lsp.core.parse import ParsedDocument, comment_ranges
from kernel_lsp.core.source import Budget, directive_lines, preprocess

ZOO = Path(__file__).resolve().parents[1] / "fixtures" / "ncu" / "programs" / "zoo.cu"


def view_of(text: str, path: str = "/w/k.cu"):
    data = text.encode()
    return preprocess("".join(line + "\n" for line in directive_lines(data, comment_ranges(data))), path)


def test_every_kernel_of_the_zoo_with_the_strided_ones_at_their_invocations():
    text = ZOO.read_text()
    raw = build_index(text)
    index = build_index(text, view_of(text, str(ZOO)))
    names = [k.name for k in index.kernels]
    assert len(raw.kernels) == 18 and len(names) == 21
    assert names[2:5] == ["z_stride2", "z_stride8", "z_stride32"]
    # tree-sitter's "missing ';'" after each invocation is not an error of the expanded text.
    assert [e.message for e in raw.syntax_errors] == ["missing ';'"] * 3 and index.syntax_errors == ()
    lines = text.split("\n")
    for kernel in index.kernels[2:5]:
        line = kernel.span.start.line
        assert lines[line].startswith("STRIDED(" + kernel.name)
        name = kernel.name_span
        assert name.start.line == line and lines[line][name.start.column_byte:name.end.column_byte] == kernel.name
        assert text.encode()[name.start_byte:name.end_byte] == kernel.name.encode()
        assert [p.name for p in kernel.params] == ["out", "in", "n"]
        assert kernel.thread_index_uses == ("blockDim.x", "blockIdx.x", "threadIdx.x")
    # The kernels as written are the same as without the macro pass.
    assert [k for k in index.kernels if k.name not in ("z_stride2", "z_stride8", "z_stride32")] == list(raw.kernels)


STATEMENT = """\
#define BODY out[i] = a[i] + s * b[i];
#define SYNC __syncthreads();
__global__ void add(float *out, const float *a, const float *b, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { BODY }
  SYNC
  for (int k = 0; k < 4; ++k) out[k] = 0;
}
"""


def test_a_statement_macro_is_no_syntax_error_and_its_code_is_seen_on_its_line():
    raw = build_index(STATEMENT)
    index = build_index(STATEMENT, view_of(STATEMENT))
    # tree-sitter misreads both macro uses (the loop after `SYNC` too).
    assert [e.message for e in raw.syntax_errors][:1] == ["syntax error near 'BODY'"] and len(raw.syntax_errors) == 3
    assert index.syntax_errors == ()
    (add,) = index.kernels
    assert add.span == raw.kernels[0].span and add.name_span == raw.kernels[0].name_span
    (sync,) = add.syncs
    lines = STATEMENT.split("\n")
    # The call the macro stands for sits on the macro's use.
    assert sync.name == "__syncthreads" and lines[sync.span.start.line][sync.span.start.column_byte:].startswith("SYNC")
    (loop,) = add.loops
    assert (loop.span.start.line, loop.trip_count) == (6, 4)


def test_an_error_shows_only_where_the_expanded_text_is_wrong_too():
    broken = STATEMENT.replace("#define BODY out[i] = a[i] + s * b[i];", "#define BODY out[i] = a[i] + ;")
    index = build_index(broken, view_of(broken))
    assert [e.span.start.line for e in index.syntax_errors] == [4]
    # A real error in code no macro touches stays as it is.
    plain = STATEMENT + "__global__ void bad(int n) { int x = ; }\n"
    assert [e.span.start.line for e in build_index(plain, view_of(plain)).syntax_errors] == [8]


QUALIFIER = """\
#define GLOBAL __global__
#define KERNEL GLOBAL void
#define RESTRICT __restrict__
KERNEL scale(float *RESTRICT x, float s) { x[threadIdx.x] *= s; }
namespace ops { KERNEL twice(float *x) { x[0] *= 2; } }
"""


def test_a_qualifier_macro_makes_a_kernel_in_its_namespace():
    raw = build_index(QUALIFIER)
    index = build_index(QUALIFIER, view_of(QUALIFIER))
    assert [f.name for f in raw.kernels] == []
    assert [(f.qualified_name, f.qualifier) for f in index.functions] == [("scale", "__global__"),
                                                                          ("ops::twice", "__global__")]
    scale = index.kernels[0]
    assert [(p.name, p.pointer_depth) for p in scale.params] == [("x", 1), ("s", 0)]
    assert QUALIFIER.split("\n")[scale.name_span.start.line][scale.name_span.start.column_byte:].startswith("scale(")


def test_launches_through_a_macro_are_indexed_at_the_macro():
    text = ("#define LAUNCH(k, n) k<<<(n + 255) / 256, 256>>>(x, n)\n__global__ void k(float *x, int n) {}\n"
            "void run(float *x, int n) { LAUNCH(k, n); }\n")
    (launch,) = build_index(text, view_of(text)).launches
    assert (launch.kernel, launch.grid, launch.block, launch.span.start.line) == ("k", "(n + 255) / 256", "256", 2)
    assert launch.enclosing_function == "run"


def test_incremental_builds_reuse_moved_expansions_and_equal_a_fresh_build():
    text = ZOO.read_text()
    view = view_of(text, str(ZOO))
    indexer = IncrementalIndexer()
    indexer.index(ParsedDocument(text), view)
    moved = "// one more line\n" + text
    again = indexer.index(ParsedDocument(moved), view, may_expand=False)
    assert not again.pending and again == build_index(moved, view)
    assert [k.span.start.line for k in again.kernels[2:5]] == [25, 26, 27]


def test_where_the_preprocessor_may_not_run_the_index_is_pending_and_holds_errors_back():
    text = ZOO.read_text()
    pending = IncrementalIndexer().index(ParsedDocument(text), view_of(text, str(ZOO)), may_expand=False)
    assert pending.pending and len(pending.kernels) == 18 and pending.syntax_errors == ()
    unknown = IncrementalIndexer().index(ParsedDocument(STATEMENT), None, macros_pending=True)
    assert unknown.pending and unknown.syntax_errors == ()


def test_a_unit_over_its_budget_is_read_as_written_with_a_note():
    text = ("#define A0 x;\n" + "".join(f"#define A{i} A{i - 1} A{i - 1}\n" for i in range(1, 41))
            + "__global__ void k(float *x) { A40; }\n")
    index = build_index(text, view_of(text), Budget(tokens=5_000))
    assert [k.name for k in index.kernels] == ["k"]
    (note,) = index.notes
    assert "over 5,000 tokens" in note.message and note.span.start.line == 41


def test_a_macro_between_a_kernels_type_and_its_name_is_read_through():
    """SHOC s3d writes ``__global__ void\\nLAUNCH_BOUNDS (RDSMH_THRD, RDSMH_BLK)\\nrdsmh_kernel(…)``: the parser closes a
    declaration before the name; the declaration and the definition after it expand together into the kernel."""
    for body in (" __launch_bounds__(maxThrd, minBlk)", ""):
        source = (f"#define LAUNCH_BOUNDS(maxThrd, minBlk){body}\n"
                  "__global__ void\nLAUNCH_BOUNDS (128, 4)\nscale(const float* t, float* out, float c)\n{\n"
                  "    out[threadIdx.x] = t[threadIdx.x] * c;\n}\n")
        assert not build_index(source).kernels  # the raw text alone hides it
        index = build_index(source, preprocess(source))
        (kernel,) = index.kernels
        assert kernel.name == "scale" and [p.name for p in kernel.params] == ["t", "out", "c"] and not index.syntax_errors
        assert kernel.body_span is not None and source[kernel.body_span.start_byte] == "{"
        assert kernel.launch_bounds == (("128", "4") if body else ())
    template = ("#define LAUNCH_BOUNDS(maxThrd, minBlk)\ntemplate <class real>\n__global__ void\nLAUNCH_BOUNDS (128, 4)\n"
                "scale(const real* t, real* out, real c)\n{\n    out[threadIdx.x] = t[threadIdx.x] * c;\n}\n"
                "template __global__ void scale<float>(const float*, float*, float);\n")
    (kernel,) = build_index(template, preprocess(template)).kernels
    assert kernel.name == "scale" and kernel.is_template
    # An explicit instantiation that names a macro where the parser does not take one is read through it as well.
    restricted = "#define RESTRICT __restrict__\n" + template.replace("(const float*, float*, float)",
                                                                       "(const float* RESTRICT t, float* RESTRICT out, float c)")
    index = build_index(restricted, preprocess(restricted))
    assert not index.syntax_errors and [k.name for k in index.kernels] == ["scale"]


def test_an_empty_function_like_macro_with_a_trailing_blank_keeps_the_next_line():
    """``#define CHECK(x) `` (a blank after the parameters, no body): tree-sitter-cuda read the next line as
    the body, and the kernel that started there vanished from the index, the analysis and every rule."""
    kernel = ("__global__ void k(float *a, int n)\n{\n  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
              "  if (i < n) a[i] = 2.0f * a[i];\n}\n")
    for directive in ("#define CHECK(x) ", "#  define CHECK(a, b) \t", "#define CHECK() ", "#define CHECK(x) \r"):
        text = f"{directive}\n{kernel}"
        index = build_index(text)
        assert [k.name for k in index.kernels] == ["k"], directive
        assert index.kernels[0].span.start.line == 1 and index.syntax_errors == ()
        # Positions and text are the file's: the blank stays blank wherever a node's text is read.
        macro = ParsedDocument(text).tree.root_node.children[0]
        assert macro.type == "preproc_function_def" and text.encode()[macro.start_byte:macro.end_byte].strip() \
            == directive.strip().encode()
        assert analyze(text)["k"].accesses

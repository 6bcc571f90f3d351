"""What lets a hover answer from the last index without O(file) work per keystroke: the directive
lines (and so the macro view) survive edits that touch no directive, comments are found at their
openers, the index places only the hovered kernel's launches, the per-index tables are built with the
index, and a replaced index is freed where it is replaced, not by the next hover."""

from __future__ import annotations

import threading
import weakref

import pytest
from lsprotocol.types import Position

from kernel_lsp.core.index import IncrementalIndexer, build_index
from kernel_lsp.core.launch_dims import evaluate_launch
from kernel_lsp.core.parse import ParsedDocument, comment_ranges
from kernel_lsp.core.source import directive_lines, same_directives
from kernel_lsp.server.documents import DocumentState, IndexedText
from kernel_lsp.server.hover import hover_from_newer_index
from kernel_lsp.server.server import create_server

SOURCE = b"""\
#include "sizes.cuh"
#define BLOCK 256
// a comment with a "quote" and /* inside
__global__ void scale(float* x, int n) {
    const char* s = "// not a comment";
    int i = blockIdx.x * blockDim.x / 2 + threadIdx.x; /* block
    comment */
    if (i < n) x[i] *= 2.0f;
}

void launch(float* x, int n) {
    scale<<<(n + BLOCK - 1) / BLOCK, BLOCK>>>(x, n);
    ns::scale<<<1, 32>>>(x, n);
}
"""


def _edit(source: bytes, at: bytes, new: bytes) -> bytes:
    assert source.count(at) == 1
    return source.replace(at, new)


def test_comments_are_found_at_their_openers_not_in_strings() -> None:
    found = [SOURCE[start:end] for start, end in comment_ranges(SOURCE, ParsedDocument(SOURCE).tree)]
    assert found == [b'// a comment with a "quote" and /* inside', b"/* block\n    comment */"]
    assert comment_ranges(SOURCE) == comment_ranges(SOURCE, ParsedDocument(SOURCE).tree)


def test_directive_lines_follow_continuations_and_skip_comments() -> None:
    text = b"#define A 1 /* x\n#define B 2 */\nint y;\n#define C \\\n  3\n\n/*\n#define D 4\n*/\n"
    assert directive_lines(text, comment_ranges(text)) == ("#define A 1     ", "#define C \\", "  3")
    assert directive_lines(b"int x;\n", []) == ()


@pytest.mark.parametrize("at, new", [
    (b"    ns::scale", b"    int m = n;\n    ns::scale"),  # a line typed in a function
    (b"<<<1, 32>>>", b"<<<1, 64>>>"),                           # a value changed
    (b"}\n\nvoid", b"}\n\n__global__ void added() {}\n\nvoid"),  # a function added between two
])
def test_code_edits_keep_the_directives(at: bytes, new: bytes) -> None:
    edited = _edit(SOURCE, at, new)
    assert same_directives(SOURCE, edited)
    assert directive_lines(edited, comment_ranges(edited)) == directive_lines(SOURCE, comment_ranges(SOURCE))


@pytest.mark.parametrize("at, new", [
    (b"#define BLOCK 256", b"#define BLOCK 128"),   # a directive edited
    (b"#include", b"/*\n#include"),                 # a comment opened above a directive
    (b"// a comment", b"#define X 1\n// a comment"),  # a directive added
    (b"#define BLOCK 256\n", b"#define BLOCK 256 \\\n"),  # a continuation added
    (b'= "// not', b'= R"(// not'),                 # a raw string opened
])
def test_edits_that_may_change_a_directive_are_seen(at: bytes, new: bytes) -> None:
    assert not same_directives(SOURCE, _edit(SOURCE, at, new))


def test_the_launches_of_one_kernel_are_placed_alone() -> None:
    indexer = IncrementalIndexer()
    indexer.index(ParsedDocument(SOURCE))
    moved = _edit(SOURCE, b"// a comment", b"// one more line\n// a comment")
    index = indexer.index(ParsedDocument(moved))
    fresh = build_index(moved)
    # ns::scale counts as scale, as group_launches has it.
    assert index.launches_named("scale") == fresh.launches_of("scale") == fresh.launches
    assert index.launches_named("other") == ()
    inside = moved.index(b"ns::scale") + 4
    assert index.launch_holding(inside) == fresh.launches[1]
    assert index.launch_holding(moved.index(b"void launch")) is None


def test_typing_keeps_the_directive_lines_of_the_last_index() -> None:
    doc = DocumentState("file:///w/a.cu", 1, ParsedDocument(SOURCE), "/w/a.cu")
    first = doc.indexed()
    directives = first.directives()
    line = SOURCE[: SOURCE.index(b"    ns::scale")].count(b"\n")
    doc.parsed.apply_edit(line, 0, line, 0, "    x[0] = 1.0f;\n", defer=True)
    doc.revision += 1
    assert doc.same_directives_as(first)
    typed = doc.indexed()
    assert typed is not first and typed.directives() is directives
    doc.parsed.apply_edit(1, len("#define BLOCK "), 1, len("#define BLOCK 256"), "64", defer=True)
    doc.revision += 1
    assert not doc.same_directives_as(typed)
    assert "#define BLOCK 64" in doc.indexed().directives()


def test_a_comparison_with_an_older_index_does_not_keep_it_alive() -> None:
    # A hover compares the text with the last index's; the comparison's memo must not be what keeps a
    # replaced index alive, or freeing it would fall to the next hover, on the event loop.
    doc = DocumentState("file:///w/a.cu", 1, ParsedDocument(SOURCE), "/w/a.cu")
    first = doc.indexed()
    line = SOURCE[: SOURCE.index(b"    ns::scale")].count(b"\n")
    doc.parsed.apply_edit(line, 0, line, 0, "    x[0] = 1.0f;\n", defer=True)
    doc.revision += 1
    shared = SOURCE.index(b"    ns::scale") + len("    ")  # the typed line's indent matches too
    assert doc.unchanged_before(first) == shared
    assert doc.same_directives_as(first)
    second = doc.indexed()
    assert doc.last_indexed is second
    # Asked again at this revision, the answers still hold for ``first`` (nothing recomputed differently).
    assert doc.unchanged_before(first) == shared
    text_ref, index_ref = weakref.ref(first), weakref.ref(first.index)
    del first
    assert text_ref() is None and index_ref() is None


def test_the_constants_table_of_a_launch_does_not_keep_its_index_alive() -> None:
    index = build_index(SOURCE)
    launch = index.launches[0]
    assert evaluate_launch(launch, SOURCE, index).block_threads == 256
    ref = weakref.ref(index)
    del index
    assert ref() is None
    assert evaluate_launch(launch, SOURCE, build_index(SOURCE)).block_threads == 256


TWO_KERNELS = b"""\
__global__ void a(float* x) { x[0] = 1.0f; }
__global__ void b(float* x) { x[0] = 2.0f; }

void both(float* x) {
    a<<<1, 32>>>(x);
    b<<<1, 64>>>(x);
    a<<<2, 32>>>(x);
}

void none(float* x) { x[0] = 0.0f; }

namespace ns { void only_b(float* x) { ::b<<<4, 128>>>(x); } }
"""


def test_launches_by_name_follow_moved_units() -> None:
    indexer = IncrementalIndexer()
    first = indexer.index(ParsedDocument(TWO_KERNELS))
    assert [launch.block for launch in first.launches_named("a")] == ["32", "32"]
    moved = _edit(TWO_KERNELS, b"void both", b"// two\n// lines\nvoid both")
    index = indexer.index(ParsedDocument(moved))
    fresh = build_index(moved)
    for name in ("a", "b"):
        assert index.launches_named(name) == fresh.launches_of(name), name
    assert [launch.block for launch in index.launches_named("b")] == ["64", "128"]
    assert index.launches_named("none") == index.launches_named("ns") == ()
    assert set(index.parts_by_name()) == {"a", "b"}


def test_the_index_is_prepared_where_it_is_built_before_it_is_published() -> None:
    seen: list[tuple[int, bool]] = []

    def prepare(doc: DocumentState, indexed: IndexedText) -> None:
        seen.append((threading.get_ident(), doc.last_indexed is indexed))
        indexed.derived("table", lambda: len(indexed.index.functions))

    doc = DocumentState("file:///w/a.cu", 1, ParsedDocument(SOURCE), "/w/a.cu", prepare=prepare)
    builder = threading.Thread(target=doc.indexed)
    builder.start()
    builder.join()
    assert seen == [(builder.ident, False)]
    assert doc.indexed().derived("table", lambda: pytest.fail("not prepared")) == 1
    assert len(seen) == 1  # the same revision: no second build


@pytest.mark.parametrize("at, new, answered", [
    (b"namespace ns", b"void later(float* x) { x[1] = 3.0f; }\nnamespace ns", False),  # between b's launches
    (len(TWO_KERNELS), b"void later(float* x) { x[1] = 3.0f; }\n", True),  # after everything b reads
    (0, b"// a line typed above\n", False),  # above the hovered name: the position now means another place
])
def test_a_hover_answered_from_an_index_with_later_edits_never_shows_another_place(
        at: bytes | int, new: bytes, answered: bool) -> None:
    state = create_server().state
    doc = DocumentState("file:///w/k.cu", 1, ParsedDocument(TWO_KERNELS), None)
    sent = doc.source_bytes
    offset = TWO_KERNELS.index(at) if isinstance(at, bytes) else at
    line = TWO_KERNELS[:offset].count(b"\n")
    doc.parsed.apply_edit(line, offset - (TWO_KERNELS.rfind(b"\n", 0, offset) + 1), line,
                          offset - (TWO_KERNELS.rfind(b"\n", 0, offset) + 1), new, defer=True)
    doc.revision += 1
    later = doc.indexed()
    assert later.source_bytes != sent
    on_b = Position(line=1, character=len("__global__ void "))
    answer = hover_from_newer_index(state, doc, later, sent, on_b)
    if not answered:
        assert answer is None
        return
    assert answer is not None and answer.range is not None and answer.range.start.line == 1
    shown = answer.contents.value
    assert "__global__ void b(float* x)" in shown
    assert "line 6: block 64 threads" in shown and "line 12: block 128 threads" in shown

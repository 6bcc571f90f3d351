"""Incremental parsing and indexing must agree exactly with a fresh parse and index."""

from __future__ import annotations

import random

import pytest

from kernel_lsp.core.index import IncrementalIndexer, build_index
from kernel_lsp.core.parse import ParsedDocument

KERNEL = """\
__global__ void kernel_{i}(const float* __restrict__ in, float* out, int n) {{
    __shared__ float tile[32][33];
    for (int k = 0; k < 4; ++k) {{ out[k] += in[threadIdx.x * 4 + k]; }}
    __syncthreads();
}}

void launch_{i}(const float* in, float* out, int n) {{
    kernel_{i}<<<(n + 255) / 256, 256>>>(in, out, n);
}}
"""
SOURCE = "#define B 256\n" + "".join(KERNEL.format(i=i) for i in range(12))
SNIPPETS = ["x", "\n", "", "}", "{", "/*", "*/", "__global__ void z() {", "é", "\n\n  int q = 3;\n", "k<<<1,2>>>();"]


def _apply_reference(text: bytes, line: int, col: int, end_line: int, end_col: int, new: bytes) -> bytes:
    lines = text.split(b"\n")

    def offset(ln: int, c: int) -> int:
        if ln >= len(lines):
            return len(text)
        return sum(len(x) + 1 for x in lines[:ln]) + min(c, len(lines[ln]))

    start, end = offset(line, col), offset(end_line, end_col)
    end = max(start, end)
    return text[:start] + new + text[end:]


@pytest.mark.parametrize("seed", range(6))
def test_random_edits_match_fresh_build(seed: int) -> None:
    rng = random.Random(seed)
    doc = ParsedDocument(SOURCE)
    indexer = IncrementalIndexer()
    indexer.index(doc)
    expected_text = doc.source_bytes
    for _ in range(25):
        line_count = expected_text.count(b"\n") + 1
        line = rng.randrange(line_count)
        col = rng.randrange(6)
        end_line = min(line + rng.choice([0, 0, 0, 1, 2]), line_count)
        end_col = rng.randrange(6)
        new = rng.choice(SNIPPETS)
        if end_line == line:
            end_col = max(end_col, col)
        doc.apply_edit(line, col, end_line, end_col, new)
        expected_text = _apply_reference(expected_text, line, col, end_line, end_col, new.encode())
        assert doc.source_bytes == expected_text
        # The line table is updated by each edit, not rebuilt: it must match a fresh one.
        assert doc.line_starts() == ParsedDocument(expected_text).line_starts()
        incremental = indexer.index(doc)
        fresh = build_index(expected_text)
        # Asked before anything else: the launches of a range come from the unplaced launches.
        lo = rng.randrange(len(expected_text) + 1)
        hi = lo + rng.randrange(len(expected_text) + 1 - lo)
        assert incremental.launches_within(lo, hi) == tuple(
            launch for launch in fresh.launches if lo <= launch.span.start_byte < hi
        )
        assert incremental == fresh
        assert hash(incremental) == hash(fresh) and repr(incremental) == repr(fresh)
        assert incremental.launches_within(lo, hi) == fresh.launches_within(lo, hi)
        assert str(doc.tree.root_node) == str(ParsedDocument(expected_text).tree.root_node)


@pytest.mark.parametrize("seed", range(4))
def test_edits_around_an_empty_macro_with_a_blank_match_a_fresh_parse(seed: int) -> None:
    """``#define CHECK(x) `` reaches tree-sitter with its last blank as ``0`` (core.parse.parser_input): an edit
    that adds or removes such a blank, or text after it, moves that byte outside the edit, and the reparse must
    still agree with a fresh one."""
    rng = random.Random(seed)
    text = "#define CHECK(x)  \n#define TWO(a, b) \t\n" + KERNEL.format(i=0)
    doc = ParsedDocument(text)
    for _ in range(40):
        at = rng.randrange(45)
        if rng.random() < 0.5 and at < len(text):
            text = text[:at] + text[at + 1:]
        else:
            text = text[:at] + rng.choice([" ", "\t", "a", ")", "0", "\n"]) + text[at:]
        doc.replace_all(text)
        assert str(doc.tree.root_node) == str(ParsedDocument(text).tree.root_node), repr(text[:45])


def test_edit_only_reanalyses_the_changed_unit() -> None:
    doc = ParsedDocument(SOURCE)
    indexer = IncrementalIndexer()
    before = indexer.index(doc)
    # Type one character inside kernel_3's body.
    target = before.function("kernel_3")
    assert target is not None and target.body_span is not None
    line = target.body_span.start.line + 1
    doc.apply_edit(line, 4, line, 4, "\n")
    after = indexer.index(doc)
    # Functions before the edit are the very same objects; those after moved one line down.
    assert after.function("kernel_0") is before.function("kernel_0")
    moved_before, moved_after = before.function("kernel_9"), after.function("kernel_9")
    assert moved_before is not None and moved_after is not None
    assert moved_after.name_span.start.line == moved_before.name_span.start.line + 1
    assert moved_after.span.start_byte == moved_before.span.start_byte + 1
    assert after == build_index(doc.source_bytes)


def test_edit_positions_past_end_are_clamped() -> None:
    doc = ParsedDocument("int a;\nint b;\n")
    doc.apply_edit(99, 99, 120, 0, "int c;")
    assert doc.source_bytes == b"int a;\nint b;\nint c;"
    doc.apply_edit(0, 50, 0, 60, "X")
    assert doc.source_bytes == b"int a;X\nint b;\nint c;"


def test_changing_a_define_reanalyses_sizes() -> None:
    doc = ParsedDocument("#define N 8\n__global__ void k() { __shared__ float s[N]; }\n")
    indexer = IncrementalIndexer()
    k = indexer.index(doc).function("k")
    assert k is not None and k.shared[0].size_bytes == 32
    doc.apply_edit(0, 10, 0, 11, "16")
    k = indexer.index(doc).function("k")
    assert k is not None and k.shared[0].size_bytes == 64


@pytest.mark.parametrize("seed", range(4))
def test_full_text_sync_matches_fresh_parse(seed: int) -> None:
    rng = random.Random(100 + seed)
    doc = ParsedDocument(SOURCE)
    indexer = IncrementalIndexer()
    text = SOURCE
    for _ in range(15):
        pos = rng.randrange(len(text) + 1)
        cut = rng.randrange(0, 8)
        text = text[:pos] + rng.choice(SNIPPETS) + text[pos + cut :]
        doc.replace_all(text)
        assert doc.source_bytes == text.encode()
        assert doc.line_starts() == ParsedDocument(text).line_starts()
        assert str(doc.tree.root_node) == str(ParsedDocument(text).tree.root_node)
        assert indexer.index(doc) == build_index(text)
    doc.replace_all("")
    assert doc.source_bytes == b"" and build_index(doc).functions == ()
    doc.replace_all(SOURCE)
    assert len(build_index(doc).kernels) == 12


def test_moved_index_is_frozen_and_survives_pickling() -> None:
    """The index built from moved units (launches not placed yet) behaves like a plain record."""
    import dataclasses
    import pickle

    from kernel_lsp.core.index import KernelIndex

    doc = ParsedDocument(SOURCE)
    indexer = IncrementalIndexer()
    indexer.index(doc)
    doc.apply_edit(1, 0, 1, 0, "\n")
    moved = indexer.index(doc)
    with pytest.raises(dataclasses.FrozenInstanceError):
        moved.functions = ()  # type: ignore[misc]
    fresh = build_index(doc.source_bytes)
    assert pickle.loads(pickle.dumps(moved)) == fresh
    rebuilt = KernelIndex(fresh.functions, fresh.launches, fresh.syntax_errors, fresh.constants, fresh.host_functions)
    assert rebuilt == moved and hash(rebuilt) == hash(moved)
    assert [launch.span.start.line for launch in moved.launches] == [
        launch.span.start.line for launch in fresh.launches
    ]
    assert moved.launches_of("kernel_3") == fresh.launches_of("kernel_3") and len(moved.launches_of("kernel_3")) == 1

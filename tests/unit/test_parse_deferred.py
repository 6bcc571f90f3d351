"""Deferred edits: the text and line table follow every edit at once, one reparse catches the tree up."""

from __future__ import annotations

import random

from kernel_lsp.core.index import IncrementalIndexer, build_index
from kernel_lsp.core.parse import ParsedDocument

SOURCE = """\
__global__ void a(float* x) { x[threadIdx.x] = 1.0f; }

__device__ float h(float v) { return v * 2.0f; }

__global__ void b(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = h(y[i]);
}
"""


def _random_edit(rng: random.Random, text: str) -> tuple[int, int, str]:
    start = rng.randrange(len(text) + 1)
    end = min(len(text), start + rng.choice([0, 0, 1, 3]))
    return start, end, rng.choice(["x", "\n", "(", "}", "//", "ab\ncd", ""])


def _line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset)
    return line, offset - (text.rfind("\n", 0, offset) + 1)


def test_deferred_edits_end_like_a_fresh_parse() -> None:
    rng = random.Random(7)
    doc = ParsedDocument(SOURCE)
    indexer = IncrementalIndexer()
    indexer.index(doc)
    text = SOURCE
    for step in range(300):
        start, end, new = _random_edit(rng, text)
        (sl, sc), (el, ec) = _line_col(text, start), _line_col(text, end)
        doc.apply_edit(sl, sc, el, ec, new, defer=True)
        text = text[:start] + new + text[end:]
        assert doc.source_bytes == text.encode()
        fresh = ParsedDocument(text)
        # The line table and position maths are right between reparses too.
        probe = rng.randrange(len(text) + 1)
        assert doc.point_of(probe) == fresh.point_of(probe)
        line = rng.randrange(fresh.line_count())
        assert doc.line_start(line) == fresh.line_start(line)
        if step % 17 == 0:
            assert doc.has_pending_edits or not new and start == end
            source, tree = doc.snapshot()
            assert not doc.has_pending_edits
            assert source == text.encode()
            assert str(tree.root_node) == str(fresh.tree.root_node)
            assert [f.name for f in indexer.index(doc).functions] == [f.name for f in build_index(text).functions]
    assert doc.line_starts() == ParsedDocument(text).line_starts()


def test_many_keystrokes_cost_one_reparse() -> None:
    doc = ParsedDocument(SOURCE)
    line = SOURCE.count("\n")
    typed = "__global__ void c(int* p) { p[0] = 2; }\n"
    column = 0
    for char in typed:
        doc.apply_edit(line, column, line, column, char, defer=True)
        column = 0 if char == "\n" else column + 1
        line += char == "\n"
    assert doc.has_pending_edits
    # The published tree is still the one before the keystrokes until someone reads it.
    assert doc._snapshot[0] == SOURCE.encode()
    source, tree = doc.snapshot()
    assert source == (SOURCE + typed).encode()
    assert [f.name for f in build_index(doc).functions] == ["a", "h", "b", "c"]


def test_closing_a_brace_finds_the_functions_it_had_before(monkeypatch) -> None:
    """While a ``{`` is unclosed tree-sitter reads later functions differently; the spares keep them."""
    kernels = "".join(f"__global__ void k{i}(float* p) {{ p[{i}] = {i}.0f; }}\n\n" for i in range(40))
    doc = ParsedDocument(kernels)
    indexer = IncrementalIndexer()
    indexer.index(doc)
    analysed: list[int] = []
    original = IncrementalIndexer._analyze_dirty

    def counting(units, dirty, *args):
        analysed.append(len(dirty))
        return original(units, dirty, *args)

    monkeypatch.setattr(IncrementalIndexer, "_analyze_dirty", staticmethod(counting))
    doc.apply_edit(0, 0, 0, 0, "__global__ void typed(int n) {\n    for (int i = 0; i < n; ++i) {\n", defer=True)
    indexer.index(doc)
    doc.apply_edit(2, 0, 2, 0, "    }\n}\n", defer=True)
    healed = indexer.index(doc)
    assert [f.name for f in healed.functions] == ["typed"] + [f"k{i}" for i in range(40)]
    assert analysed[-1] <= 2, analysed

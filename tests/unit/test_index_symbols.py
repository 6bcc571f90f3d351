"""The outline after edits: re-encoding only the changed functions must give exactly a fresh encoding."""

from __future__ import annotations

import json
import random

import pytest

from kernel_lsp.core.index import IncrementalIndexer
from kernel_lsp.core.parse import ParsedDocument
from kernel_lsp.server.symbols import document_symbols, encoded_document_symbols

UNIT = """\
namespace ns{i} {{
__device__ float helper_{i}(float a) {{ return a * 2.0f; }}  // é{i}
__global__ void kernel_{i}(float* out, int n) {{ __shared__ float tile[32];
    child_{i}<<<1, 32>>>(out);
    if (threadIdx.x < n) out[threadIdx.x] = helper_{i}(tile[0]);
}}
}}
void launch_{i}(float* out) {{ ns{i}::kernel_{i}<<<1, 32>>>(out, 32); }}
"""
SOURCE = "".join(UNIT.format(i=i) for i in range(8))
SNIPPETS = ["x", "\n", "", "}", "{", "é", "😀", "  ", "__global__ void z() {}\n", "namespace q {"]


def _fresh(doc: ParsedDocument) -> str:
    return json.dumps(document_symbols(doc, IncrementalIndexer().index(doc)), separators=(",", ":"))


@pytest.mark.parametrize("seed", range(4))
def test_reused_symbols_match_a_fresh_encoding(seed: int) -> None:
    rng = random.Random(seed)
    doc = ParsedDocument(SOURCE)
    indexer = IncrementalIndexer()
    answer, fragments = encoded_document_symbols(doc, indexer.index(doc), {})
    assert answer.text == _fresh(doc)
    for _ in range(30):
        line = rng.randrange(len(doc.line_starts()))
        col = rng.randrange(8)
        doc.apply_edit(line, col, line, col + rng.choice([0, 0, 1, 3]), rng.choice(SNIPPETS))
        answer, fragments = encoded_document_symbols(doc, indexer.index(doc), fragments)
        assert answer.text == _fresh(doc)


def test_only_the_edited_function_is_encoded_again() -> None:
    doc = ParsedDocument(SOURCE)
    indexer = IncrementalIndexer()
    _, before = encoded_document_symbols(doc, indexer.index(doc), {})
    kernel = indexer.index(doc).function("kernel_3")
    assert kernel is not None and kernel.body_span is not None
    line = kernel.body_span.end.line
    doc.apply_edit(line, 0, line, 0, " ")  # a space: every function below moves by one byte
    _, after = encoded_document_symbols(doc, indexer.index(doc), before)
    reused = [key for key, text in after.items() if before.get(key) is text]
    assert len(reused) == len(after) - 1


def test_a_renamed_namespace_changes_the_detail() -> None:
    doc = ParsedDocument(SOURCE)
    indexer = IncrementalIndexer()
    _, fragments = encoded_document_symbols(doc, indexer.index(doc), {})
    doc.apply_edit(0, len("namespace "), 0, len("namespace ns0"), "renamed")
    answer, _ = encoded_document_symbols(doc, indexer.index(doc), fragments)
    assert "renamed::kernel_0" in answer.text and answer.text == _fresh(doc)


def test_text_before_a_function_on_its_line_decides_its_columns() -> None:
    # "é" and "ab" are both two UTF-8 bytes but one and two UTF-16 code units.
    doc = ParsedDocument("/* é */ __device__ int mid() { return 1; }\n")
    indexer = IncrementalIndexer()
    _, fragments = encoded_document_symbols(doc, indexer.index(doc), {})
    doc.apply_edit(0, 3, 0, 5, "ab")
    answer, _ = encoded_document_symbols(doc, indexer.index(doc), fragments)
    assert answer.text == _fresh(doc)
    assert json.loads(answer.text)[0]["range"]["start"]["character"] == 9


def test_symbols_moved_down_by_a_new_line_match_a_fresh_encoding() -> None:
    # A "%" in a signature must survive the re-formatting of a moved symbol's lines.
    doc = ParsedDocument("__device__ int m(int a, int b = 7 % 3) { return a % b; }\n\n"
                         "__global__ void k(float* x) {\n    __shared__ float t[32];\n    x[0] = t[0];\n}\n")
    indexer = IncrementalIndexer()
    _, fragments = encoded_document_symbols(doc, indexer.index(doc), {})
    for _ in range(3):
        doc.apply_edit(0, 0, 0, 0, "// one more line\n")
        answer, fragments = encoded_document_symbols(doc, indexer.index(doc), fragments)
        assert answer.text == _fresh(doc)
    assert json.loads(answer.text)[1]["children"][0]["range"]["start"]["line"] == 6

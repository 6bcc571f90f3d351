"""Host function definitions in the index: name, signature, position; they move with edits."""

from __future__ import annotations

from kernel_lsp.core.index import IncrementalIndexer, build_index
from kernel_lsp.core.parse import ParsedDocument

SOURCE = """\
#include <cstdio>
__global__ void k(float* p) { p[0] = 1.0f; }
__device__ float twice(float v) { return 2.0f * v; }
static void launch(float* p,
                   int n) { k<<<1, n>>>(p); }
void declared_only(int);
namespace app {
int run() { return 0; }
}
int main(int argc, char** argv) {
    launch(nullptr, 1);
    return app::run();
}
"""


def test_host_definitions_are_listed_with_their_signature() -> None:
    index = build_index(SOURCE)
    hosts = {h.qualified_name: h for h in index.host_functions}
    assert list(hosts) == ["launch", "app::run", "main"]
    assert hosts["main"].signature == "int main(int argc, char** argv)"
    assert hosts["launch"].signature.endswith("void launch(float* p, int n)")
    assert (hosts["main"].name_span.start.line, hosts["main"].name_span.start.column_byte) == (9, 4)
    assert hosts["app::run"].name == "run"
    # Kernels and device functions stay functions, not host functions.
    assert [f.name for f in index.functions] == ["k", "twice"]


def test_host_functions_move_with_an_edit_above_them() -> None:
    doc = ParsedDocument(SOURCE)
    indexer = IncrementalIndexer()
    indexer.index(doc)
    doc.apply_edit(0, 0, 0, 0, "// a new first line\n")
    moved = indexer.index(doc)
    assert moved == build_index(doc.source_bytes)
    assert [h.name_span.start.line for h in moved.host_functions] == [4, 8, 10]

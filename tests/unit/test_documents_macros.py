"""A document's index and its macros in the server: the preprocessor never runs on the event loop; an index built
there that needs it is pending until a worker thread completes it, and requests that await the index see it complete."""

from __future__ import annotations

import asyncio
import threading

from kernel_lsp.core.parse import comment_ranges
from kernel_lsp.core.source import directive_lines, preprocess
from kernel_lsp.server.documents import DocumentStore

TEXT = """\
#define STRIDED(NAME, S) __global__ void NAME(float *o, const float *i, int n) { o[threadIdx.x] = i[threadIdx.x * S]; }
#define BODY out[i] = a[i];
STRIDED(z_stride2, 2)
__global__ void add(float *out, const float *a, int n) {
  int i = threadIdx.x;
  if (i < n) { BODY }
}
"""


class Views:
    """A macro-view provider that records on which thread it ran the preprocessor."""

    def __init__(self) -> None:
        self.cache: dict[tuple[str, ...], object] = {}
        self.threads: list[int] = []

    def __call__(self, doc, directives, compute):
        hit = self.cache.get(tuple(directives))
        if hit is None and compute:
            self.threads.append(threading.get_ident())
            hit = self.cache[tuple(directives)] = preprocess("".join(d + "\n" for d in directives), "/w/k.cu")
        return hit


async def test_an_index_built_on_the_loop_is_pending_then_completed_off_it():
    loop_thread = threading.get_ident()
    views, completed = Views(), []
    store = DocumentStore(macro_views=views, may_expand=lambda: threading.get_ident() != loop_thread,
                          on_completed=completed.append)
    doc = await store.open("file:///w/k.cu", TEXT, 1)
    pending = doc.index()
    # Built on the loop: the macro view is unknown there, so the macro kernels are not in yet and tree-sitter's
    # misreadings of the macros are held back, not shown.
    assert pending.pending and [k.name for k in pending.kernels] == ["add"] and pending.syntax_errors == ()
    text = await doc.indexed_async()
    assert not text.pending and [k.name for k in text.index.kernels] == ["z_stride2", "add"]
    assert text.index.syntax_errors == () and text.view is not None and "BODY" in text.view.code_macros
    assert views.threads and loop_thread not in views.threads
    await asyncio.sleep(0)
    assert completed == [doc]
    # The next index of the same directives needs no preprocessor: built on the loop, complete at once.
    doc.parsed.apply_edit(6, 1, 6, 1, "\n// more\n")
    doc.revision += 1
    again = doc.index()
    assert not again.pending and [k.name for k in again.kernels] == ["z_stride2", "add"]
    assert len(views.threads) == 1


def test_off_the_loop_an_index_is_complete_at_once():
    data = TEXT.encode()
    view = preprocess("".join(d + "\n" for d in directive_lines(data, comment_ranges(data))), "/w/k.cu")
    store = DocumentStore(macro_views=lambda doc, directives, compute: view)

    async def build():
        doc = await store.open("file:///w/k.cu", TEXT, 1)
        return await asyncio.to_thread(doc.index)

    index = asyncio.run(build())
    assert not index.pending and [k.name for k in index.kernels] == ["z_stride2", "add"]

"""Launch sizes in the editor come from the file as the compiler sees it: a block size from a local header,
an extraFlags -D over the header's default, and an open (unsaved) header's buffer."""

from __future__ import annotations

import re
from pathlib import Path

from lsp_helpers import lsp_session, needs_nvcc, open_doc, wait_diagnostics
from lsprotocol import types

HEADER = "#ifndef BLOCK_SIZE\n#define BLOCK_SIZE 128\n#endif\n"
SOURCE = """\
#include "sizes.cuh"
__global__ void add(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
int main() {
    const int n = 1 << 20, blocks = (n + BLOCK_SIZE - 1) / BLOCK_SIZE;
    float *x;
    cudaMalloc(&x, n * sizeof(float));
    add<<<blocks, BLOCK_SIZE>>>(x, n);
}
"""


async def _lens_title(client, uri: str) -> str:
    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    assert lenses is not None and len(lenses) == 1
    return lenses[0].command.title


@needs_nvcc
async def test_block_size_from_a_local_header(tmp_path: Path) -> None:
    (tmp_path / "sizes.cuh").write_text(HEADER)
    (tmp_path / "add.cu").write_text(SOURCE)
    async with lsp_session(tmp_path) as client:
        uri = open_doc(client, tmp_path / "add.cu")
        await wait_diagnostics(client, uri)
        title = await _lens_title(client, uri)
        assert re.search(r"occupancy \d+% @128 ", title), title
        # An unsaved edit of the header, open in the editor, is what the lens reads.
        header = tmp_path / "sizes.cuh"
        open_doc(client, header, HEADER.replace("128", "512"))
        title = await _lens_title(client, uri)
        assert re.search(r"occupancy \d+% @512 ", title), title


@needs_nvcc
async def test_an_extra_flag_beats_the_headers_default(tmp_path: Path) -> None:
    (tmp_path / "sizes.cuh").write_text(HEADER)
    (tmp_path / "add.cu").write_text(SOURCE)
    async with lsp_session(tmp_path, init_options={"extraFlags": ["-DBLOCK_SIZE=256"]}) as client:
        uri = open_doc(client, tmp_path / "add.cu")
        await wait_diagnostics(client, uri)
        title = await _lens_title(client, uri)
    assert re.search(r"occupancy \d+% @256 ", title), title

"""Access patterns through the real server: hints on uncoalesced lines, hover on an access line.

The kernel's body is a macro from a local header, as real code writes it: the patterns come
from the preprocessed view.
"""

from __future__ import annotations

import json
from pathlib import Path

from lsp_helpers import hover_text, lsp_session, open_doc, position_of, wait_diagnostics
from lsprotocol import types

HEADER = "#define TILE_W 32\n#define STORE(o, v) out[(o)] = (v)\n"
SOURCE = """\
#include "sizes.cuh"
__global__ void naive_transpose(const float* in, float* out, int rows, int cols) {
    int cx = blockIdx.x * TILE_W + threadIdx.x;
    int ry = blockIdx.y * blockDim.y + threadIdx.y;
    if (cx < cols && ry < rows) STORE(cx * rows + ry, in[ry * cols + cx]);
}
"""
SPEC = {
    "kernel": "naive_transpose",
    "params": [
        {"name": "in", "array": "float32", "size": "rows*cols", "init": "uniform(-1,1)", "role": "in"},
        {"name": "out", "array": "float32", "size": "rows*cols", "init": "zeros", "role": "out"},
        {"name": "rows", "scalar": "int32", "value": 2048},
        {"name": "cols", "scalar": "int32", "value": 1024},
    ],
    "grid": ["cols/32", "rows/8", "1"],
    "block": [32, 8, 1],
}


def _is_access_hint(d: types.Diagnostic) -> bool:
    return d.source == "kernel-lsp access"


async def test_uncoalesced_store_hint_and_line_hover(tmp_path: Path) -> None:
    (tmp_path / "sizes.cuh").write_text(HEADER)
    path = tmp_path / "t.cu"
    path.write_text(SOURCE)
    Path(f"{path}.naive_transpose.spec.json").write_text(json.dumps(SPEC))
    async with lsp_session(tmp_path, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, path)
        diagnostics = await wait_diagnostics(client, uri, lambda ds: any(_is_access_hint(d) for d in ds), timeout_s=60)
        hover = await client.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=position_of(SOURCE, "STORE(", 2)))
        on_name = await client.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=position_of(SOURCE, "naive_transpose", 3)))
    hints = [d for d in diagnostics if _is_access_hint(d)]
    assert [(d.range.start.line, d.severity) for d in hints] == [(4, types.DiagnosticSeverity.Hint)]
    assert hints[0].message == "store to `out`: 2048 elements apart across a warp, 32 sectors per request — uncoalesced"
    text = hover_text(hover)
    assert "load of `in`: unit stride across a warp, 4 sectors per request — coalesced" in text
    assert "store to `out`: 2048 elements apart" in text
    name_text = hover_text(on_name)
    assert "writes `out`" in name_text and "1 uncoalesced global access" in name_text


async def test_without_spec_hover_gives_formulas(tmp_path: Path) -> None:
    (tmp_path / "sizes.cuh").write_text(HEADER)
    path = tmp_path / "t.cu"
    other = "__global__ void other(float* p, int n) { p[threadIdx.x * n] = 0; }\n"
    path.write_text(SOURCE + other)
    Path(f"{path}.other.spec.json").write_text(json.dumps({
        "kernel": "other", "grid": [1, 1, 1], "block": [32, 1, 1],
        "params": [{"name": "p", "array": "float32", "size": "32*n", "init": "zeros", "role": "out"},
                   {"name": "n", "scalar": "int32", "value": 64}]}))
    async with lsp_session(tmp_path, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, path)
        diagnostics = await wait_diagnostics(client, uri, lambda ds: any(_is_access_hint(d) for d in ds), timeout_s=60)
        hover = await client.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=position_of(SOURCE, "STORE(", 2)))
    # Only the kernel with a spec gets a hint; the other's hover gives its indices as formulas.
    assert [d.range.start.line for d in diagnostics if _is_access_hint(d)] == [6]
    text = hover_text(hover)
    assert "no launch spec" in text
    assert "write `out[bdim.y*bid.y + 32*bid.x*rows + rows*tid.x + tid.y]`" in text
    assert "read `in[bdim.y*bid.y*cols + cols*tid.y + 32*bid.x + tid.x]`" in text


CONSTANT_SOURCE = """\
__constant__ float weights[64];
__global__ void scale(const float* in, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float w = weights[blockIdx.x % 64];
    if (i < n) out[i] = in[i] * w * weights[threadIdx.x % 8];
}
"""


async def test_a_constant_read_at_several_addresses_across_a_warp_is_a_hint(tmp_path: Path) -> None:
    """``weights[threadIdx.x % 8]``: 8 addresses a warp, served one after another by the constant cache;
    ``weights[blockIdx.x % 64]`` is one address a warp (a broadcast), no hint."""
    path = tmp_path / "c.cu"
    path.write_text(CONSTANT_SOURCE)
    spec = {"kernel": "scale", "params": [
        {"name": "in", "array": "float32", "size": "n", "init": "uniform(-1,1)", "role": "in"},
        {"name": "out", "array": "float32", "size": "n", "init": "zeros", "role": "out"},
        {"name": "n", "scalar": "int32", "value": 4096}], "grid": ["n/256", 1, 1], "block": [256, 1, 1]}
    Path(f"{path}.scale.spec.json").write_text(json.dumps(spec))
    async with lsp_session(tmp_path, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, path)
        diagnostics = await wait_diagnostics(client, uri, lambda ds: any(_is_access_hint(d) for d in ds), timeout_s=60)
    hints = [d for d in diagnostics if _is_access_hint(d)]
    assert [(d.range.start.line, d.code) for d in hints] == [(4, "serialized")]
    assert hints[0].message == ("load of `weights` (constant): 8 different elements across a warp, which the constant "
                                "cache serves one after another")

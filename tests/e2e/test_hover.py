"""Hover through the real server: signature always; registers and occupancy once nvcc ran."""

from __future__ import annotations

import re
from pathlib import Path

from lsp_helpers import SAXPY, hover_text, lsp_session, needs_nvcc, open_doc, position_of, wait_diagnostics
from lsprotocol import types


def _hover_params(uri: str, position: types.Position) -> types.HoverParams:
    return types.HoverParams(text_document=types.TextDocumentIdentifier(uri=uri), position=position)


async def test_hover_without_compiler_shows_signature(workspace: Path) -> None:
    async with lsp_session(workspace, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, workspace / "saxpy.cu")
        hover = await client.text_document_hover_async(_hover_params(uri, position_of(SAXPY, "saxpy(int", 2)))
        blank = await client.text_document_hover_async(_hover_params(uri, types.Position(line=2, character=0)))
    text = hover_text(hover)
    assert "__global__ void saxpy(int n, float a" in text
    assert "Registers" not in text  # nothing invented without nvcc
    assert hover is not None and hover.range is not None
    assert hover.range.start == position_of(SAXPY, "saxpy(int")
    assert blank is None


@needs_nvcc
async def test_hover_after_compile_shows_resources_and_occupancy(workspace: Path) -> None:
    async with lsp_session(workspace) as client:
        uri = open_doc(client, workspace / "saxpy.cu")
        await wait_diagnostics(client, uri)
        on_name = await client.text_document_hover_async(_hover_params(uri, position_of(SAXPY, "saxpy(int", 1)))
        on_launch = await client.text_document_hover_async(_hover_params(uri, position_of(SAXPY, "saxpy<<<", 1)))
        on_template_launch = await client.text_document_hover_async(_hover_params(uri, position_of(SAXPY, "scale<4>", 1)))
    name_text = hover_text(on_name)
    registers = re.search(r"Registers: (\d+) per thread", name_text)
    assert registers and int(registers.group(1)) > 0
    assert "Shared memory: 1024 B static" in name_text  # float cache[256]
    assert "Spills" in name_text and "Stack" in name_text
    # BLOCK is #define'd as 256: the block size is known, so is the occupancy and its limiter.
    assert re.search(r"block 256 → \*\*\d+%\*\* occupancy \(limiter: \w+", name_text)
    launch_text = hover_text(on_launch)
    assert "saxpy" in launch_text and re.search(r"block 256 → \*\*\d+%\*\*", launch_text)
    assert on_launch is not None and on_launch.range is not None
    # The template instance compiled as scale<4>: matched to the kernel by its base name.
    template_text = hover_text(on_template_launch)
    assert re.search(r"Registers: \d+ per thread", template_text)
    assert re.search(r"block 1024 → \*\*\d+%\*\*", template_text)


async def test_hover_utf16_columns_after_non_ascii_text(workspace: Path) -> None:
    # The emoji is 2 UTF-16 units and 4 UTF-8 bytes: a wrong conversion misses the name.
    text = "/* 😀 é */ __global__ void wide(float* p) { p[0] = 1.0f; }\n"
    path = workspace / "wide.cu"
    path.write_text(text, encoding="utf-8")
    async with lsp_session(workspace, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, path)
        position = position_of(text, "wide(", 3)
        hover = await client.text_document_hover_async(_hover_params(uri, position))
    assert "void wide(float*" in hover_text(hover)
    assert hover is not None and hover.range is not None
    start = position_of(text, "wide(")
    assert hover.range.start == start
    assert hover.range.end.character == start.character + 4


async def test_hover_past_the_end_answers_none(workspace: Path) -> None:
    async with lsp_session(workspace, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, workspace / "saxpy.cu")
        far = await client.text_document_hover_async(_hover_params(uri, types.Position(line=10_000, character=5)))
        wide = await client.text_document_hover_async(_hover_params(uri, types.Position(line=5, character=10_000)))
    assert far is None
    assert wide is None


@needs_nvcc
async def test_block_size_from_a_compile_commands_define(tmp_path: Path) -> None:
    import json

    source = ("#ifndef THREADS\n#define THREADS 64\n#endif\n"
              "__global__ void fill(float* p) { p[blockIdx.x * THREADS + threadIdx.x] = 1.0f; }\n"
              "void run(float* p) { fill<<<4, THREADS>>>(p); }\n")
    (tmp_path / "fill.cu").write_text(source)
    (tmp_path / "compile_commands.json").write_text(json.dumps([
        {"directory": str(tmp_path), "file": "fill.cu", "command": "nvcc -DTHREADS=512 -c fill.cu -o fill.o"}
    ]))
    async with lsp_session(tmp_path) as client:
        uri = open_doc(client, tmp_path / "fill.cu")
        await wait_diagnostics(client, uri)
        hover = await client.text_document_hover_async(_hover_params(uri, position_of(source, "fill(float", 1)))
    # the command line's THREADS=512 replaces the file's #ifndef default of 64, as in the compiler
    assert re.search(r"block 512 → \*\*\d+%\*\*", hover_text(hover))

"""Compiler diagnostics through the real server and the real nvcc."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

from lsp_helpers import lsp_session, needs_nvcc, open_doc, position_of, wait_diagnostics, wait_message
from lsprotocol import types

BROKEN = """\
__global__ void broken(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int unused_value;
    if (i < n) out[i] = undefined_name * 2.0f;
}
"""


def _errors(diagnostics):
    return [d for d in diagnostics if d.severity == types.DiagnosticSeverity.Error]


@needs_nvcc
async def test_broken_file_gets_error_and_warning_with_ranges(tmp_path: Path) -> None:
    path = tmp_path / "broken.cu"
    path.write_text(BROKEN)
    async with lsp_session(tmp_path) as client:
        uri = open_doc(client, path)
        diagnostics = await wait_diagnostics(client, uri, lambda ds: bool(_errors(ds)))
    [error] = _errors(diagnostics)
    assert error.source == "nvcc"
    assert 'identifier "undefined_name" is undefined' in error.message
    # nvcc's caret points at the identifier: the range covers exactly it.
    start = position_of(BROKEN, "undefined_name")
    assert error.range.start == start
    assert error.range.end == types.Position(line=start.line, character=start.character + len("undefined_name"))
    warnings = [d for d in diagnostics if d.severity == types.DiagnosticSeverity.Warning]
    assert any("unused_value" in d.message and d.range.start.line == 2 for d in warnings)


@needs_nvcc
async def test_unsaved_buffer_is_compiled_and_save_recompiles(tmp_path: Path) -> None:
    path = tmp_path / "k.cu"
    fixed = BROKEN.replace("undefined_name", "1.0f").replace("    int unused_value;\n", "")
    path.write_text(fixed)  # disk: fine; buffer: broken
    before = path.read_bytes()
    async with lsp_session(tmp_path) as client:
        uri = open_doc(client, path, text=BROKEN)
        await wait_diagnostics(client, uri, lambda ds: bool(_errors(ds)))
        # The user fixes the buffer (full replacement) and saves.
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=fixed)],
        ))
        client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
        diagnostics = await wait_diagnostics(client, uri, lambda ds: not _errors(ds))
    assert not [d for d in diagnostics if d.source == "nvcc"]
    assert path.read_bytes() == before  # the user's file is never written


@needs_nvcc
async def test_local_include_and_compile_commands_flags(tmp_path: Path) -> None:
    (tmp_path / "local.cuh").write_text("#define FROM_HEADER 3\n")
    path = tmp_path / "uses.cu"
    path.write_text(
        '#include "local.cuh"\n'
        "#ifndef FROM_DB\n#error FROM_DB must come from compile_commands.json\n#endif\n"
        "__global__ void k(int* p) { p[0] = FROM_HEADER + FROM_DB; }\n"
    )
    (tmp_path / "compile_commands.json").write_text(json.dumps([
        {"directory": str(tmp_path), "file": "uses.cu", "command": "nvcc -DFROM_DB=4 -c uses.cu -o uses.o"}
    ]))
    async with lsp_session(tmp_path) as client:
        uri = open_doc(client, path)
        diagnostics = await wait_diagnostics(client, uri)
    assert not _errors(diagnostics), [d.message for d in diagnostics]


@needs_nvcc
async def test_an_error_in_a_header_shows_on_its_include_line_and_links_to_the_header(tmp_path: Path) -> None:
    header = tmp_path / "bad.cuh"
    header.write_text("// helpers\n__device__ float twice(float x) { return x * missing_factor; }\n")
    path = tmp_path / "uses_bad.cu"
    text = '#include <cstdio>\n#include "bad.cuh"\n__global__ void k(float* p) { p[0] = twice(p[0]); }\n'
    path.write_text(text)
    async with lsp_session(tmp_path) as client:
        uri = open_doc(client, path)
        diagnostics = await wait_diagnostics(client, uri, lambda ds: bool(_errors(ds)))
    [error] = _errors(diagnostics)
    assert "missing_factor" in error.message and "bad.cuh:2" in error.message
    assert error.range.start.line == 1  # the #include "bad.cuh" line, not the first line
    [related] = error.related_information
    assert related.location.uri == header.resolve().as_uri() and related.location.range.start.line == 1


@needs_nvcc
async def test_malformed_compile_commands_falls_back_with_message(tmp_path: Path) -> None:
    path = tmp_path / "k.cu"
    path.write_text(BROKEN)
    (tmp_path / "compile_commands.json").write_text("[{ this is not json")
    async with lsp_session(tmp_path) as client:
        uri = open_doc(client, path)
        message = await wait_message(client, "compile_commands.json")
        diagnostics = await wait_diagnostics(client, uri, lambda ds: bool(_errors(ds)))
    assert "not valid JSON" in message.message and "settings" in message.message
    assert _errors(diagnostics)  # compiled anyway, with the settings' flags


async def test_missing_nvcc_one_message_and_the_rest_works(tmp_path: Path) -> None:
    path = tmp_path / "k.cu"
    path.write_text(BROKEN)
    async with lsp_session(tmp_path, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, path)
        await wait_message(client, "nvcc was not found")
        await wait_diagnostics(client, uri)
        # A save compiles again: still only one message.
        client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
        client.messages.clear()
        other = tmp_path / "other.cu"
        other.write_text("__global__ void other() {}\n")
        other_uri = open_doc(client, other)
        await wait_diagnostics(client, other_uri)
        symbols = await client.text_document_document_symbol_async(
            types.DocumentSymbolParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )
    assert not [m for m in client.messages if "nvcc was not found" in m.message]
    assert symbols and symbols[0].name == "broken"


async def test_hanging_nvcc_is_stopped_with_a_message(tmp_path: Path) -> None:
    fake = tmp_path / "slow-nvcc"
    fake.write_text("#!/bin/sh\nexec sleep 600\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    path = tmp_path / "k.cu"
    path.write_text(BROKEN)
    async with lsp_session(tmp_path, init_options={"nvccPath": str(fake), "compileTimeoutS": 1}) as client:
        uri = open_doc(client, path)
        message = await wait_message(client, "did not finish", timeout_s=60)
        symbols = await client.text_document_document_symbol_async(
            types.DocumentSymbolParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )
    assert "1 s" in message.message
    assert symbols and symbols[0].name == "broken"


@needs_nvcc
async def test_settings_from_workspace_configuration_are_used(tmp_path: Path) -> None:
    path = tmp_path / "k.cu"
    path.write_text("#ifndef FROM_SETTINGS\n#error needs extraFlags\n#endif\n__global__ void k() {}\n")
    async with lsp_session(tmp_path, workspace_settings={"extraFlags": ["-DFROM_SETTINGS=1"]}) as client:
        uri = open_doc(client, path)
        diagnostics = await wait_diagnostics(client, uri)
        assert not _errors(diagnostics), [d.message for d in diagnostics]
        # The setting is withdrawn: didChangeConfiguration re-reads it and recompiles.
        client.set_configuration({}, section="kernelLsp")
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=None))
        diagnostics = await wait_diagnostics(client, uri, lambda ds: bool(_errors(ds)))
    assert any("needs extraFlags" in d.message for d in diagnostics)


@needs_nvcc
async def test_a_changed_setting_wins_over_the_start_up_initialization_options(tmp_path: Path) -> None:
    path = tmp_path / "k.cu"
    path.write_text("#ifndef FROM_SETTINGS\n#error needs extraFlags\n#endif\n__global__ void k() {}\n")
    async with lsp_session(tmp_path, init_options={"extraFlags": []}) as client:
        uri = open_doc(client, path)
        diagnostics = await wait_diagnostics(client, uri, lambda ds: bool(_errors(ds)))
        assert any("needs extraFlags" in d.message for d in diagnostics)
        # The user sets the flag in the editor: the stale start-up value must not hide it.
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"kernelLsp": {"extraFlags": ["-DFROM_SETTINGS=1"]}})
        )
        diagnostics = await wait_diagnostics(client, uri, lambda ds: not _errors(ds))
    assert not _errors(diagnostics)


async def test_bad_setting_value_is_reported_and_ignored(tmp_path: Path) -> None:
    path = tmp_path / "k.cu"
    path.write_text("__global__ void k() {}\n")
    async with lsp_session(tmp_path, init_options={"nvccPath": "/nonexistent/nvcc", "compileTimeoutS": "soon",
                                                   "noSuchSetting": 1}) as client:
        await wait_message(client, "compileTimeoutS")
        await wait_message(client, "noSuchSetting")
        uri = open_doc(client, path)
        symbols = await client.text_document_document_symbol_async(
            types.DocumentSymbolParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )
    assert symbols and symbols[0].name == "k"
    assert os.path.exists(path)


@needs_nvcc
async def test_compile_reports_progress_begin_and_end(tmp_path: Path) -> None:
    path = tmp_path / "k.cu"
    path.write_text("__global__ void k() {}\n")
    async with lsp_session(tmp_path) as client:  # VS Code's capabilities include workDoneProgress
        uri = open_doc(client, path)
        await wait_diagnostics(client, uri)

        def kinds() -> list[list[str]]:
            # pytest-lsp stores each $/progress value as WorkDoneProgressBegin/Report/End.
            return [[value.kind for value in reports] for reports in client.progress_reports.values()]

        async with asyncio.timeout(60):
            while not any(k and k[-1] == "end" for k in kinds()):
                await client.wait_for_notification(types.PROGRESS)
    [sequence] = kinds()
    assert sequence[0] == "begin" and sequence[-1] == "end"


async def test_syntax_errors_are_hints_when_nvcc_is_missing(tmp_path: Path) -> None:
    path = tmp_path / "k.cu"
    path.write_text("__global__ void k(int* p) { p[0] = ; }\n")
    async with lsp_session(tmp_path, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, path)
        diagnostics = await wait_diagnostics(client, uri)
    syntax = [d for d in diagnostics if d.source == "kernel-lsp (tree-sitter)"]
    assert syntax and all(d.severity == types.DiagnosticSeverity.Hint for d in syntax)
    assert syntax[0].range.start.line == 0
    assert not [d for d in diagnostics if d.severity in (types.DiagnosticSeverity.Error, types.DiagnosticSeverity.Warning)]

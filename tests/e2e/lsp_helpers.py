"""Helpers for end-to-end tests: the real server in a subprocess, driven by pytest-lsp.

``lsp_session(root, ...)`` starts ``python -m kernel_lsp serve`` with
``KERNEL_LSP_RAISE=1`` (handler bugs fail the test instead of becoming empty
answers) and an isolated user config file, initializes it like VS Code does,
and shuts it down afterwards. Helpers wait on notifications, never sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

HAS_NVCC = shutil.which("nvcc") is not None


def needs_nvcc(test: Any) -> Any:
    """Mark a test ``nvcc`` (selectable with ``-m nvcc``) and skip it when nvcc is not on PATH."""
    return pytest.mark.nvcc(pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")(test))

#: A small, valid CUDA file: two kernels (one templated), a device function, launches.
SAXPY = """\
#include <cuda_runtime.h>
#define BLOCK 256

__device__ float twice(float v) { return 2.0f * v; }

__global__ void saxpy(int n, float a, const float* __restrict__ x, float* __restrict__ y) {
    __shared__ float cache[BLOCK];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        cache[threadIdx.x] = x[i];
        __syncthreads();
        y[i] = a * twice(cache[threadIdx.x]) + y[i];
    }
}

template <int N>
__global__ void scale(float* p) { p[threadIdx.x] *= N; }

void run(int n, float a, const float* x, float* y) {
    saxpy<<<(n + BLOCK - 1) / BLOCK, BLOCK>>>(n, a, x, y);
    scale<4><<<1, 1024>>>(y);
}
"""


def position_of(text: str, needle: str, offset: int = 0, occurrence: int = 0) -> types.Position:
    """LSP position (UTF-16) of ``needle``'s ``occurrence``-th match plus ``offset`` characters."""
    index = -1
    for _ in range(occurrence + 1):
        index = text.index(needle, index + 1)
    index += offset
    line = text.count("\n", 0, index)
    line_start = text.rfind("\n", 0, index) + 1
    prefix = text[line_start:index]
    return types.Position(line=line, character=len(prefix.encode("utf-16-le")) // 2)


@contextlib.asynccontextmanager
async def lsp_session(
    root: Path,
    *,
    init_options: dict[str, Any] | None = None,
    workspace_settings: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    capabilities: types.ClientCapabilities | None = None,
) -> AsyncIterator[LanguageClient]:
    server_env = {
        **os.environ,
        "KERNEL_LSP_RAISE": "1",
        # Isolate from the developer's own ~/.config/kernel-lsp/settings.json.
        "KERNEL_LSP_CONFIG": str(root / ".no-user-settings.json"),
        **(env or {}),
    }
    config = ClientServerConfig(server_command=[sys.executable, "-m", "kernel_lsp", "serve"], server_env=server_env)
    client: LanguageClient = await config.start()  # type: ignore[assignment]
    if workspace_settings is not None:
        client.set_configuration(workspace_settings, section="kernelLsp")
    await client.initialize_session(types.InitializeParams(
        capabilities=capabilities or client_capabilities("visual-studio-code"),
        root_uri=root.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name=root.name)],
        initialization_options=init_options,
    ))
    try:
        yield client
    finally:
        await client.shutdown_session()
        await client.stop()


def open_doc(client: LanguageClient, path: Path, text: str | None = None, version: int = 1) -> str:
    """didOpen ``path`` with ``text`` (default: the file's contents); returns the URI."""
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(
            uri=uri, language_id="cuda", version=version,
            text=path.read_text(encoding="utf-8", errors="replace") if text is None else text,
        )
    ))
    return uri


async def wait_diagnostics(
    client: LanguageClient,
    uri: str,
    predicate: Callable[[Sequence[types.Diagnostic]], bool] = lambda _: True,
    timeout_s: float = 180.0,
) -> Sequence[types.Diagnostic]:
    """Wait until the diagnostics published for ``uri`` satisfy ``predicate``."""
    async with asyncio.timeout(timeout_s):
        while not (uri in client.diagnostics and predicate(client.diagnostics[uri])):
            await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    return client.diagnostics[uri]


async def wait_message(client: LanguageClient, needle: str, timeout_s: float = 180.0) -> types.ShowMessageParams:
    """Wait for a ``window/showMessage`` containing ``needle``."""
    async with asyncio.timeout(timeout_s):
        while True:
            for message in client.messages:
                if needle in message.message:
                    return message
            await client.wait_for_notification(types.WINDOW_SHOW_MESSAGE)


def hover_text(hover: types.Hover | None) -> str:
    assert hover is not None
    contents = hover.contents
    assert isinstance(contents, types.MarkupContent)
    return contents.value

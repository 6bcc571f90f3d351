"""Real-editor tests: headless Neovim loads editors/nvim and talks to a server.

Each test writes a minimal init.lua that puts editors/nvim on 'runtimepath',
calls ``require("kernel_lsp").setup{}`` and, once Neovim has started, opens a
.cu file, waits for the client to attach, asks for a hover through Neovim's own
client (``vim.lsp.buf_request_sync``) and writes what it saw to a JSON file.

- ``test_hover_from_real_server`` runs ``python -m kernel_lsp serve``.
- ``test_plugin_plumbing`` runs a small recording server (pygls) that answers
  hover with what it received (initializationOptions, the answer to its
  ``workspace/configuration`` request, languageId, root),
  so the plugin's side of the protocol is checked exactly, including restart.

Skipped when ``nvim`` is not installed (Debian: ``apt-get install neovim``).
Debian 12's Neovim is 0.7.2, which exercises the plugin's pre-0.8 path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# KERNEL_LSP_TEST_NVIM picks another Neovim build (e.g. a newer one, to run the vim.lsp.start path).
NVIM = shutil.which(os.environ.get("KERNEL_LSP_TEST_NVIM", "nvim"))
REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIR = REPO / "editors" / "nvim"
# Per wait inside Neovim; the whole Neovim run gets a little more than two of them.
WAIT_MS = 30_000

pytestmark = [pytest.mark.skipif(NVIM is None, reason="nvim is not installed"), pytest.mark.timeout(120)]

# Runs inside Neovim. Everything is in one pcall so that a failure is written to
# the result file and Neovim still quits instead of hanging the test.
INIT_LUA = r"""
local params = vim.json.decode(io.open(os.getenv("KERNEL_LSP_TEST_PARAMS")):read("*a"))
local result = {}

local function finish()
  local out = io.open(params.out, "w")
  out:write(vim.json.encode(result))
  out:close()
  vim.cmd("qa!")
end

vim.opt.runtimepath:prepend(params.plugin_dir)
local kernel_lsp = require("kernel_lsp")
local attached = {}
local exited = nil
kernel_lsp.setup({
  cmd = params.cmd,
  settings = params.settings,
  on_attach = function(client, bufnr)
    table.insert(attached, { client = client.id, bufnr = bufnr })
  end,
  on_exit = function(code, signal, client_id)
    if code ~= 0 then
      exited = string.format("server (client %s) exited with code %d, signal %d", tostring(client_id), code, signal)
    end
  end,
})

local function wait_attach(bufnr, count)
  local ok = vim.wait(params.wait_ms, function()
    if exited then return true end
    local n = 0
    for _, a in ipairs(attached) do
      if a.bufnr == bufnr then n = n + 1 end
    end
    return n >= count
  end, 20)
  if exited then error(exited .. "; see lsp.log for its stderr") end
  if not ok then error("no kernel-lsp client attached to buffer " .. bufnr .. " in time") end
  return attached[#attached].client
end

local function hover(bufnr)
  local responses, err = vim.lsp.buf_request_sync(bufnr, "textDocument/hover", {
    textDocument = { uri = vim.uri_from_bufnr(bufnr) },
    position = { line = params.line, character = params.character },
  }, params.wait_ms)
  if not responses then error("hover request failed: " .. tostring(err)) end
  for _, response in pairs(responses) do
    if response.err then error("hover error: " .. vim.inspect(response.err)) end
    if response.result and response.result.contents then
      local lines = vim.lsp.util.convert_input_to_markdown_lines(response.result.contents)
      return table.concat(lines, "\n")
    end
  end
  return nil
end

local function run()
  local v = vim.version()
  result.nvim_version = string.format("%d.%d.%d", v.major, v.minor, v.patch)
  result.used_vim_lsp_start = vim.lsp.start ~= nil

  vim.cmd("edit " .. vim.fn.fnameescape(params.file))
  local bufnr = vim.api.nvim_get_current_buf()
  result.filetype = vim.bo[bufnr].filetype
  local client_id = wait_attach(bufnr, 1)
  result.client_id = client_id
  result.root_dir = vim.lsp.get_client_by_id(client_id).config.root_dir
  result.hover = hover(bufnr)

  if params.second_file then
    vim.cmd("edit " .. vim.fn.fnameescape(params.second_file))
    result.second_client_id = wait_attach(vim.api.nvim_get_current_buf(), 1)
    vim.cmd("buffer " .. bufnr)
  end

  if params.restart then
    vim.cmd("KernelLspRestart")
    result.restarted_client_id = wait_attach(bufnr, 2)
    result.hover_after_restart = hover(bufnr)
  end
end

vim.api.nvim_create_autocmd("VimEnter", {
  once = true,
  -- nested: the :edit below must fire BufRead/FileType as it does for a user.
  nested = true,
  callback = function()
    local ok, err = xpcall(run, debug.traceback)
    if not ok then result.error = err end
    finish()
  end,
})
"""

# A recording LSP server: hover answers with JSON of everything it was sent.
RECORDING_SERVER = textwrap.dedent(
    """
    import asyncio, json, os
    from lsprotocol import types
    from pygls.lsp.server import LanguageServer

    server = LanguageServer("recording-server", "0")
    seen = {"pid": os.getpid(), "opened": []}
    configured = asyncio.Event()

    @server.feature(types.INITIALIZE)
    def initialize(params):
        seen["init_options"] = params.initialization_options
        seen["root_uri"] = params.root_uri

    @server.feature(types.INITIALIZED)
    async def initialized(params):
        answer = await server.workspace_configuration_async(
            types.ConfigurationParams(items=[types.ConfigurationItem(section="kernelLsp")])
        )
        seen["configuration"] = answer
        configured.set()

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(params):
        seen["opened"].append({"uri": params.text_document.uri, "languageId": params.text_document.language_id})

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    async def hover(params):
        await configured.wait()
        return types.Hover(contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=json.dumps(seen)))

    server.start_io()
    """
)

SAXPY = """\
#include <cuda_runtime.h>

__global__ void saxpy(int n, float a, const float* __restrict__ x, float* __restrict__ y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

void run(int n, float a, const float* x, float* y) {
    saxpy<<<(n + 255) / 256, 256>>>(n, a, x, y);
}
"""


def run_nvim(tmp_path: Path, **params: object) -> dict:
    """Run headless Neovim with INIT_LUA and ``params``; return what it recorded."""
    init = tmp_path / "init.lua"
    init.write_text(INIT_LUA, encoding="utf-8")
    out = tmp_path / "result.json"
    params_file = tmp_path / "params.json"
    params_file.write_text(
        json.dumps({"plugin_dir": str(PLUGIN_DIR), "out": str(out), "wait_ms": WAIT_MS, **params}), encoding="utf-8"
    )
    home = tmp_path / "home"
    env = {
        **os.environ,
        "KERNEL_LSP_TEST_PARAMS": str(params_file),
        # Keep Neovim's log/state and the server's user config file out of the real home.
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
    }
    proc = subprocess.run(
        [NVIM, "--headless", "--clean", "-u", str(init)],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=3 * WAIT_MS / 1000,
    )
    assert out.exists(), f"Neovim wrote no result (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(out.read_text(encoding="utf-8"))
    # Neovim keeps the server's stderr in lsp.log (cache dir on 0.7, state dir later).
    result["lsp_log"] = "".join(log.read_text(errors="replace")[-4000:] for log in home.rglob("lsp.log"))
    if "error" in result:
        pytest.fail(f"{result['error']}\n{proc.stderr}\nlsp.log:\n{result['lsp_log']}")
    return result


def position_of(text: str, needle: str) -> tuple[int, int]:
    """0-based (line, character) of the first ``needle``, pointing inside it."""
    for line_no, line in enumerate(text.splitlines()):
        col = line.find(needle)
        if col >= 0:
            return line_no, col + 1
    raise AssertionError(f"{needle!r} not in text")


def test_hover_from_real_server(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    cu = project / "saxpy.cu"
    cu.write_text(SAXPY, encoding="utf-8")
    line, character = position_of(SAXPY, "saxpy(int n")

    result = run_nvim(
        tmp_path,
        cmd=[sys.executable, "-m", "kernel_lsp", "serve"],
        settings={"kernelLsp": {"arch": "sm_90"}},
        file=str(cu),
        line=line,
        character=character,
    )

    assert result["filetype"] == "cuda"
    hover = result.get("hover")
    assert hover, f"no hover from the server; lsp.log:\n{result['lsp_log']}"
    assert "__global__ void saxpy(int n, float a," in hover


def test_plugin_plumbing(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    (project / "src").mkdir(parents=True)
    (project / "compile_commands.json").write_text("[]", encoding="utf-8")
    first = project / "src" / "a.cu"
    second = project / "src" / "b.cuh"
    first.write_text(SAXPY, encoding="utf-8")
    second.write_text("__device__ float twice(float v) { return 2.0f * v; }\n", encoding="utf-8")
    server = tmp_path / "recording_server.py"
    server.write_text(RECORDING_SERVER, encoding="utf-8")
    settings = {"arch": "sm_80", "extraFlags": ["-std=c++17"], "compileOnChange": True}

    result = run_nvim(
        tmp_path,
        cmd=[sys.executable, str(server)],
        # The bare form; the plugin wraps it in the kernelLsp section.
        settings=settings,
        file=str(first),
        second_file=str(second),
        line=0,
        character=0,
        restart=True,
    )

    seen = json.loads(result["hover"])
    assert result["filetype"] == "cuda"
    assert Path(result["root_dir"]) == project
    assert seen["root_uri"] == project.as_uri()
    assert seen["init_options"] == settings
    assert seen["configuration"] == [settings]
    assert seen["opened"][0] == {"uri": first.as_uri(), "languageId": "cuda"}
    # One server per root: the header in the same project reuses the client.
    assert result["second_client_id"] == result["client_id"]
    after = json.loads(result["hover_after_restart"])
    assert result["restarted_client_id"] != result["client_id"]
    assert after["pid"] != seen["pid"]
    assert {"uri": first.as_uri(), "languageId": "cuda"} in after["opened"]

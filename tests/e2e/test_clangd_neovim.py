"""kernel-lsp beside clangd-19 in one Neovim, on one .cu file: the documented set-up (editors/README.md,
"Beside clangd") works and shows each error once.

Headless Neovim attaches both servers to a .cu file with an error in a kernel, with the shipped
clangd config (editors/clangd/config.yaml) as the user's clangd config. Checked: both clients are
attached; kernel-lsp reports nvcc's error and clangd publishes nothing for the file; clangd still
completes (``threadIdx.`` offers ``x``) and goes from the launch to the kernel; kernel-lsp still
hovers. A run without the config shows that without it clangd reports the same error again.

Runs on every Neovim the real-editor tests find (tests/e2e/test_neovim.py); skipped without
clangd-19, nvcc or Neovim.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_neovim import PLUGIN_DIR, REPO, neovims, version_tuple

CLANGD = shutil.which("clangd-19")
CLANGD_CONFIG = REPO / "editors" / "clangd" / "config.yaml"
WAIT_MS = 40_000

pytestmark = [
    pytest.mark.skipif(CLANGD is None, reason="clangd-19 is not installed (apt-get install clangd-19)"),
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH"),
    pytest.mark.timeout(180),
]

BROKEN = """\
#include <cuda_runtime.h>

__global__ void saxpy(int n, float a, const float* __restrict__ x, float* __restrict__ y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i] + undeclared_offset;
}

void run(int n, float a, const float* x, float* y) {
    saxpy<<<(n + 255) / 256, 256>>>(n, a, x, y);
}
"""

# Both servers as a user would configure them (editors/README.md): on 0.11+ through
# vim.lsp.config/vim.lsp.enable, on 0.7 through start_client; kernel-lsp through its plugin.
INIT_LUA = r"""
local params = vim.json.decode(io.open(os.getenv("KERNEL_LSP_TEST_PARAMS")):read("*a"))
local result = { published = {}, attached = {} }

local function finish()
  local out = io.open(params.out, "w")
  out:write(vim.json.encode(result))
  out:close()
  vim.cmd("qa!")
end

local names = {}
local publications = {}
local default_publish = vim.lsp.handlers["textDocument/publishDiagnostics"]
vim.lsp.handlers["textDocument/publishDiagnostics"] = function(err, res, ctx, cfg)
  local name = names[ctx.client_id] or tostring(ctx.client_id)
  local lines = {}
  for _, d in ipairs(res.diagnostics) do table.insert(lines, d.range.start.line) end
  publications[name] = lines
  return default_publish(err, res, ctx, cfg)
end

local function remember(client, bufnr)
  names[client.id] = client.name
  result.attached[client.name] = true
end

vim.opt.runtimepath:prepend(params.plugin_dir)
require("kernel_lsp").setup({ cmd = params.kernel_lsp_cmd, on_attach = remember })

if vim.lsp.config and vim.lsp.enable then
  vim.lsp.config("clangd", {
    cmd = { params.clangd },
    filetypes = { "c", "cpp", "cuda" },
    root_markers = { "compile_commands.json", ".git" },
    on_attach = remember,
  })
  vim.lsp.enable("clangd")
else
  local clangd_id = nil
  vim.api.nvim_create_autocmd("FileType", {
    pattern = { "c", "cpp", "cuda" },
    callback = function(args)
      clangd_id = clangd_id or vim.lsp.start_client({
        name = "clangd", cmd = { params.clangd }, on_attach = remember,
        root_dir = vim.fn.fnamemodify(vim.api.nvim_buf_get_name(args.buf), ":p:h"),
      })
      vim.lsp.buf_attach_client(args.buf, clangd_id)
    end,
  })
end

local function request(bufnr, method, line, character)
  local responses = vim.lsp.buf_request_sync(bufnr, method, {
    textDocument = { uri = vim.uri_from_bufnr(bufnr) },
    position = { line = line, character = character },
  }, params.wait_ms) or {}
  local by_name = {}
  for id, response in pairs(responses) do
    if response.result ~= nil then by_name[names[id] or tostring(id)] = response.result end
  end
  return by_name
end

local function run()
  local v = vim.version()
  result.nvim_version = string.format("%d.%d.%d", v.major, v.minor, v.patch)
  vim.cmd("edit " .. vim.fn.fnameescape(params.file))
  local bufnr = vim.api.nvim_get_current_buf()
  if not vim.wait(params.wait_ms, function() return result.attached.kernel_lsp and result.attached.clangd end, 20) then
    error("both servers did not attach: " .. vim.inspect(result.attached))
  end
  -- kernel-lsp publishes after nvcc ran; clangd after its first parse (an empty list when suppressed).
  if not vim.wait(params.wait_ms, function() return publications.kernel_lsp and publications.clangd end, 20) then
    error("not both servers published diagnostics: " .. vim.inspect(publications))
  end
  result.published = publications
  result.buffer_diagnostics = #vim.diagnostic.get(bufnr)

  -- Before its first build of the file clangd answers completion from the identifiers it saw
  -- (a fallback without member access): ask again, a bounded number of times, until it has the AST.
  for _ = 1, 20 do
    local completion = request(bufnr, "textDocument/completion", params.complete[1], params.complete[2]).clangd
    local items = completion and (completion.items or completion) or {}
    result.completion_labels = {}
    local members = 0
    for _, item in ipairs(items) do
      local label = vim.trim(item.filterText or item.label)
      table.insert(result.completion_labels, label)
      if label == "z" then members = members + 1 end
    end
    if members > 0 then break end
    vim.wait(250)
  end
  local definition = request(bufnr, "textDocument/definition", params.launch[1], params.launch[2]).clangd
  if definition then
    local first = definition[1] or definition
    result.definition_line = (first.range or first.targetSelectionRange).start.line
  end
  local hover = request(bufnr, "textDocument/hover", params.kernel[1], params.kernel[2]).kernel_lsp
  if hover then
    result.kernel_lsp_hover = table.concat(vim.lsp.util.convert_input_to_markdown_lines(hover.contents), "\n")
  end
end

vim.api.nvim_create_autocmd("VimEnter", {
  once = true,
  nested = true,
  callback = function()
    local ok, err = xpcall(run, debug.traceback)
    if not ok then result.error = err end
    finish()
  end,
})
"""


def _position(text: str, needle: str, offset: int = 1) -> list[int]:
    for line_no, line in enumerate(text.splitlines()):
        col = line.find(needle)
        if col >= 0:
            return [line_no, col + offset]
    raise AssertionError(needle)


def _run(tmp_path: Path, nvim: str, with_config: bool) -> dict:
    project = tmp_path / "proj"
    project.mkdir()
    (project / ".git").mkdir()
    cu = project / "saxpy.cu"
    # The completion point: "threadIdx." with the member to be completed.
    text = BROKEN.replace("threadIdx.x;", "threadIdx.x;\n    int lane = threadIdx.x % 32; (void)threadIdx.y;")
    cu.write_text(text, encoding="utf-8")
    home = tmp_path / "home"
    if with_config:
        (home / ".config" / "clangd").mkdir(parents=True)
        shutil.copy(CLANGD_CONFIG, home / ".config" / "clangd" / "config.yaml")
    init = tmp_path / "init.lua"
    init.write_text(INIT_LUA, encoding="utf-8")
    out = tmp_path / "result.json"
    params = {
        "plugin_dir": str(PLUGIN_DIR), "out": str(out), "wait_ms": WAIT_MS, "file": str(cu), "clangd": CLANGD,
        "kernel_lsp_cmd": [sys.executable, "-m", "kernel_lsp", "serve"],
        "complete": _position(text, "threadIdx.y", len("threadIdx.")),
        "launch": _position(text, "saxpy<<<"),
        "kernel": _position(text, "saxpy(int n"),
    }
    (tmp_path / "params.json").write_text(json.dumps(params), encoding="utf-8")
    env = {
        **os.environ,
        "KERNEL_LSP_TEST_PARAMS": str(tmp_path / "params.json"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
    }
    proc = subprocess.run([neovims()[nvim], "--headless", "--clean", "-u", str(init)], cwd=project, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=150)
    assert out.exists(), f"Neovim wrote no result (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(out.read_text(encoding="utf-8"))
    if "error" in result:
        logs = "".join(p.read_text(errors="replace")[-3000:] for p in home.rglob("lsp.log"))
        pytest.fail(f"{result['error']}\n{proc.stderr}\nlsp.log:\n{logs}")
    result["error_line"] = _position(text, "undeclared_offset")[0]
    result["kernel_line"] = _position(text, "saxpy(int n")[0]
    return result


@pytest.fixture(params=sorted(neovims(), key=version_tuple) or ["none"])
def nvim(request: pytest.FixtureRequest) -> str:
    if request.param == "none":
        pytest.skip("nvim is not installed")
    return request.param


def test_clangd_and_kernel_lsp_share_a_cuda_file_without_duplicate_diagnostics(tmp_path: Path, nvim: str) -> None:
    result = _run(tmp_path, nvim, with_config=True)

    assert result["attached"] == {"kernel_lsp": True, "clangd": True}
    assert result["error_line"] in result["published"]["kernel_lsp"], result["published"]
    assert result["published"]["clangd"] == [], "clangd must leave .cu diagnostics to kernel-lsp"
    assert result["buffer_diagnostics"] == len(result["published"]["kernel_lsp"])
    # What clangd is kept for: completion and navigation.
    assert {"x", "y", "z"} <= set(result["completion_labels"]), result["completion_labels"]
    assert result["definition_line"] == result["kernel_line"]
    # What kernel-lsp is there for: CUDA facts.
    assert "__global__ void saxpy(int n, float a," in result["kernel_lsp_hover"]


def test_without_the_config_clangd_repeats_the_error(tmp_path: Path, nvim: str) -> None:
    if version_tuple(nvim) < (0, 11):
        pytest.skip("the control run once, on the current Neovim")
    result = _run(tmp_path, nvim, with_config=False)
    assert result["error_line"] in result["published"]["clangd"]
    assert result["error_line"] in result["published"]["kernel_lsp"]

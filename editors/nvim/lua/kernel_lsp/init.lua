-- Neovim client for the kernel-lsp language server (Neovim 0.7 and newer).
--
--   require("kernel_lsp").setup({ settings = { kernelLsp = { arch = "sm_80" } } })
--
-- Starts `kernel-lsp serve` for CUDA buffers, one server per project root (the
-- nearest folder upwards with a root marker); files outside any project share
-- one server. On Neovim 0.11+ it registers a vim.lsp.config and enables it
-- (the same config as lsp/kernel_lsp.lua, so `vim.lsp.enable("kernel_lsp")`
-- alone works too); on 0.8-0.10 it calls vim.lsp.start; on 0.7
-- vim.lsp.start_client + vim.lsp.buf_attach_client. See :help kernel_lsp.

local M = {}

local SECTION = "kernelLsp"

M.defaults = {
  name = "kernel_lsp",
  cmd = { "kernel-lsp", "serve" },
  filetypes = { "cuda" },
  -- Nearest folder upwards holding one of these is the root; no marker: the shared single-file server.
  root_markers = { "compile_commands.json", ".git", "CMakeLists.txt", "Makefile" },
  -- { kernelLsp = { nvccPath = ..., arch = ..., ... } }; the keys are kernel-lsp's settings.
  settings = {},
  -- Defaults to settings.kernelLsp.
  init_options = nil,
  capabilities = nil,
  on_attach = nil,
  -- function(code, signal, client_id), after the server process exits.
  on_exit = nil,
  handlers = nil,
  -- Show code lenses (refreshed on attach, save and leaving insert mode).
  codelens = true,
  -- Show inlay hints where Neovim supports them (0.10+).
  inlay_hints = true,
}

local config = nil
-- 0.7 only: root folder (or "" for files outside any project) -> client id.
local clients_by_root = {}

--- Whether this Neovim has the 0.11 configuration API (vim.lsp.config / vim.lsp.enable).
function M.has_native_config()
  return vim.lsp.config ~= nil and vim.lsp.enable ~= nil
end

local function get_clients()
  if vim.lsp.get_clients then
    return vim.lsp.get_clients()
  end
  return vim.lsp.get_active_clients()
end

local function notify(msg, level)
  vim.schedule(function()
    vim.notify("kernel-lsp: " .. msg, level or vim.log.levels.WARN)
  end)
end

-- An empty Lua table encodes as a JSON array; the server expects objects.
local function as_object(tbl)
  if tbl == nil or next(tbl) == nil then
    return vim.empty_dict()
  end
  return tbl
end

-- Accept both { kernelLsp = { ... } } and the bare { arch = ..., ... }.
local function normalize_settings(settings)
  settings = settings or {}
  if settings[SECTION] == nil and next(settings) ~= nil then
    settings = { [SECTION] = settings }
  end
  if settings[SECTION] ~= nil then
    settings[SECTION] = as_object(settings[SECTION])
  end
  return settings
end

local function is_dir_with(dir, marker)
  return vim.loop.fs_stat(dir .. "/" .. marker) ~= nil
end

--- Root folder for a file path: the nearest ancestor holding a root marker, or nil
--- when there is none (the file then shares the one server of files outside a project).
function M.root_dir(path, markers)
  markers = markers or (config and config.root_markers) or M.defaults.root_markers
  if path == nil or path == "" then
    return nil
  end
  local dir = vim.fn.fnamemodify(path, ":p:h")
  while dir do
    for _, marker in ipairs(markers) do
      if is_dir_with(dir, marker) then
        return dir
      end
    end
    local parent = vim.fn.fnamemodify(dir, ":h")
    if parent == dir then
      break
    end
    dir = parent
  end
  return nil
end

--- Code lens refresh and inlay hints for a buffer; Neovim's API for both changed across versions.
function M.enable_views(client, bufnr, opts)
  opts = opts or { codelens = true, inlay_hints = true }
  local caps = client.server_capabilities or {}
  if opts.codelens and caps.codeLensProvider then
    local group = vim.api.nvim_create_augroup("kernel_lsp_codelens_" .. bufnr, { clear = true })
    local function refresh()
      -- pcall: the codelens API changed shape across versions; a failure must not break editing.
      pcall(vim.lsp.codelens.refresh, { bufnr = bufnr })
    end
    vim.api.nvim_create_autocmd({ "BufEnter", "InsertLeave", "BufWritePost" }, {
      group = group,
      buffer = bufnr,
      callback = refresh,
    })
    refresh()
  end
  if opts.inlay_hints and vim.lsp.inlay_hint and caps.inlayHintProvider then
    pcall(vim.lsp.inlay_hint.enable, true, { bufnr = bufnr })
  end
end

local function on_attach(client, bufnr)
  M.enable_views(client, bufnr, config)
  if config.on_attach then
    config.on_attach(client, bufnr)
  end
end

local function on_exit(code, signal, client_id)
  if code ~= 0 then
    notify(string.format("server exited with code %d (signal %d); :KernelLspRestart starts it again", code, signal or 0))
  end
  if config.on_exit then
    config.on_exit(code, signal, client_id)
  end
end

local function init_options()
  local options = config.init_options
  if options == nil then
    options = config.settings[SECTION]
  end
  return as_object(options)
end

--- The options every path shares (the 0.11 config adds filetypes and root markers).
local function base_config()
  return {
    name = config.name,
    cmd = config.cmd,
    -- `settings` answers workspace/configuration: Neovim's built-in handler
    -- looks the requested section up in it.
    settings = config.settings,
    init_options = init_options(),
    capabilities = config.capabilities or vim.lsp.protocol.make_client_capabilities(),
    handlers = config.handlers,
    on_attach = on_attach,
    on_exit = on_exit,
  }
end

local function client_config(root)
  local conf = base_config()
  conf.root_dir = root
  conf.workspace_folders = root and { { uri = vim.uri_from_fname(root), name = root } } or nil
  return conf
end

--- The vim.lsp.config table of Neovim 0.11+ (also what lsp/kernel_lsp.lua returns, with the defaults).
function M.native_config(opts)
  if opts ~= nil or config == nil then
    M.configure(opts)
  end
  local conf = base_config()
  conf.filetypes = config.filetypes
  conf.root_markers = config.root_markers
  return conf
end

local function start_legacy(bufnr, root)
  local key = root or ""
  local id = clients_by_root[key]
  if id and not vim.lsp.client_is_stopped(id) then
    vim.lsp.buf_attach_client(bufnr, id)
    return id
  end
  local ok, new_id = pcall(vim.lsp.start_client, client_config(root))
  if not ok or not new_id then
    notify("could not start " .. table.concat(config.cmd, " ") .. ": " .. tostring(new_id), vim.log.levels.ERROR)
    return nil
  end
  clients_by_root[key] = new_id
  vim.lsp.buf_attach_client(bufnr, new_id)
  return new_id
end

--- Start (or reuse) the server for a buffer and attach it. Returns the client id or nil.
function M.attach(bufnr)
  if config == nil then
    error("kernel_lsp: call require('kernel_lsp').setup() first")
  end
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  if vim.bo[bufnr].buftype ~= "" then
    return nil
  end
  if vim.fn.executable(config.cmd[1]) ~= 1 then
    notify("server command not found: " .. config.cmd[1] .. " (make install in the kernel-lsp checkout links ~/.local/bin/kernel-lsp, or set cmd in setup())", vim.log.levels.ERROR)
    return nil
  end
  local root = M.root_dir(vim.api.nvim_buf_get_name(bufnr))
  if vim.lsp.start then
    -- Same root (nil for files outside a project included) and same name: one client.
    return vim.lsp.start(client_config(root), {
      bufnr = bufnr,
      reuse_client = function(client, conf)
        return client.name == conf.name and client.config.root_dir == conf.root_dir
      end,
    })
  end
  return start_legacy(bufnr, root)
end

local function our_clients()
  local found = {}
  for _, client in ipairs(get_clients()) do
    if client.name == config.name then
      table.insert(found, client)
    end
  end
  return found
end

local function matching_buffers()
  local wanted = {}
  for _, ft in ipairs(config.filetypes) do
    wanted[ft] = true
  end
  local bufs = {}
  for _, bufnr in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(bufnr) and wanted[vim.bo[bufnr].filetype] then
      table.insert(bufs, bufnr)
    end
  end
  return bufs
end

--- Stop the servers, then start them again for every open CUDA buffer.
function M.restart()
  -- By id through vim.lsp: client methods changed from client.f() to client:f() in 0.11.
  local ids = {}
  for _, client in ipairs(our_clients()) do
    table.insert(ids, client.id)
    vim.lsp.stop_client(client.id)
  end
  clients_by_root = {}
  -- A stopped client leaves the list get_client_by_id looks in.
  vim.wait(5000, function()
    for _, id in ipairs(ids) do
      if vim.lsp.get_client_by_id(id) ~= nil then
        return false
      end
    end
    return true
  end, 50)
  if M.has_native_config() then
    -- enable() runs its FileType handler again for every loaded buffer.
    vim.lsp.enable(config.name)
    return
  end
  for _, bufnr in ipairs(matching_buffers()) do
    M.attach(bufnr)
  end
end

--- Resolve the options (defaults < opts) without starting anything.
function M.configure(opts)
  -- Shallow merge: list options (cmd, filetypes) replace the defaults whole.
  config = vim.tbl_extend("force", M.defaults, opts or {})
  config.settings = normalize_settings(config.settings)
  return config
end

function M.setup(opts)
  M.configure(opts)

  local group = vim.api.nvim_create_augroup("kernel_lsp", { clear = true })
  -- Neovim's own detection maps *.cu/*.cuh to cuda; this covers setups where detection is off.
  vim.api.nvim_create_autocmd({ "BufRead", "BufNewFile" }, {
    group = group,
    pattern = { "*.cu", "*.cuh" },
    -- nested: setting the filetype must fire FileType, which attaches the server.
    nested = true,
    callback = function(args)
      if vim.bo[args.buf].filetype == "" then
        vim.bo[args.buf].filetype = "cuda"
      end
    end,
  })
  vim.api.nvim_create_user_command("KernelLspRestart", M.restart, { desc = "Restart the kernel-lsp server" })

  if M.has_native_config() then
    -- Neovim's own root markers, reuse and FileType handling; enable() also attaches open buffers.
    vim.lsp.config(config.name, M.native_config())
    vim.lsp.enable(config.name)
    return
  end

  vim.api.nvim_create_autocmd("FileType", {
    group = group,
    pattern = config.filetypes,
    callback = function(args)
      M.attach(args.buf)
    end,
  })
  -- setup() may run after CUDA buffers were already opened (lazy loading).
  for _, bufnr in ipairs(matching_buffers()) do
    M.attach(bufnr)
  end
end

return M

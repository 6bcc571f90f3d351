-- kernel-lsp for Neovim 0.11+'s vim.lsp.config, in the form nvim-lspconfig uses: with
-- editors/nvim on 'runtimepath', `vim.lsp.enable("kernel_lsp")` starts it for CUDA buffers,
-- one server per project root (compile_commands.json, .git, CMakeLists.txt, Makefile) and one
-- for files outside any project. Override fields with vim.lsp.config("kernel_lsp", { ... }),
-- e.g. settings = { kernelLsp = { arch = "sm_80" } }. require("kernel_lsp").setup() does both.
return require("kernel_lsp").native_config()

"""Subcommands of ``kernel-lsp``: one module each, discovered by ``kernel_lsp.cli``."""

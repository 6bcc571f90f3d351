"""kernel-lsp: a language server that makes CUDA kernels faster from inside the editor."""

__version__ = "0.1.0"

"""The language server: the only package that imports pygls and lsprotocol.

Invariant: handlers convert LSP -> core/service call -> LSP and stay thin.
"""

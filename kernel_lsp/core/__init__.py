"""The pure analysis core.

Invariant: nothing in this package does IO, reads a clock, starts a process or
imports pygls/lsprotocol. Inputs are strings and numbers; outputs are frozen
dataclasses. Positions are (0-based line, 0-based UTF-8 byte column) pairs and
byte offsets; conversion to the editor's UTF-16 happens in ``kernel_lsp.server``.
"""

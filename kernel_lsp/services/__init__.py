"""Services: everything that touches the outside world (processes, GPU, files, databases, models).

Invariant: every subprocess goes through ``kernel_lsp.services.proc.run``; GPU
work runs in a child process; nothing here imports pygls/lsprotocol.
"""

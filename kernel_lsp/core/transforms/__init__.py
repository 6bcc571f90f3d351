"""Transformations driven by the access analysis (:mod:`kernel_lsp.core.analysis`).

Each is a :class:`~kernel_lsp.core.rules.base.Rule` whose preconditions are stated in terms of
the analysis' facts (never the text's shape) and whose rewrite is emitted by
:mod:`kernel_lsp.core.transforms.emit` from the kernel's own statements.
"""

"""The verification harness: only correct and genuinely faster rewrites pass.

Public API (the optimizer and the CLI use these)::

    verify(original_source, candidate_source, spec, options=VerifyOptions(), cancel=None) -> Verdict
    load_spec_file(path) -> Spec

GPU work happens only in child processes (``child`` for verification,
``launch`` for profilers and compute-sanitizer); this package never imports pycuda.
"""

from kernel_lsp.services.harness.specfile import load_spec_file
from kernel_lsp.services.harness.verify import GpuUnavailable, VerifyCancelled, VerifyOptions, verify

__all__ = ["GpuUnavailable", "VerifyCancelled", "VerifyOptions", "load_spec_file", "verify"]

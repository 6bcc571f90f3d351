"""Scripted verifiers for the sweep's tests: picklable (they travel to Ray workers), and every verification
they make is appended to a log file, so a test sees what was verified in any process."""

from __future__ import annotations

import hashlib
import os
import threading

from kernel_lsp.core.spec import Spec
from kernel_lsp.core.verdict import Reason, Verdict

#: What a rewrite adds -> the speedup the script gives it (below 1.05: correct but not faster); "__shfl_": any
#: warp shuffle (the reduction rewrites use the xor butterfly).
SPEEDUPS = {"kl_tile": 2.4, "__shfl_": 1.8, "__launch_bounds__": 1.3, "__restrict__": 1.01}


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class LoggingVerifier:
    """Verdicts by what the candidate adds to the original (:data:`SPEEDUPS`); anything else is a mismatch.

    ``crash_marker``: the first time a worker reaches its second verification while this file does not
    exist, the file is made and the process dies at once, as a lost worker does (Ray tests only).
    """

    def __init__(self, log_path: str, crash_marker: str | None = None):
        self.log_path = log_path
        self.crash_marker = crash_marker

    def calls(self) -> list[str]:
        if not os.path.exists(self.log_path):
            return []
        with open(self.log_path, encoding="utf-8") as f:
            return f.read().split()

    def __call__(self, original: str, candidate: str, spec: Spec, cancel: threading.Event | None) -> Verdict:
        if self.crash_marker is not None and len(self.calls()) == 1 and not os.path.exists(self.crash_marker):
            open(self.crash_marker, "w").close()
            os._exit(1)
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(f"{digest(original)}:{digest(candidate)}\n")
        for marker, speedup in SPEEDUPS.items():
            if marker in candidate and marker not in original:
                accepted = speedup >= 1.05
                return Verdict(accepted, Reason.OK if accepted else Reason.NOT_FASTER, speedup=speedup,
                               speedup_ci_low=speedup * 0.97, speedup_ci_high=speedup * 1.03, max_rel_error=1e-7)
        return Verdict(False, Reason.MISMATCH, ("scripted mismatch",))

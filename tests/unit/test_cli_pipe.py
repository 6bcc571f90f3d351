"""The command line piped into a reader that stops early (``kernel-lsp check f.cu | head -1``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path: Path) -> None:
    # Far more text than a pipe holds (64 KiB), so the command is still writing when the reader goes.
    kernels = "".join(f"__global__ void k{i}(float *a, int n) {{ int i = blockIdx.x * blockDim.x + threadIdx.x;"
                      " if (i < n) a[i] = 2.0f * a[i]; }\n" for i in range(1500))
    (tmp_path / "many.cu").write_text(kernels)
    proc = subprocess.Popen([sys.executable, "-m", "kernel_lsp", "check", "--no-compile", str(tmp_path / "many.cu")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # as `head -1` does: every later write meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1
    assert b"1500 kernels" in first
    assert "Traceback" not in err and "BrokenPipeError" not in err

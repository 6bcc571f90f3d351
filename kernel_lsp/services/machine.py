"""What this machine can do: a GPU, pycuda, Nsight Compute and nvcc, asked once.

The server asks at start (off the event loop: nvidia-smi can take a second)
and adapts what it offers: no profiling hints without a GPU and ncu, "Optimize"
disabled with its reason without a GPU and pycuda, one message naming what is
missing and how to get it. Nothing here imports pycuda (importing it starts
CUDA); finding the package is enough to know it can be used in a child process.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass

from kernel_lsp.services.proc import ToolMissing, run, which

log = logging.getLogger(__name__)

#: Longest nvidia-smi may take to answer, in seconds (a wedged driver must not stall start-up).
NVIDIA_SMI_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Machine:
    gpu: str | None
    """``NVIDIA H200 (compute 9.0)`` for GPU 0, or None when there is none."""
    gpu_problem: str | None
    """Why there is no GPU (``nvidia-smi was not found``…); None when there is one."""
    pycuda: bool
    """The ``pycuda`` package can be imported (the harness launches kernels with it)."""
    ncu: str | None
    """Path of Nsight Compute's CLI, or None."""
    nvcc: str | None
    """Path of nvcc, or None."""

    @property
    def can_profile(self) -> bool:
        return self.gpu is not None and self.ncu is not None

    @property
    def can_verify(self) -> bool:
        return self.gpu is not None and self.pycuda

    @property
    def verify_problem(self) -> str | None:
        """Why candidates cannot be verified here, or None."""
        if self.gpu is None:
            return "needs a GPU to verify"
        if not self.pycuda:
            return "needs pycuda to verify (pip install 'kernel-lsp[gpu]')"
        return None

    def missing(self) -> list[str]:
        """One line per missing piece: what it costs and how to get it."""
        lines = []
        if self.nvcc is None:
            lines.append("nvcc was not found: no compiler diagnostics or register counts "
                         "(install the CUDA toolkit or set kernelLsp.nvccPath)")
        if self.gpu is None:
            lines.append(f"no GPU ({self.gpu_problem}): profiling and Optimize are off "
                         "(they need an NVIDIA GPU and its driver)")
        else:
            if self.ncu is None:
                lines.append("Nsight Compute (ncu) was not found: no profiling "
                             "(install Nsight Compute or set kernelLsp.ncuPath)")
            if not self.pycuda:
                lines.append("pycuda is not installed: Optimize cannot verify candidates "
                             "(pip install 'kernel-lsp[gpu]')")
        return lines


def _gpu(nvidia_smi: str) -> tuple[str | None, str | None]:
    try:
        result = run([nvidia_smi, "--query-gpu=name,compute_cap", "--format=csv,noheader", "-i", "0"],
                     timeout_s=NVIDIA_SMI_TIMEOUT_S)
    except ToolMissing:
        return None, "nvidia-smi was not found"
    if result.timed_out:
        return None, f"nvidia-smi did not answer within {NVIDIA_SMI_TIMEOUT_S:.0f} s"
    line = result.stdout.strip().splitlines()[0].strip() if result.stdout.strip() else ""
    if result.returncode != 0 or not line:
        said = (result.stderr or result.stdout).strip().splitlines()
        return None, f"nvidia-smi found no GPU ({said[0] if said else f'exit status {result.returncode}'})"
    name, _, capability = line.rpartition(",")
    if not name:
        return line, None
    return f"{name.strip()} (compute {capability.strip()})", None


def detect_machine(nvcc_path: str = "nvcc", ncu_path: str = "ncu", nvidia_smi: str = "nvidia-smi") -> Machine:
    """Ask the machine once (blocking: call it off the event loop)."""
    gpu, problem = _gpu(nvidia_smi)
    machine = Machine(
        gpu=gpu,
        gpu_problem=problem,
        pycuda=importlib.util.find_spec("pycuda") is not None,
        ncu=which(ncu_path),
        nvcc=which(nvcc_path),
    )
    log.info("machine: %s", machine)
    return machine

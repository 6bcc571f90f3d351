"""Shared set-up of the GPU tests: each module is skipped cleanly without a GPU, pycuda or its CUDA tools.

A machine without an NVIDIA GPU skips with the reason "no GPU", whatever else it lacks: pycuda and the
CUDA tools are asked about only where a GPU exists, so the reason names what is actually missing.
A module that needs more than nvcc names the executables it looks up on PATH in ``GPU_TOOLS``.
"""

from __future__ import annotations

import glob
import importlib.util
import shutil
from collections.abc import Iterable
from pathlib import Path

import pytest

from kernel_lsp.services.harness.verify import cuda_tool


def has_nvidia_device() -> bool:
    """Whether the NVIDIA driver exposes a GPU here (device nodes or the driver's /proc entries); no CUDA library needed."""
    return bool(glob.glob("/dev/nvidia[0-9]*") or glob.glob("/proc/driver/nvidia/gpus/*"))


def gpu_problem(tools: Iterable[str]) -> str | None:
    """Why the GPU tests cannot run here, or None when a GPU, pycuda and every one of ``tools`` are present."""
    if not has_nvidia_device():
        return "no GPU"
    if importlib.util.find_spec("pycuda") is None:
        return "pycuda is not installed"
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        return f"{' or '.join(missing)} is not on PATH"
    # Imported only once pycuda is known to be installed (it is not on machines without a GPU).
    import pycuda.driver as cuda

    try:
        cuda.init()
        return None if cuda.Device.count() > 0 else "no CUDA device"
    except cuda.Error as exc:
        return f"no CUDA device: {exc}"


@pytest.fixture(scope="module", autouse=True)
def gpu_or_skip(request: pytest.FixtureRequest) -> None:
    problem = gpu_problem(getattr(request.module, "GPU_TOOLS", (cuda_tool("nvcc"),)))
    if problem:
        pytest.skip(problem)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without a GPU every test here skips as "no GPU", before its own skipif (a missing tool) is looked at."""
    if has_nvidia_device():
        return
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.skipif(True, reason="no GPU"), append=False)

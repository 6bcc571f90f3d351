"""The server starts its GPU worker once the machine is known to have a GPU and pycuda, not on the first save."""

from __future__ import annotations

import asyncio
import threading
import types

import pytest

from kernel_lsp.config import Settings
from kernel_lsp.server import profiling
from kernel_lsp.services import gpu_worker
from kernel_lsp.services.machine import Machine

H200 = Machine(gpu="NVIDIA H200 (compute 9.0)", gpu_problem=None, pycuda=True, ncu="/usr/local/cuda/bin/ncu", nvcc=None)


class _State:
    """What start_worker reads of the server's state."""

    def __init__(self, machine, settings, loop):
        self.machine = machine
        self.settings = settings
        self.loop = loop
        self.documents = types.SimpleNamespace(all=lambda: ())


class _Worker:
    def __init__(self):
        self.started = threading.Event()

    def ensure(self):
        self.started.set()
        return gpu_worker.WorkerInfo("NVIDIA H200", True, None, "GH100", 1.8)


@pytest.mark.parametrize("machine, settings, starts", [
    (H200, {}, True),
    (Machine(None, "nvidia-smi was not found", False, None, None), {}, False),
    (Machine(H200.gpu, None, False, H200.ncu, None), {}, False),  # no pycuda: no worker, ncu profiles
    (H200, {"profile_on_save": False}, False),
])
async def test_the_worker_starts_with_the_machine(tmp_path, monkeypatch, machine, settings, starts):
    made: list[_Worker] = []
    monkeypatch.setattr(profiling.gpu_worker, "GpuWorker", lambda: made.append(_Worker()) or made[-1])
    monkeypatch.delenv("KERNEL_LSP_GPU_WORKER", raising=False)
    state = _State(machine, Settings(profile_store=str(tmp_path), **settings), asyncio.get_running_loop())
    profiling.start_worker(state)
    if not starts:
        assert made == []
        return
    (worker,) = made
    assert await asyncio.to_thread(worker.started.wait, 10)
    # The profiler made later uses the same, started worker.
    assert profiling.pstate(state).worker is worker


async def test_no_worker_when_it_is_switched_off(tmp_path, monkeypatch):
    monkeypatch.setattr(profiling.gpu_worker, "GpuWorker", lambda: pytest.fail("no worker may be made"))
    monkeypatch.setenv("KERNEL_LSP_GPU_WORKER", "0")
    profiling.start_worker(_State(H200, Settings(profile_store=str(tmp_path)), asyncio.get_running_loop()))

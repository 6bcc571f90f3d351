"""The real backend: pycuda on the first CUDA device.

Imported only inside child processes (``child``, ``launch``): a kernel that
faults poisons its CUDA context, and a hang must be killable, so the server and
the CLI never load pycuda themselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pycuda.driver as cuda

from kernel_lsp.core.spec import Launch
from kernel_lsp.services.harness.protocol import Args, LaunchFailed

#: Above this, dynamic shared memory must be opted into per function (CUDA's default limit).
_DEFAULT_SMEM_LIMIT = 48 * 1024


class GpuMissing(RuntimeError):
    """pycuda found no usable CUDA device."""


def _driver_version() -> str:
    version = cuda.get_driver_version()
    return f"{version // 1000}.{version % 1000 // 10}"


class PycudaBackend:
    def __init__(self, kernels: Mapping[str, tuple[str, str]]):
        """``kernels``: which -> (cubin path, entry name)."""
        try:
            cuda.init()
            if cuda.Device.count() == 0:
                raise GpuMissing("no CUDA GPU available (the driver reports 0 devices)")
        except cuda.Error as exc:
            raise GpuMissing(f"no CUDA GPU available: {exc}") from exc
        self.device = cuda.Device(0)
        self.context = self.device.make_context()
        self.functions = {}
        self.modules = []
        for which, (cubin, entry) in kernels.items():
            try:
                module = cuda.module_from_file(cubin)
                self.modules.append(module)
                self.functions[which] = module.get_function(entry)
            except cuda.Error as exc:
                raise LaunchFailed(f"cannot load {which} kernel '{entry}' from {cubin}: {exc}") from exc

    def info(self) -> dict:
        attr = cuda.device_attribute

        def get(name: str) -> int | None:
            try:
                return int(self.device.get_attribute(getattr(attr, name)))
            except (AttributeError, cuda.Error):
                return None

        major, minor = self.device.compute_capability()
        clock_khz = get("CLOCK_RATE")
        return {
            "name": self.device.name(),
            "driver": f"CUDA driver API {_driver_version()}",
            "compute_capability": f"{major}.{minor}",
            "max_sm_clock_mhz": clock_khz // 1000 if clock_khz else None,
            "l2_bytes": get("L2_CACHE_SIZE"),
        }

    def close(self) -> None:
        self.context.pop()

    def _prepare(self, which: str, launch: Launch):
        function = self.functions[which]
        if launch.dynamic_smem_bytes > _DEFAULT_SMEM_LIMIT:
            function.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, launch.dynamic_smem_bytes)
        return function

    def run(self, which: str, args: Args, launch: Launch) -> list[np.ndarray | None]:
        buffers = []
        try:
            function = self._prepare(which, launch)
            device_args = []
            for a in args:
                if isinstance(a, np.ndarray):
                    buf = cuda.mem_alloc(max(a.nbytes, 1))
                    if a.nbytes:
                        cuda.memcpy_htod(buf, a)
                    buffers.append(buf)
                    device_args.append(buf)
                else:
                    device_args.append(a)
            function(*device_args, block=launch.block, grid=launch.grid, shared=launch.dynamic_smem_bytes)
            cuda.Context.synchronize()
            out: list[np.ndarray | None] = []
            it = iter(buffers)
            for a in args:
                if isinstance(a, np.ndarray):
                    host = np.empty_like(a)
                    buf = next(it)
                    if a.nbytes:
                        cuda.memcpy_dtoh(host, buf)
                    out.append(host)
                else:
                    out.append(None)
            return out
        except cuda.Error as exc:
            raise LaunchFailed(f"{type(exc).__name__}: {exc}") from exc
        finally:
            for buf in buffers:
                try:
                    buf.free()
                except cuda.Error:
                    pass

    def timer(self, args: Mapping[str, Args], launches: Mapping[str, Launch], restore: Sequence[bool]) -> _PycudaTimer:
        try:
            return _PycudaTimer(self, args, launches, restore)
        except cuda.Error as exc:
            raise LaunchFailed(f"{type(exc).__name__}: {exc}") from exc


class _PycudaTimer:
    """Per kernel: working buffers, pristine copies restored before every trial, one L2-flush buffer."""

    def __init__(self, backend: PycudaBackend, args: Mapping[str, Args], launches: Mapping[str, Launch], restore: Sequence[bool]):
        self.backend = backend
        self.launches = dict(launches)
        self.buffers: list = []
        self.device_args: dict[str, list] = {}
        self.restores: dict[str, list[tuple[object, object, int]]] = {}
        for which, host_args in args.items():
            self.backend._prepare(which, launches[which])
            device_args, restores = [], []
            for a, restored in zip(host_args, restore):
                if not isinstance(a, np.ndarray):
                    device_args.append(a)
                    continue
                work = cuda.mem_alloc(max(a.nbytes, 1))
                self.buffers.append(work)
                if a.nbytes:
                    cuda.memcpy_htod(work, a)
                if restored and a.nbytes:
                    pristine = cuda.mem_alloc(a.nbytes)
                    self.buffers.append(pristine)
                    cuda.memcpy_htod(pristine, a)
                    restores.append((work, pristine, a.nbytes))
                device_args.append(work)
            self.device_args[which] = device_args
            self.restores[which] = restores
        l2_bytes = backend.info()["l2_bytes"] or 64 * 1024 * 1024
        # Writing twice the L2 size evicts everything the previous trial left there (Triton's do_bench does the same).
        self.flush_words = 2 * l2_bytes // 4
        self.flush = cuda.mem_alloc(self.flush_words * 4)
        self.buffers.append(self.flush)
        self.start, self.end = cuda.Event(), cuda.Event()
        self.trial = 0

    def time_ms(self, which: str) -> float:
        launch = self.launches[which]
        try:
            # Every trial starts from the same inputs and a poisoned output, so no trial can reuse the last one's work.
            for work, pristine, nbytes in self.restores[which]:
                cuda.memcpy_dtod_async(work, pristine, nbytes)
            self.trial += 1
            cuda.memset_d32_async(self.flush, self.trial, self.flush_words)
            # The flush keeps the GPU busy while the host enqueues the launch, so the events time the kernel alone.
            self.start.record()
            self.backend.functions[which](*self.device_args[which], block=launch.block, grid=launch.grid, shared=launch.dynamic_smem_bytes)
            self.end.record()
            self.end.synchronize()
            return self.start.time_till(self.end)
        except cuda.Error as exc:
            raise LaunchFailed(f"{type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        for buf in self.buffers:
            try:
                buf.free()
            except cuda.Error:
                pass
        self.buffers = []

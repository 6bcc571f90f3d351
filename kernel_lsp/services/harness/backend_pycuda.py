"""The real backend: pycuda on the first CUDA device.

Imported only inside child processes (``child``, ``launch``): a kernel that
faults poisons its CUDA context, and a hang must be killable, so the server and
the CLI never load pycuda themselves.

Every array is one allocation ``[red zone | data | red zone]`` and kernels get
the data's address (``np.uintp``: pycuda packs numpy scalars by their type, a
pointer as 8 bytes). Launches go to the default stream and are waited on by
polling an event, never by a blocking synchronize, so a hung kernel costs the
launch's limit and not the child's whole timeout.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pycuda.driver as cuda

from kernel_lsp.core.compare import GUARD_BYTES, POISON_BITS, ToleranceSummary, poison, tolerance_summary
from kernel_lsp.core.inputs import NUMPY_DTYPES, DevicePlan, float32_to_bf16
from kernel_lsp.core.spec import Launch, Tolerance
from kernel_lsp.services.harness.device_kernels import CLOSE_KERNELS
from kernel_lsp.services.harness.protocol import LaunchFailed, LaunchTimeout

#: Above this, dynamic shared memory must be opted into per function (CUDA's default limit).
_DEFAULT_SMEM_LIMIT = 48 * 1024
#: Helper kernels: 256 threads, grid-stride loops over at most this many blocks.
_HELPER_BLOCKS = 8192
#: How often a waiting launch looks at its event.
_POLL_S = 0.0002


class GpuMissing(RuntimeError):
    """pycuda found no usable CUDA device."""


def _driver_version() -> str:
    version = cuda.get_driver_version()
    return f"{version // 1000}.{version % 1000 // 10}"


@contextlib.contextmanager
def _device_errors() -> Iterator[None]:
    try:
        yield
    except cuda.Error as exc:
        raise LaunchFailed(f"{type(exc).__name__}: {exc}") from exc


class Watchdog:
    """The deadline of the launch in flight, in an 8-byte file the parent reads (0: none).

    The child abandons a launch past its limit by itself; the parent kills the child when
    the deadline has passed by more than a grace period, for the case where the child
    cannot (stuck in a driver call).
    """

    def __init__(self, path: str | None):
        self.map = None
        if path:
            with open(path, "r+b") as f:
                self.map = mmap.mmap(f.fileno(), 8)

    def set(self, deadline_unix_s: float) -> None:
        if self.map is not None:
            self.map[:8] = struct.pack("<d", deadline_unix_s)

    def clear(self) -> None:
        self.set(0.0)


@dataclass
class DeviceArray:
    allocation: Any
    base: int
    """Address of the allocation (the front red zone, when there is one)."""
    ptr: int
    """Address of element 0."""
    nbytes: int
    guard_bytes: int
    array_type: str

    @property
    def itemsize(self) -> int:
        return NUMPY_DTYPES[self.array_type].itemsize


class PycudaBackend:
    def __init__(self, kernels: Mapping[str, tuple[str, str]], helpers: str | None = None, state: Mapping[str, Sequence[tuple[str, int]]] | None = None, watch_path: str | None = None):
        """``kernels``: which -> (cubin path, entry name); ``helpers``: the harness kernels' cubin;
        ``state``: which -> (symbol, bytes) of its module's device variables."""
        try:
            cuda.init()
            if cuda.Device.count() == 0:
                raise GpuMissing("no CUDA GPU available (the driver reports 0 devices)")
        except cuda.Error as exc:
            raise GpuMissing(f"no CUDA GPU available: {exc}") from exc
        self.device = cuda.Device(0)
        self.context = self.device.make_context()
        self.functions: dict[str, Any] = {}
        self.modules: dict[str, Any] = {}
        self.helpers: dict[str, Any] = {}
        self.watchdog = Watchdog(watch_path)
        for which, (cubin, entry) in kernels.items():
            try:
                self.modules[which] = cuda.module_from_file(cubin)
                self.functions[which] = self.modules[which].get_function(entry)
            except cuda.Error as exc:
                raise LaunchFailed(f"cannot load {which} kernel '{entry}' from {cubin}: {exc}") from exc
        if helpers:
            with _device_errors():
                self.helper_module = cuda.module_from_file(helpers)
        self.state: dict[str, list[tuple[str, int, int]]] = {}
        for which, symbols in (state or {}).items():
            found = []
            for name, size in symbols:
                try:
                    ptr, nbytes = self.modules[which].get_global(name)
                except cuda.Error:
                    continue  # a symbol the loader does not export (a compiler-internal table): not module state a kernel keeps
                found.append((name, int(ptr), int(nbytes)))
            self.state[which] = found
        with _device_errors():
            self.start, self.end = cuda.Event(), cuda.Event()
            self.result = cuda.mem_alloc(16)
            self.summary = cuda.mem_alloc(48)
        #: array type -> why its device comparison failed its self-test (None: it passed); tested on first use.
        self.summary_checked: dict[str, str | None] = {}
        self.compare_problems: list[str] = []

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

    # --- arrays ----------------------------------------------------------------------------------

    def alloc(self, array_type: str, size: int, guard_fill: tuple[int, int] | None) -> DeviceArray:
        itemsize = NUMPY_DTYPES[array_type].itemsize
        nbytes, guard = size * itemsize, GUARD_BYTES if guard_fill is not None else 0
        with _device_errors():
            allocation = cuda.mem_alloc(max(2 * guard + nbytes, 1))
            base = int(allocation)
            array = DeviceArray(allocation, base, base + guard, nbytes, guard, array_type)
            if guard_fill is not None:
                self.fill_guards(array, guard_fill)
        return array

    def address(self, handle: DeviceArray) -> int:
        return handle.ptr

    def free(self, handle: DeviceArray) -> None:
        with contextlib.suppress(cuda.Error):
            handle.allocation.free()

    def _memset(self, ptr: int, nbytes: int, width: int, value: int) -> None:
        if nbytes <= 0:
            return
        if width == 1:
            cuda.memset_d8(ptr, value, nbytes)
        elif width == 2:
            cuda.memset_d16(ptr, value, nbytes // 2)
        elif width == 4:
            cuda.memset_d32(ptr, value, nbytes // 4)
        else:
            self._helper("klsp_fill_u64", nbytes // 8, np.uintp(ptr), np.uint64(nbytes // 8), np.uint64(value))

    def fill_guards(self, handle: DeviceArray, guard_fill: tuple[int, int]) -> None:
        width, value = guard_fill
        with _device_errors():
            self._memset(handle.base, handle.guard_bytes, width, value)
            self._memset(handle.ptr + handle.nbytes, handle.guard_bytes, width, value)

    def fill_tail(self, handle: DeviceArray, first: int, guard_fill: tuple[int, int]) -> None:
        width, value = guard_fill
        start = first * handle.itemsize
        with _device_errors():
            self._memset(handle.ptr + start, handle.nbytes - start, width, value)

    def poison(self, handle: DeviceArray, array_type: str) -> None:
        with _device_errors():
            self._memset(handle.ptr, handle.nbytes, handle.itemsize, POISON_BITS[array_type])

    def upload(self, handle: DeviceArray, host: np.ndarray) -> None:
        data = np.ascontiguousarray(host)
        if data.nbytes != handle.nbytes:
            raise LaunchFailed(f"upload of {data.nbytes} bytes into an array of {handle.nbytes}")
        if data.nbytes:
            with _device_errors():
                cuda.memcpy_htod(handle.ptr, data)

    def download(self, handle: DeviceArray) -> np.ndarray:
        host = np.empty(handle.nbytes, dtype=np.uint8)
        if handle.nbytes:
            with _device_errors():
                cuda.memcpy_dtoh(host, handle.ptr)
        return host.view(NUMPY_DTYPES[handle.array_type])

    def guards(self, handle: DeviceArray) -> tuple[np.ndarray, np.ndarray]:
        front = np.empty(handle.guard_bytes, dtype=np.uint8)
        back = np.empty(handle.guard_bytes, dtype=np.uint8)
        if handle.guard_bytes:
            with _device_errors():
                cuda.memcpy_dtoh(front, handle.base)
                cuda.memcpy_dtoh(back, handle.ptr + handle.nbytes)
        return front, back

    def copy(self, dst: DeviceArray, src: DeviceArray) -> None:
        if src.nbytes:
            with _device_errors():
                cuda.memcpy_dtod(dst.ptr, src.ptr, src.nbytes)

    def _helper(self, name: str, elements: int, *args) -> None:
        function = self.helpers.get(name)
        if function is None:
            function = self.helpers[name] = self.helper_module.get_function(name)
        blocks = max(1, min(-(-elements // 256), _HELPER_BLOCKS))
        function(*args, block=(256, 1, 1), grid=(blocks, 1, 1))

    def generate(self, handle: DeviceArray, plan: DevicePlan, array_type: str) -> None:
        if plan.size == 0:
            return
        if array_type in ("float32", "float16", "bfloat16"):
            a, b = np.float32(plan.a), np.float32(plan.b)
        elif array_type == "float64":
            a, b = np.float64(plan.a), np.float64(plan.b)
        else:
            a, b = np.uint64(plan.a), np.uint64(plan.b)
        with _device_errors():
            self._helper(plan.kernel, plan.size, np.uintp(handle.ptr), np.uint64(plan.size), np.uint64(plan.key), np.int32(plan.kind), a, b)

    def differ(self, a: DeviceArray, b: DeviceArray) -> tuple[int, int]:
        if a.nbytes == 0:
            return 0, 0
        found = np.empty(2, dtype=np.uint64)
        with _device_errors():
            cuda.memcpy_htod(self.result, np.array([0, np.iinfo(np.uint64).max], dtype=np.uint64))
            self._helper("klsp_diff", a.nbytes // 4, np.uintp(a.ptr), np.uintp(b.ptr), np.uint64(a.nbytes), np.uintp(int(self.result)))
            cuda.memcpy_dtoh(found, self.result)
        return int(found[0]), int(found[1]) if found[0] else 0

    def tolerance_summary(self, reference: DeviceArray, candidate: DeviceArray, array_type: str, tolerance: Tolerance, poisoned: bool) -> ToleranceSummary | None:
        """The device's comparison, or None (the host compares) when its self-test for this type failed."""
        if array_type not in self.summary_checked:
            self.summary_checked[array_type] = self._summary_self_test(array_type)
            if self.summary_checked[array_type]:
                self.compare_problems.append(self.summary_checked[array_type])
        if self.summary_checked[array_type]:
            return None
        return self._summary(reference, candidate, array_type, tolerance, poisoned)

    def _summary(self, reference: DeviceArray, candidate: DeviceArray, array_type: str, tolerance: Tolerance, poisoned: bool) -> ToleranceSummary:
        work = np.float64 if array_type == "float64" else np.float32
        n = reference.nbytes // reference.itemsize
        words = np.zeros(6, dtype=np.uint64)
        with _device_errors():
            cuda.memcpy_htod(self.summary, words)
            self._helper(CLOSE_KERNELS[array_type], n, np.uintp(reference.ptr), np.uintp(candidate.ptr), np.uint64(n), work(tolerance.rtol),
                         work(tolerance.atol), np.uint64(POISON_BITS[array_type]), np.int32(poisoned), np.uintp(int(self.summary)))
            cuda.memcpy_dtoh(words, self.summary)
        sums = words[2:4].view(np.float64)
        maxes = words[4:6].astype(np.uint64 if array_type == "float64" else np.uint32)
        maxes = maxes.view(np.float64) if array_type == "float64" else maxes.view(np.float32)
        return ToleranceSummary(int(words[0]), int(words[1]), float(sums[0]), float(sums[1]), float(maxes[0]), float(maxes[1]))

    def _summary_self_test(self, array_type: str) -> str | None:
        """Why the device's comparison of ``array_type`` cannot be trusted here, or None.

        A comparison that says "within tolerance" wrongly would let a wrong candidate through, so before
        its first use in a process it must agree with its numpy twin on arrays with every kind of element
        (within and outside the tolerance, NaN and infinity on one side and on both, poison).
        """
        rng = np.random.default_rng(0)
        reference = rng.uniform(-2, 2, 4099)
        candidate = reference * (1 + rng.uniform(-1e-3, 1e-3, reference.size))
        candidate[::97] += 0.5
        reference[7] = candidate[7] = np.inf
        candidate[8], candidate[9] = np.nan, -np.inf
        if array_type == "bfloat16":
            r, c = float32_to_bf16(reference.astype(np.float32)), float32_to_bf16(candidate.astype(np.float32))
        else:
            r, c = reference.astype(NUMPY_DTYPES[array_type]), candidate.astype(NUMPY_DTYPES[array_type])
        r[:3], c[:3] = poison(array_type, 3), poison(array_type, 3)
        c[5], c[6] = poison(array_type, 2)
        tolerance = Tolerance(1e-3, 1e-4)
        want = tolerance_summary(r, c, array_type, tolerance, True)
        handles = [self.alloc(array_type, r.size, None), self.alloc(array_type, c.size, None)]
        try:
            self.upload(handles[0], r)
            self.upload(handles[1], c)
            got = self._summary(handles[0], handles[1], array_type, tolerance, True)
        finally:
            for handle in handles:
                self.free(handle)
        exact = (got.bad, got.special, got.max_abs_error, got.max_rel_error) == (want.bad, want.special, want.max_abs_error, want.max_rel_error)
        close = all(abs(a - b) <= 1e-9 * abs(b) for a, b in ((got.err_sq, want.err_sq), (got.ref_sq, want.ref_sq)))
        if exact and close:
            return None
        return (f"the device's {array_type} comparison disagrees with its numpy twin ({got} vs {want}): "
                f"{array_type} outputs were compared on the host")

    def globals(self, which: str) -> dict[str, bytes]:
        values = {}
        with _device_errors():
            for name, ptr, nbytes in self.state.get(which, ()):
                host = np.empty(nbytes, dtype=np.uint8)
                cuda.memcpy_dtoh(host, ptr)
                values[name] = host.tobytes()
        return values

    def set_globals(self, which: str, values: Mapping[str, bytes]) -> None:
        with _device_errors():
            for name, ptr, nbytes in self.state.get(which, ()):
                if name in values and len(values[name]) == nbytes:
                    cuda.memcpy_htod(ptr, np.frombuffer(values[name], dtype=np.uint8).copy())

    # --- launches --------------------------------------------------------------------------------

    def _prepare(self, which: str, launch: Launch):
        function = self.functions[which]
        if launch.dynamic_smem_bytes > _DEFAULT_SMEM_LIMIT:
            function.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, launch.dynamic_smem_bytes)
        return function

    def wait(self, event, limit_s: float) -> None:
        """Until ``event`` completes; :class:`LaunchTimeout` after ``limit_s`` (the kernel may still run).

        The watchdog's deadline was set before the launch (:meth:`launch`): if even the launch
        call or the query never returns, the parent ends the process.
        """
        deadline = time.monotonic() + limit_s
        try:
            while not event.query():
                if time.monotonic() > deadline:
                    raise LaunchTimeout(limit_s)
                time.sleep(_POLL_S)
        except cuda.Error:
            # A fault ended the kernel: nothing runs any more, the deadline no longer applies.
            self.watchdog.clear()
            raise
        self.watchdog.clear()

    def launch(self, which: str, args: Sequence[Any], launch: Launch, limit_s: float) -> float:
        device_args = [np.uintp(a.ptr) if isinstance(a, DeviceArray) else a for a in args]
        with _device_errors():
            function = self._prepare(which, launch)
            self.watchdog.set(time.time() + limit_s)
            self.start.record()
            function(*device_args, block=launch.block, grid=launch.grid, shared=launch.dynamic_smem_bytes)
            self.end.record()
            self.wait(self.end, limit_s)
            return self.start.time_till(self.end)

    def timer(self, args: Mapping[str, Sequence[Any]], restores: Mapping[str, Sequence[tuple[str, Any, Any]]], launches: Mapping[str, Launch], limits_s: Mapping[str, float]) -> _PycudaTimer:
        with _device_errors():
            return _PycudaTimer(self, args, restores, launches, limits_s)


class _PycudaTimer:
    """Timed launches in the verification's own buffers, outputs restored and L2 flushed before each."""

    def __init__(self, backend: PycudaBackend, args, restores, launches, limits_s):
        self.backend = backend
        self.launches = dict(launches)
        self.limits_s = dict(limits_s)
        self.restores = dict(restores)
        self.device_args = {which: [np.uintp(a.ptr) if isinstance(a, DeviceArray) else a for a in values] for which, values in args.items()}
        for which, launch in self.launches.items():
            backend._prepare(which, launch)
        l2_bytes = backend.info()["l2_bytes"] or 64 * 1024 * 1024
        # Writing twice the L2 size evicts everything the previous trial left there (Triton's do_bench does the same).
        self.flush_words = 2 * l2_bytes // 4
        self.flush = cuda.mem_alloc(self.flush_words * 4)
        self.trial = 0

    def time_ms(self, which: str) -> float:
        launch = self.launches[which]
        backend = self.backend
        with _device_errors():
            # Every trial starts from a poisoned output (or the pristine in-out array), so no trial can reuse the last one's work.
            for action, target, source in self.restores[which]:
                if action == "poison":
                    backend.poison(target, source)
                else:
                    cuda.memcpy_dtod_async(target.ptr, source.ptr, source.nbytes)
            self.trial += 1
            cuda.memset_d32_async(self.flush, self.trial, self.flush_words)
            # The flush keeps the GPU busy while the host enqueues the launch, so the events time the kernel alone.
            backend.watchdog.set(time.time() + self.limits_s[which])
            backend.start.record()
            backend.functions[which](*self.device_args[which], block=launch.block, grid=launch.grid, shared=launch.dynamic_smem_bytes)
            backend.end.record()
            backend.wait(backend.end, self.limits_s[which])
            return backend.start.time_till(backend.end)

    def close(self) -> None:
        with contextlib.suppress(cuda.Error):
            self.flush.free()

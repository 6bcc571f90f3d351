"""A probe that pings the server's event loop, and the server process's peak memory (issue 27's bounds)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

#: How often the probe asks, and the longest a probe's answer may take. The 100 ms target is measured by
#: benchmarks/security_bounds.py; this bound only separates a responsive server from the seconds-long stalls
#: these files caused (2.0-4.0 s), with room for a shared 2-core machine where the client, the server and a
#: fake nvcc share the cores (an answer once took 280 ms there while answers kept arriving every 51 ms).
PROBE_EVERY_S = 0.05
STALL_BOUND_MS = 1000.0
#: The memory the server may reach on any of the issue's files (peak RSS).
RSS_BOUND_BYTES = 1 << 30


@dataclass
class Probe:
    """A request every 50 ms for as long as it runs (pygls answers the unknown method from its event loop,
    so each answer's delay is how long the loop was held); the slowest answer is the longest stall."""

    client: object
    latencies_ms: list[float] = field(default_factory=list)
    answered_at: list[float] = field(default_factory=list)
    _task: asyncio.Task | None = None
    _pending: set = field(default_factory=set)

    async def _one(self) -> None:
        start = time.perf_counter()
        try:
            await self.client.protocol.send_request_async("kernelLsp/probe", None)  # type: ignore[attr-defined]
        except Exception:  # "method not found" is the answer
            pass
        now = time.perf_counter()
        self.latencies_ms.append((now - start) * 1000.0)
        self.answered_at.append(now)

    async def _run(self) -> None:
        while True:
            task = asyncio.ensure_future(self._one())
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
            await asyncio.sleep(PROBE_EVERY_S)

    def start(self) -> Probe:
        self._task = asyncio.ensure_future(self._run())
        return self

    async def answered(self, more: int) -> None:
        """Wait until ``more`` further probes are answered: the probe covers the background work a run
        started (a parse on a worker thread, a compile's publication), not only its requests."""
        target = len(self.latencies_ms) + more
        async with asyncio.timeout(120):
            while len(self.latencies_ms) < target:
                await asyncio.sleep(PROBE_EVERY_S)

    async def stop(self, settle: int = 40) -> float:
        """After ``settle`` more answers (2 s), stop, wait for the answers still out, and return the slowest
        one's delay in ms."""
        await self.answered(settle)
        assert self._task is not None
        self._task.cancel()
        if self._pending:
            await asyncio.wait(self._pending, timeout=60)
        return max(self.latencies_ms, default=0.0)

    @property
    def max_gap_ms(self) -> float:
        times = sorted(self.answered_at)
        return max(((b - a) * 1000.0 for a, b in zip(times, times[1:])), default=0.0)


def peak_rss_bytes(pid: int) -> int:
    """The process's peak resident memory (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


def server_pid(client: object) -> int:
    return client._server.pid  # type: ignore[attr-defined]

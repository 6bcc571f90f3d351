"""The one way kernel-lsp starts a process.

nvcc, ncu, compute-sanitizer, cu++filt and the GPU runner all go through
:func:`run`, so every child is logged, bounded by a timeout, and killed with its
whole process group on timeout or cancellation (a hung ncu must not leave a
kernel running on the GPU behind it).
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO

log = logging.getLogger(__name__)

#: How often a waiting run() looks at its cancel event, in seconds.
_POLL_S = 0.05


class ToolMissing(RuntimeError):
    """The executable named in argv[0] cannot be found."""

    def __init__(self, tool: str, hint: str = ""):
        self.tool = tool
        message = f"'{tool}' was not found on PATH"
        super().__init__(f"{message}. {hint}".strip() if hint else message)


@dataclass(frozen=True)
class ProcResult:
    """What a finished (or stopped) child left behind."""

    argv: tuple[str, ...]
    returncode: int | None
    """Exit status; None when the child was killed for a timeout or a cancel."""
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool = False
    cancelled: bool = False
    skipped_bytes: int = 0
    """Output bytes not kept, over both streams (``max_output_bytes``: between each one's start and end)."""
    output_overflow: bool = False
    """The child printed more than ``stop_after_bytes`` and was stopped for it (``returncode`` is None)."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.cancelled


class _Capped:
    """One output stream read to its end, keeping its first ``head`` and last ``tail`` bytes.

    Reading goes on past the cap, so the child never blocks on a full pipe and finishes as it would.
    """

    def __init__(self, stream: IO[bytes], head: int, tail: int, total: list[int], limit: int | None,
                 overflow: threading.Event) -> None:
        self._stream = stream
        self._total, self._limit, self._overflow = total, limit, overflow
        self._head_limit, self._tail_limit = head, tail
        self.head = bytearray()
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_bytes = 0
        self.skipped = 0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while chunk := self._stream.read1(1 << 16):
            self._total[0] += len(chunk)  # two readers add to it; a lost update only delays the stop a chunk
            if self._limit is not None and self._total[0] > self._limit:
                self._overflow.set()
            room = self._head_limit - len(self.head)
            if room > 0:
                self.head += chunk[:room]
                chunk = chunk[room:]
            if not chunk:
                continue
            self._tail.append(chunk)
            self._tail_bytes += len(chunk)
            while self._tail and self._tail_bytes - len(self._tail[0]) >= self._tail_limit:
                self._tail_bytes -= len(self._tail[0])
                self.skipped += len(self._tail.popleft())
        self._stream.close()

    def text(self) -> str:
        tail = b"".join(self._tail)
        if self.skipped:
            extra = len(tail) - self._tail_limit
            if extra > 0:
                self.skipped += extra
                tail = tail[extra:]
            # Whole lines only on either side of the gap: a line cut in two would read as another one.
            head = bytes(self.head[: self.head.rfind(b"\n") + 1])
            cut = tail.find(b"\n") + 1
            self.skipped += len(self.head) - len(head) + cut
            return (head + tail[cut:]).decode("utf-8", errors="replace")
        return (bytes(self.head) + tail).decode("utf-8", errors="replace")


def which(tool: str) -> str | None:
    """Resolve ``tool`` (a name or a path) to an executable path, or None."""
    if os.sep in tool:
        return tool if os.access(tool, os.X_OK) else None
    return shutil.which(tool)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run(
    argv: Sequence[str],
    *,
    timeout_s: float,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    input_text: str | None = None,
    cancel: threading.Event | None = None,
    max_output_bytes: tuple[int, int] | None = None,
    stop_after_bytes: int | None = None,
) -> ProcResult:
    """Run ``argv`` to completion, at most ``timeout_s`` seconds.

    Raises :class:`ToolMissing` when argv[0] does not exist; every other failure
    (non-zero exit, timeout, cancel) is reported in the returned result.
    ``env`` entries are added to (not substituted for) the current environment.
    ``max_output_bytes``: (head, tail): of each stream keep only its first ``head`` and last ``tail``
    bytes, whole lines (a compiler may print gigabytes); what is left out is counted in
    :attr:`ProcResult.skipped_bytes`; with ``stop_after_bytes`` too, a child that prints more than that
    in all is stopped as a timed-out one is (:attr:`ProcResult.output_overflow`).
    """
    argv = tuple(str(a) for a in argv)
    exe = which(argv[0])
    if exe is None:
        raise ToolMissing(argv[0])
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    log.info("run (timeout %.0f s): %s", timeout_s, " ".join(argv))
    start = time.monotonic()
    capped = max_output_bytes is not None
    proc = subprocess.Popen(
        (exe, *argv[1:]),
        cwd=cwd,
        env=full_env,
        stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=not capped,
        errors=None if capped else "replace",
        start_new_session=True,
    )
    outcome: dict[str, str] = {}
    overflow = threading.Event()

    def communicate() -> None:
        if max_output_bytes is None:
            out, err = proc.communicate(input_text)
            outcome["stdout"], outcome["stderr"] = out, err
            return
        assert proc.stdout is not None and proc.stderr is not None
        total = [0]
        readers = [_Capped(stream, *max_output_bytes, total, stop_after_bytes, overflow)
                   for stream in (proc.stdout, proc.stderr)]
        if input_text is not None and proc.stdin is not None:
            try:
                proc.stdin.write(input_text.encode("utf-8", errors="replace"))
                proc.stdin.close()
            except BrokenPipeError:
                pass
        for reader in readers:
            reader.thread.join()
        proc.wait()
        outcome["stdout"], outcome["stderr"] = readers[0].text(), readers[1].text()
        outcome["skipped"] = str(readers[0].skipped + readers[1].skipped)

    reader = threading.Thread(target=communicate, daemon=True)
    reader.start()
    timed_out = cancelled = False
    deadline = start + timeout_s
    while reader.is_alive():
        reader.join(_POLL_S)
        if not reader.is_alive():
            break
        if cancel is not None and cancel.is_set():
            cancelled = True
        elif time.monotonic() >= deadline:
            timed_out = True
        if timed_out or cancelled or overflow.is_set():
            _kill_group(proc)
            reader.join(5.0)
            break
    wall_s = time.monotonic() - start
    returncode = None if (timed_out or cancelled or overflow.is_set()) else proc.returncode
    if timed_out:
        log.warning("timed out after %.1f s: %s", wall_s, argv[0])
    return ProcResult(
        argv=argv,
        returncode=returncode,
        stdout=outcome.get("stdout", ""),
        stderr=outcome.get("stderr", ""),
        wall_s=wall_s,
        timed_out=timed_out,
        cancelled=cancelled,
        skipped_bytes=int(outcome.get("skipped", 0)),
        output_overflow=overflow.is_set(),
    )

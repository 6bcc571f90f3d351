"""The one way kernel-lsp starts a process.

nvcc, ncu, compute-sanitizer, cu++filt and the GPU runner all go through
:func:`run`, so every child is logged, bounded by a timeout, and killed with its
whole process group on timeout or cancellation (a hung ncu must not leave a
kernel running on the GPU behind it).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.cancelled


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
) -> ProcResult:
    """Run ``argv`` to completion, at most ``timeout_s`` seconds.

    Raises :class:`ToolMissing` when argv[0] does not exist; every other failure
    (non-zero exit, timeout, cancel) is reported in the returned result.
    ``env`` entries are added to (not substituted for) the current environment.
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
    proc = subprocess.Popen(
        (exe, *argv[1:]),
        cwd=cwd,
        env=full_env,
        stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    outcome: dict[str, str] = {}

    def communicate() -> None:
        out, err = proc.communicate(input_text)
        outcome["stdout"], outcome["stderr"] = out, err

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
        if timed_out or cancelled:
            _kill_group(proc)
            reader.join(5.0)
            break
    wall_s = time.monotonic() - start
    returncode = None if (timed_out or cancelled) else proc.returncode
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
    )

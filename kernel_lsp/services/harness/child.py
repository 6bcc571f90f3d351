"""The verification child: ``python -m kernel_lsp.services.harness.child JOB.json RESULT.json``.

Started by :func:`kernel_lsp.services.harness.verify.verify` through ``proc.run``
with a timeout; one child per verification, so a fault poisons only this
process's CUDA context and a hang is ended by killing it.

JOB.json: ``{"spec": <v1 JSON>, "base_dir": str|null, "kernels": {"original":
[cubin, entry], "candidate": [cubin, entry]}, "helpers": cubin, "state":
{"original": [[symbol, bytes]], "candidate": [...]}, "watch_path": str, "limits":
{...} (Limits fields), "seeds": [int], "timing": {...} (TimingOptions fields),
"skip_timing": bool}``.

RESULT.json: ``{"status": "done"|"no_gpu"|"error", "message": str, "outcome":
{reason, errors, warnings, max_abs_error, max_rel_error, samples_ms, original_ms,
abandoned, timed_checks, sizes_tried}, "gpu": {...}}``. Timing runs only when
correctness passed, then the sizes the spec does not name (after timing: an
original that faults at one of them ends the CUDA context). When
a launch hangs, the result is written and the process exits at once
(``abandoned``): the parent sees a finished child with a ``timeout`` outcome (or,
when the original hung at a probed size, the outcome so far and a warning).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import traceback

import numpy as np

from kernel_lsp.core.inputs import file_names
from kernel_lsp.core.spec import Spec, parse_spec
from kernel_lsp.services.harness.protocol import Limits, LaunchFailed, Outcome, TimingOptions, Verification
from kernel_lsp.services.proc import ToolMissing, run


def load_files(spec: Spec) -> dict[str, np.ndarray]:
    """The ``file(NAME.npy)`` arrays, relative to the spec's folder."""
    base = spec.base_dir or "."
    return {name: np.load(os.path.join(base, name), allow_pickle=False) for name in file_names(spec)}


def smi_clocks() -> dict:
    """Driver version and the clocks nvidia-smi sees now (right after timing); empty when unavailable."""
    query = "driver_version,clocks.sm,clocks.mem,clocks.max.sm"
    try:
        result = run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-i", "0"], timeout_s=15)
    except ToolMissing:
        return {}
    if not result.ok or not result.stdout.strip():
        return {}
    fields = [f.strip() for f in result.stdout.strip().splitlines()[0].split(",")]

    def number(text: str) -> int | None:
        return int(float(text)) if text.replace(".", "", 1).isdigit() else None

    return {"driver": fields[0], "sm_clock_mhz": number(fields[1]), "mem_clock_mhz": number(fields[2]), "max_sm_clock_mhz": number(fields[3])}


def execute(job: dict, result_path: str | None = None) -> dict:
    spec = parse_spec(job["spec"], job.get("base_dir"))
    files = load_files(spec)
    kernels = {which: tuple(pair) for which, pair in job["kernels"].items()}
    state = {which: [tuple(s) for s in symbols] for which, symbols in job.get("state", {}).items()}
    # Imported only when a GPU job runs: backend_pycuda imports pycuda, which machines without a GPU lack.
    from kernel_lsp.services.harness.backend_pycuda import GpuMissing, PycudaBackend

    try:
        backend = PycudaBackend(kernels, job.get("helpers"), state, job.get("watch_path"))
    except GpuMissing as exc:
        return {"status": "no_gpu", "message": str(exc)}
    except LaunchFailed as exc:
        return {"status": "done", "outcome": dataclasses.asdict(Outcome().fail("launch_error", str(exc)))}
    gpu = backend.info()
    verification = Verification(backend, spec, files, Limits(**job.get("limits", {})))
    seed = job["seeds"][0]
    outcome = verification.check(list(job["seeds"]))
    try:
        if outcome.reason is None and not outcome.abandoned and not job.get("skip_timing"):
            verification.measure(seed, TimingOptions(**job.get("timing", {})))
            gpu.update({k: v for k, v in smi_clocks().items() if v is not None})
        # Sizes the spec does not name come last: an original that faults there ends the context, and the
        # verdict keeps everything measured before.
        if outcome.reason is None and not outcome.abandoned:
            verification.probe(seed)
        outcome.warnings += backend.compare_problems
        if outcome.abandoned:
            _abandon({"status": "done", "outcome": dataclasses.asdict(outcome), "gpu": gpu}, result_path)
    finally:
        try:
            verification.close()
            backend.close()
        except Exception:  # noqa: BLE001 - a context broken by a fault cannot always be popped; the process ends anyway
            pass
    return {"status": "done", "outcome": dataclasses.asdict(outcome), "gpu": gpu}


def _abandon(result: dict, result_path: str | None) -> None:
    """Write the result and end the process at once: a kernel still runs, and any CUDA call
    (freeing, popping the context) would wait for it. The driver ends the kernel with the process."""
    if result_path is not None:
        _write(result_path, result)
        os._exit(0)


def _write(path: str, result: dict) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)


def main(argv: list[str]) -> int:
    job_path, result_path = argv
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    try:
        result = execute(job, result_path)
    except ImportError as exc:
        result = {"status": "no_gpu", "message": f"no CUDA GPU available: pycuda cannot be imported ({exc})"}
    except Exception as exc:  # noqa: BLE001 - the parent turns this into a verdict with the traceback
        result = {"status": "error", "message": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
    _write(result_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Scripted GPU-worker children for the CPU tests (spawned like the real one; no GPU, no CUPTI).

The request's ``entry`` picks the behaviour: ``ok`` answers with fixed timings and the
wanted metrics at 1.0 (``gpu__time_duration.sum`` at 5000 ns), ``fault`` answers as a
faulting kernel does and exits, ``hang`` never answers, ``die`` exits without answering,
``refused`` answers as CUPTI refusing a collection.
"""

from __future__ import annotations

import os
import time


def scripted_main(conn, lib_dir):
    if lib_dir == "no-gpu":
        conn.send({"error": "ModuleNotFoundError: No module named 'pycuda'"})
        return
    conn.send({"device": "Fake GPU", "cupti_ok": lib_dir != "no-cupti",
               "cupti_error": "CuptiError: cuptiRangeProfilerEnable: CUPTI_ERROR_INSUFFICIENT_PRIVILEGES" if lib_dir == "no-cupti" else None,
               "chip": "GH100", "startup_s": 0.01, "sass_available": ["smsp__sass_sectors_mem_global",
                                                                       "smsp__sass_sectors_mem_global_ideal"]})
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message["op"] == "quit":
            return
        request = message["request"]
        entry = request["entry"]
        if entry == "hang":
            time.sleep(3600)
        if entry == "die":
            os._exit(3)
        if entry == "cupti-crash":
            conn.send({"progress": "collecting counters"})
            os._exit(-11 & 0xFF)
        if entry == "fault":
            conn.send({"error": "the kernel failed on the GPU: LaunchError: cuCtxSynchronize failed: an illegal memory access was encountered",
                       "fault": True})
            return
        if entry == "refused":
            conn.send({"error": "CUPTI: cuptiRangeProfilerSetConfig: CUPTI_ERROR_INVALID_PARAMETER", "cupti": True})
            continue
        metrics = {m: 1.0 for c in request["collections"] for m in c}
        metrics["gpu__time_duration.sum"] = 5000.0
        conn.send({"timings_us": [5.0, 5.1, 4.9][: request["timed"]], "metrics": metrics, "passes": 3 * len(request["collections"]),
                   "missing": [], "wall_s": 0.02, "steps_s": {"pid": float(os.getpid())}})

"""Launch one kernel once from a launch spec, for tools that wrap a process.

    python -m kernel_lsp.services.harness.launch --cubin K.cubin --kernel ENTRY --spec SPEC.json
        [--seed N] [--variant I] [--candidate-launch] [--repeat R] [--no-init-out] [--base-dir D]
        [--timed T --timings-file F]

ncu (the profiler) and compute-sanitizer (``verify --sanitize``) run this
process: it makes the spec's inputs for ``--seed`` (default 0) at the main size
or ``variants[I]``, launches ENTRY (the name in the cubin; mangled for C++
kernels: see :func:`kernel_lsp.services.harness.compile.find_entry`) R times
(default 1) with the spec's grid/block (``--candidate-launch``: the spec's
``candidate`` settings), synchronizes, and exits.

``--timed T`` first makes one warm-up launch and T launches timed with CUDA
events, writes their durations (µs, JSON list) to ``--timings-file``, then makes
the R launches (:func:`launches_before` counts the launches before those). The
profiler profiles only the last launch (``ncu --launch-skip``): the kernel's
timing spread then costs T plain launches instead of T profiled ones (every
profiled launch is replayed once per ncu pass).

``--no-init-out`` leaves ``out`` buffers uninitialized (fresh cudaMalloc
memory), so compute-sanitizer's initcheck reports a kernel that reads its
output before writing it.

Exit status: 0 launched; 2 bad arguments or spec; 3 no GPU; 4 the launch failed
(message on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from kernel_lsp.core.inputs import make_inputs
from kernel_lsp.core.spec import ArrayParam, SpecError, parse_spec
from kernel_lsp.services.harness.child import load_files
from kernel_lsp.services.harness.protocol import build_args


def launches_before(timed: int) -> int:
    """Launches made before the ``--repeat`` ones under ``--timed timed`` (a warm-up and the timed ones)."""
    return timed + 1 if timed > 0 else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kernel_lsp.services.harness.launch", description="Launch one kernel from a launch spec.")
    parser.add_argument("--cubin", required=True)
    parser.add_argument("--kernel", required=True, help="entry name in the cubin (mangled for C++ kernels)")
    parser.add_argument("--spec", required=True, help="launch spec v1 JSON file")
    parser.add_argument("--base-dir", default=None, help="folder for file(NAME.npy) inputs (default: the spec's folder)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variant", type=int, default=None, help="index into the spec's variants (default: main size)")
    parser.add_argument("--candidate-launch", action="store_true", help="use the spec's candidate grid/block/dynamic_smem")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--timed", type=int, default=0, help="event-timed launches before the others")
    parser.add_argument("--timings-file", default=None, help="where the timed launches' durations go (JSON, µs)")
    parser.add_argument("--no-init-out", action="store_true", help="leave out buffers uninitialized (for initcheck)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with open(args.spec, encoding="utf-8") as f:
            spec = parse_spec(json.load(f), args.base_dir or os.path.dirname(os.path.abspath(args.spec)))
        if args.variant is not None and not 0 <= args.variant < len(spec.variants):
            raise SpecError([f"--variant {args.variant}: the spec has {len(spec.variants)} variants"])
    except (OSError, ValueError) as exc:
        print(f"launch: {exc}", file=sys.stderr)
        return 2
    resolved = spec.resolve(args.variant)
    launch = resolved.candidate if args.candidate_launch else resolved.original
    host_args = build_args(spec, make_inputs(spec, args.seed, args.variant, load_files(spec)), args.variant)
    try:
        import pycuda.driver as cuda
    except ImportError as exc:
        print(f"launch: no CUDA GPU available: pycuda cannot be imported ({exc})", file=sys.stderr)
        return 3
    try:
        cuda.init()
        context = cuda.Device(0).make_context()
    except cuda.Error as exc:
        print(f"launch: no CUDA GPU available: {exc}", file=sys.stderr)
        return 3
    try:
        try:
            function = cuda.module_from_file(args.cubin).get_function(args.kernel)
        except cuda.Error as exc:
            print(f"launch: cannot load kernel '{args.kernel}' from {args.cubin}: {exc}", file=sys.stderr)
            return 4
        if launch.dynamic_smem_bytes > 48 * 1024:
            function.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, launch.dynamic_smem_bytes)
        device_args = []
        for p, a in zip(spec.params, host_args):
            if isinstance(a, np.ndarray):
                buf = cuda.mem_alloc(max(a.nbytes, 1))
                if a.nbytes and not (args.no_init_out and isinstance(p, ArrayParam) and p.role == "out"):
                    cuda.memcpy_htod(buf, a)
                device_args.append(buf)
            else:
                device_args.append(a)
        if args.timed > 0:
            function(*device_args, block=launch.block, grid=launch.grid, shared=launch.dynamic_smem_bytes)
            timings_us = []
            for _ in range(args.timed):
                start, end = cuda.Event(), cuda.Event()
                start.record()
                function(*device_args, block=launch.block, grid=launch.grid, shared=launch.dynamic_smem_bytes)
                end.record()
                end.synchronize()
                timings_us.append(1000.0 * end.time_since(start))
            if args.timings_file:
                with open(args.timings_file, "w", encoding="utf-8") as f:
                    json.dump(timings_us, f)
        for _ in range(args.repeat):
            function(*device_args, block=launch.block, grid=launch.grid, shared=launch.dynamic_smem_bytes)
        cuda.Context.synchronize()
    except cuda.Error as exc:
        print(f"launch: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 4
    finally:
        try:
            context.pop()
        except cuda.Error:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

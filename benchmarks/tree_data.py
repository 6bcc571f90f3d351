"""Record the profiles that tree learning replays: every metric group of each corpus kernel (GPU).

    PYTHONPATH=. python3 benchmarks/tree_data.py --out $OUT/tree_profiles.json [--only a,b]

One profile per kernel through the GPU worker (CUPTI), with a tree whose only leaf collects every
metric group the profiling tree can ask for, so that any tree's collection can be cut from it
(:mod:`kernel_lsp.core.tree_learning`). When CUPTI is not usable the profiler falls back to ncu for
the same groups, and the row says so. Writes JSON with the machine, date and command, and per
kernel its metrics, collection wall seconds, passes and class.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from corpus_baseline import entries  # noqa: E402

from kernel_lsp.config import Settings  # noqa: E402
from kernel_lsp.core.metric_groups import GROUPS  # noqa: E402
from kernel_lsp.core.profiling_tree import parse_tree  # noqa: E402
from kernel_lsp.services import gpu_worker  # noqa: E402
from kernel_lsp.services import profiler as prof  # noqa: E402

CORPUS = os.path.join(ROOT, "benchmarks", "corpus")


def everything_tree() -> dict:
    groups = [f"group:{name}" for name in GROUPS]
    return {"format": "kernel-lsp-profiling-tree", "version": 2, "name": "every-group",
            "first_pass": ["group:throughput"], "root": "all", "unmeasured": "missing",
            "nodes": {"all": {"collect": groups}}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default="", help="comma-separated corpus entries (default: all)")
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args()
    names = entries({x.strip() for x in args.only.split(",") if x.strip()} or None)
    worker = gpu_worker.GpuWorker()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tree-data-") as store:
        settings = Settings(arch=args.arch, profile_store=store, profile_timeout_s=120.0)
        profiler = prof.Profiler(settings, prof.ProfileStore(store), tree=parse_tree(everything_tree()), worker=worker)
        for name in names:
            source = os.path.join(CORPUS, name, "kernel.cu")
            spec_path = os.path.join(CORPUS, name, "spec.json")
            with open(spec_path, encoding="utf-8") as f:
                kernel = json.load(f)["kernel"]
            with open(source, encoding="utf-8") as f:
                target = prof.Target(source, f.read(), kernel, spec_path=spec_path)
            started = time.monotonic()
            result = profiler.profile(target, use_cache=False)
            p = result.profile
            rows.append({
                "name": name, "kernel": kernel, "ok": result.ok, "message": result.message,
                "fallback": profiler.fallback_reason, "metrics": dict(p.metrics) if p else {},
                "collection_wall_s": p.collection_wall_s if p else None, "passes": p.passes if p else None,
                "label": result.bottleneck.label if result.bottleneck else None, "total_s": time.monotonic() - started,
            })
            print(f"{name:38s} {'ok' if result.ok else 'FAILED'} {rows[-1]['label']} {len(rows[-1]['metrics'])} metrics "
                  f"{rows[-1]['total_s']:.2f} s" + (f"  ({result.message})" if result.message else ""), flush=True)
            with open(args.out, "w", encoding="utf-8") as f:
                json.dump({"benchmark": "tree_data", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                           "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
                           "machine": {"host": platform.node(), "python": platform.python_version()},
                           "kernels": rows}, f, indent=1)
    worker.close()
    return 0 if rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

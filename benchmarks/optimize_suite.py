"""Optimizer benchmark over examples/: how often a verified speedup is found, and how large.

Figures: share of kernels with a verified speedup, geometric-mean speedup over all
kernels (a kernel without an accepted candidate counts 1.0x), candidates tried,
wall time, model tokens. Prints a table; writes JSON with the machine, the date,
the command and every candidate's verdict.

Three ways to run it:

* ``python benchmarks/optimize_suite.py`` -- generate and verify in one go (needs a GPU);
* ``--generate-only DIR`` -- run the generators here (CPU; the rules, and the local
  model with ``--model``), save every kernel's candidates in ``DIR/candidates.jsonl``
  (one line per candidate: example, order, generator, launch, source);
* ``--verify-dir DIR`` -- verify the saved candidates (on the GPU machine) and
  report. Generation figures (candidates, tokens, generation wall time) come from
  ``DIR/generation.json``.

Candidates come in the rules' default order (no knowledge base), so two runs
propose the same candidates; ``--budget`` caps candidates per kernel.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernel_lsp.core.candidates import Candidate  # noqa: E402
from kernel_lsp.core.spec import SpecError, with_candidate_launch  # noqa: E402
from kernel_lsp.services.harness import GpuUnavailable, VerifyOptions, load_spec_file, verify  # noqa: E402
from kernel_lsp.services.optimizer import Budget, candidate_hash, optimize  # noqa: E402

EXAMPLES = ROOT / "examples"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "optimize_suite.json"
ALL = ("transpose", "streaming", "reduction", "matmul", "histogram", "softmax", "spmv")


def _machine() -> dict[str, Any]:
    info: dict[str, Any] = {"host": platform.node(), "platform": platform.platform(), "python": platform.python_version()}
    try:
        nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
        info["nvcc"] = nvcc[-1] if nvcc else None
    except OSError:
        info["nvcc"] = None
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        info["gpu"] = smi.stdout.strip() or None
    return info


#: Candidates generation lists per candidate verified (sequences' later steps need their first accepted).
LISTED_PER_VERIFIED = 3
#: Model effort per kernel in the benchmark (the CPU here is shared): techniques tried, samples each, seconds.
MODEL_TECHNIQUES, MODEL_SAMPLES = 2, 1


def _generators(model: str | None, spec: Any, source: str, budget: Budget, model_seconds: float = 300.0) -> list[Any]:
    from kernel_lsp.core.rules import RuleGenerator

    gens: list[Any] = [RuleGenerator()]
    if model:
        from kernel_lsp.services.llm import LlamaModel, LoadOptions
        from kernel_lsp.services.models import resolve_model
        from kernel_lsp.services.optimizer import model_generator

        gens.append(model_generator(LlamaModel(resolve_model(model), LoadOptions(), name=os.path.basename(model)), spec, source,
                                    verifier=None, budget=budget, techniques=MODEL_TECHNIQUES, samples=MODEL_SAMPLES,
                                    seconds=model_seconds))
    return gens


CANDIDATES_FILE = "candidates.jsonl"


def load_saved(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """The saved candidates of ``folder/candidates.jsonl`` per example, in the order they were generated."""
    found: dict[str, list[dict[str, Any]]] = {}
    with open(folder / CANDIDATES_FILE, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                item = json.loads(line)
                found.setdefault(item["example"], []).append(item)
    return found


def generate(examples: list[str], folder: Path, budget: Budget, model: str | None, model_seconds: float = 300.0) -> dict[str, Any]:
    """Candidates per example into ``folder/candidates.jsonl``; returns the generation record."""
    if (folder / CANDIDATES_FILE).exists():
        raise SystemExit(f"optimize_suite: {folder / CANDIDATES_FILE} exists already; generate into a new folder")
    folder.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"examples": {}}
    for name in examples:
        source = (EXAMPLES / name / "original.cu").read_text()
        spec = load_spec_file(EXAMPLES / name / "spec.json")
        start = time.monotonic()
        generators = _generators(model, spec, source, budget, model_seconds)
        result = optimize(source, str(EXAMPLES / name / "original.cu"), spec.kernel, spec,
                          generators=generators, budget=budget, verify=False)
        wall = time.monotonic() - start
        # The model's attempts: how each ended (a candidate, or why not), its tokens and time.
        model_attempts = [
            {"technique": a.technique, "outcome": a.outcome, "reason": a.reason, "tokens": a.prompt_tokens + a.completion_tokens,
             "wall_s": a.wall_s, "steps": len(a.steps)}
            for g in generators for a in getattr(g, "attempts", ())
        ]
        stop = next((g.stop_reason for g in generators if getattr(g, "stop_reason", None)), None)
        for g in generators:
            if hasattr(g, "model"):
                g.model.close()
        items = []
        with open(folder / CANDIDATES_FILE, "a", encoding="utf-8") as f:
            for i, r in enumerate(result.results):
                c = r.candidate
                item = {"example": name, "kernel": spec.kernel, "order": i, "technique": c.technique,
                        "generator": c.generator, "description": c.description,
                        "launch_override": dict(c.launch_override) if c.launch_override else None,
                        "hash": r.candidate_hash, "after": c.after}
                items.append(item)
                f.write(json.dumps({**item, "source": c.source}) + "\n")
        record["examples"][name] = {"candidates": len(items), "generate_wall_s": wall, "tokens": result.tokens,
                                    "model_candidates": sum(1 for i in items if i["generator"].startswith("model:")),
                                    "model_attempts": model_attempts, "model_stop": stop}
        print(f"{name:10s} {len(items):2d} candidates  {wall:6.2f} s  {result.tokens} tokens")
    return record


def verify_saved(examples: list[str], folder: Path, options: VerifyOptions, budget: int) -> dict[str, Any]:
    """The saved candidates of each kernel (best first, as generated) through the harness, as the editor's
    search runs them: a step of a sequence only once the step before it was accepted, ``budget`` verified
    at most."""
    data: dict[str, Any] = {}
    saved = load_saved(folder)
    for name in examples:
        source = (EXAMPLES / name / "original.cu").read_text()
        spec = load_spec_file(EXAMPLES / name / "spec.json")
        rows = []
        accepted: set[str] = set()
        start = time.monotonic()
        for item in saved.get(name, []):
            if len(rows) >= budget:
                break
            if item.get("after") is not None and item["after"] not in accepted:
                continue
            candidate = Candidate(spec.kernel, item["source"], item["technique"], item["generator"],
                                  item["description"], item["launch_override"])
            t0 = time.monotonic()
            try:
                verdict = verify(source, candidate.source, with_candidate_launch(spec, candidate.launch_override), options).to_json()
            except SpecError as exc:  # a launch override the spec rejects: that candidate fails, the run goes on
                verdict = {"accepted": False, "reason": "spec_error", "errors": [str(exc)], "speedup": None, "speedup_ci_low": None}
            if verdict["accepted"]:
                accepted.add(item["generator"])
            kept = {k: v for k, v in item.items() if k != "source"}
            rows.append({**kept, "hash": candidate_hash(candidate), "verdict": verdict, "verify_wall_s": time.monotonic() - t0})
            tag = f"{verdict['speedup']:.2f}x" if verdict["speedup"] else ""
            print(f"  {name:10s} {item['technique']:30s} {verdict['reason']:18s} {tag}", flush=True)
        data[name] = {"candidates": rows, "verify_wall_s": time.monotonic() - start}
    return data


def summarize(verified: dict[str, Any], generation: dict[str, Any]) -> dict[str, Any]:
    per: dict[str, Any] = {}
    for name, entry in verified.items():
        accepted = [r for r in entry["candidates"] if r["verdict"]["accepted"]]
        best = max(accepted, key=lambda r: r["verdict"]["speedup_ci_low"] or 0.0, default=None)
        gen = generation.get("examples", {}).get(name, {})
        per[name] = {
            "candidates": len(entry["candidates"]),
            "accepted": len(accepted),
            "best_technique": best["technique"] if best else None,
            "best_speedup": best["verdict"]["speedup"] if best else 1.0,
            "best_speedup_ci_low": best["verdict"]["speedup_ci_low"] if best else None,
            "reasons": sorted({r["verdict"]["reason"] for r in entry["candidates"]}),
            "verify_wall_s": entry["verify_wall_s"],
            "generate_wall_s": gen.get("generate_wall_s"),
            "tokens": gen.get("tokens", 0),
        }
    speedups = [p["best_speedup"] for p in per.values()]
    return {
        "kernels": len(per),
        "share_with_verified_speedup": sum(1 for p in per.values() if p["accepted"]) / max(len(per), 1),
        "geomean_speedup": math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups else None,
        "candidates_tried": sum(p["candidates"] for p in per.values()),
        "wall_s": sum(p["verify_wall_s"] + (p["generate_wall_s"] or 0.0) for p in per.values()),
        "tokens": sum(p["tokens"] for p in per.values()),
        "per_kernel": per,
    }


def print_table(summary: dict[str, Any]) -> None:
    print(f"\n{'kernel':10s} {'cands':>5s} {'ok':>3s} {'best':>8s}  technique")
    for name, p in summary["per_kernel"].items():
        print(f"{name:10s} {p['candidates']:5d} {p['accepted']:3d} {p['best_speedup']:7.2f}x  {p['best_technique'] or '-'}")
    print(f"\nverified speedup on {summary['share_with_verified_speedup']:.0%} of {summary['kernels']} kernels; "
          f"geomean {summary['geomean_speedup']:.2f}x; {summary['candidates_tried']} candidates; "
          f"{summary['wall_s']:.0f} s; {summary['tokens']} tokens")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--generate-only", metavar="DIR", help="generate candidates here (CPU) and save them to DIR")
    parser.add_argument("--verify-dir", metavar="DIR", help="verify the candidates saved in DIR (GPU) and report")
    parser.add_argument("--examples", default=",".join(ALL), help="comma-separated examples (default: all)")
    parser.add_argument("--budget", type=int, default=12, help="candidates per kernel (default 12)")
    parser.add_argument("--model", help="also ask this local model (manifest name or GGUF path)")
    parser.add_argument("--model-seconds", type=float, default=300.0, help="model time per kernel (default 300)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--time-budget", type=float, default=1.0, help="seconds of timed trials per candidate (default 1)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="JSON results file")
    args = parser.parse_args(argv)
    examples = [e for e in args.examples.split(",") if e]
    budget = Budget(max_candidates=args.budget, max_seconds=3600, max_tokens=200_000)
    # Generation lists more than are verified: the steps of a sequence whose first step is rejected are skipped.
    listing = dataclasses.replace(budget, max_candidates=LISTED_PER_VERIFIED * args.budget)
    command = " ".join([os.path.relpath(sys.argv[0], ROOT) if sys.argv[0] else "optimize_suite.py", *sys.argv[1:]])
    record: dict[str, Any] = {"benchmark": "optimize_suite", "date": dt.datetime.now(dt.timezone.utc).isoformat(),
                              "command": command, "machine": _machine(), "budget": vars(budget), "model": args.model}
    if args.generate_only:
        folder = Path(args.generate_only)
        generation = generate(examples, folder, listing, args.model, args.model_seconds)
        generation.update({k: record[k] for k in ("date", "command", "machine", "model")})
        (folder / "generation.json").write_text(json.dumps(generation, indent=2))
        print(f"saved under {folder}; verify on the GPU machine with: python benchmarks/optimize_suite.py --verify-dir {folder}")
        return 0
    from kernel_lsp.services.harness.protocol import TimingOptions

    options = VerifyOptions(seeds=args.seeds, timing=dataclasses.replace(TimingOptions(), budget_s=args.time_budget))
    if args.verify_dir:
        folder = Path(args.verify_dir)
        generation_path = folder / "generation.json"
        generation = json.loads(generation_path.read_text()) if generation_path.exists() else {}
    else:
        folder = Path(args.out).with_suffix("") / "candidates"
        generation = generate(examples, folder, listing, args.model, args.model_seconds)
    record["generation"] = generation
    try:
        verified = verify_saved(examples, folder, options, args.budget)
    except GpuUnavailable as exc:
        print(f"optimize_suite: cannot verify here: {exc}", file=sys.stderr)
        return 2
    record["raw"] = verified
    record["summary"] = summarize(verified, generation)
    print_table(record["summary"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

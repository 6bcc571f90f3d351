"""The local model's three jobs (planner, editor, repairer) on the real-code corpus, per job and model.

Generation runs here, on the CPU (``--generate DIR``): for each model and corpus kernel, the
session's search with the model in ``jobs`` mode, nothing verified: the knowledge base (a fresh
one: the catalogue's techniques and examples) gives the techniques, the planner orders the rule
engine's menu, the editor writes hunks guided by the closest verified example, and the repairer
fixes what nvcc rejects. Per job: model calls, candidates, the share that compile, tokens and
seconds per kernel. Every candidate's source is saved in ``DIR/candidates.jsonl`` (one line per
candidate: model, kernel, id, hash, source; one file for the run), and its metadata (generator, job,
launch override, the menu order the planner chose and the rules' own order) in the record ``--out``
writes, so that it can be verified on the GPU machine later; every model conversation is in
``DIR/<model>/traces.sqlite3``.

Verification runs there (``--verify DIR``): each saved candidate through the harness (a candidate
that extends another only once that one was accepted, a candidate shared by both models once),
then per job and model: the share accepted, the speedups, the wins the rules alone did not find
(a model candidate faster than the best rule candidate of the kernel), and the planner against
the rules' fixed order at the same budget (``--planner-budget`` menu entries; geometric mean of
the best accepted speedup, 1.0 when none).

    PYTHONPATH=. python benchmarks/model_suite.py --generate /tmp/model_suite \\
        --models qwen2.5-coder-0.5b-instruct-q4_k_m,qwen2.5-coder-1.5b-instruct-q4_k_m \\
        --only A,B,C --threads 2 --seconds 240 --out benchmarks/results/model_suite.json
    PYTHONPATH=. python benchmarks/model_suite.py --verify /tmp/model_suite \\
        --generation benchmarks/results/model_suite.json --out benchmarks/results/model_suite.json

A ``NAME+lora=FILE.gguf`` model is that GGUF with the adapter (``modelLora``): the distilled editor.

``--endpoint URL`` adds a model behind an OpenAI-compatible server (``--endpoint-model`` its name).

``--refine-from benchmarks/results/corpus_suite.json`` runs only the editor's refinement: for each
kernel, the rules' fastest accepted candidate in that (GPU-verified) file is rebuilt here and the editor
asked to make it faster (``--refine-samples`` samples, repaired as usual); verification then judges
each candidate against that candidate (same results, faster by the harness's interval), so a win is
a verified speedup over the rules' best.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from corpus_baseline import entries, gpu_name, load_spec  # noqa: E402

from kernel_lsp.config import Settings  # noqa: E402
from kernel_lsp.core.candidates import Candidate, OptimizeRequest  # noqa: E402
from kernel_lsp.core.spec import parse_spec, relaunched  # noqa: E402
from kernel_lsp.core.rules import RuleGenerator  # noqa: E402
from kernel_lsp.services import optimizer  # noqa: E402
from kernel_lsp.services.llm import EndpointModel, LlamaModel, LoadOptions  # noqa: E402
from kernel_lsp.services.model_jobs import JOBS, JobBudgets  # noqa: E402
from kernel_lsp.services.models import resolve_model  # noqa: E402
from kernel_lsp.services.session import Session  # noqa: E402

CORPUS = ROOT / "benchmarks" / "corpus"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "model_suite.json"


def _machine() -> dict[str, Any]:
    info: dict[str, Any] = {"host": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
                            "cpus": os.cpu_count()}
    info["gpu"] = gpu_name()
    return info


def _job_of(candidate: Candidate) -> str:
    if candidate.generator.startswith("model:"):
        return candidate.generator.rsplit("/", 1)[-1]
    return "rules"


# --------------------------------------------------------------------------- generation (CPU)


def rules_best(session: Session, name: str, corpus_results: dict[str, Any]) -> tuple[Candidate, float] | None:
    """The rules' fastest accepted candidate of corpus entry ``name`` in ``corpus_results`` (a
    ``corpus_suite.py`` JSON, verified on the GPU machine) and its speedup, rebuilt here: the rules are
    deterministic, so the generator's name gives the same source."""
    row = next((k for k in corpus_results["kernels"] if k["name"] == name), None)
    accepted = [t for t in (row or {}).get("tried", []) if t.get("reason") == "ok" and t.get("speedup")]
    if not accepted:
        return None
    best = max(accepted, key=lambda t: t["speedup"])
    spec = load_spec(name)
    path = str(CORPUS / name / "kernel.cu")
    source = Path(path).read_text(encoding="utf-8")
    rules = RuleGenerator(preprocessed=session.preprocessed(path, source), reprocess=lambda t: session.preprocessed(path, t))
    request = OptimizeRequest(source=source, path=path, kernel=spec.kernel, spec=spec.to_json())
    found = next((c for c in rules.generate(request) if c.generator == best["generator"]), None)
    return (found, best["speedup"]) if found is not None else None


CANDIDATES_FILE = "candidates.jsonl"


def save_sources(root: Path, label: str, kernel: str, items: list[tuple[str, str, str | None]]) -> None:
    """Append ``(id, source, candidate hash)`` of a kernel's candidates to the run's ``candidates.jsonl``."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / CANDIDATES_FILE, "a", encoding="utf-8") as f:
        for ident, source, digest in items:
            f.write(json.dumps({"model": label, "kernel": kernel, "id": ident, "candidate_hash": digest,
                                "source": source}) + "\n")


def load_sources(root: Path) -> dict[tuple[str, str, str], str]:
    """The run's saved sources by (model, kernel, id)."""
    found: dict[tuple[str, str, str], str] = {}
    with open(root / CANDIDATES_FILE, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                item = json.loads(line)
                found[(item["model"], item["kernel"], item["id"])] = item["source"]
    return found


def source_id(item: dict[str, Any]) -> str:
    """A saved candidate's id in ``candidates.jsonl``; records made before it existed name a ``file`` (``cand_00.cu``)."""
    return item.get("id") or Path(item["file"]).stem


def generate_kernel(session: Session, model: Any, name: str, budgets: JobBudgets, root: Path, label: str,
                    refine: tuple[Candidate, float] | None = None) -> dict[str, Any]:
    """The model's jobs on one corpus kernel, or with ``refine`` (the rules' best, verified) only the
    editor's refinement of that candidate; the candidates' sources appended to ``root/candidates.jsonl``."""
    spec = load_spec(name)
    path = str(CORPUS / name / "kernel.cu")
    source = Path(path).read_text(encoding="utf-8")
    if refine is None:
        rules = RuleGenerator(preprocessed=session.preprocessed(path, source), reprocess=lambda t: session.preprocessed(path, t))
    else:
        rules = RuleGenerator(rules=())
        budgets = dataclasses.replace(budgets, planner_samples=0, editor_samples=0)
    budget = optimizer.Budget(max_candidates=1000, max_seconds=budgets.max_seconds + 600, max_tokens=budgets.max_total_tokens)
    start = time.monotonic()
    with session.stores(traces=True) as stores:
        # Every model conversation goes to the folder's trace store (``traces export`` reads it).
        jobs = session.model_generator(model, spec, source, path, verifier=None, budget=budget, cancel=None,
                                       traces=stores.traces, rules=rules, job_budgets=budgets, verified=refine)
        result = optimizer.optimize(source, path, spec.kernel, spec, generators=[jobs], kb=stores.kb, verify=False,
                                    budget=budget)
    wall = time.monotonic() - start
    saved = []
    sources: list[tuple[str, str, str | None]] = []
    # A refinement extends a candidate verified elsewhere, which this unverified search never lists: the
    # editor's and repairer's candidates are taken as the jobs produced them.
    listed = [r.candidate for r in result.results] if refine is None else [c for _, c in jobs.produced]
    for i, c in enumerate(listed):
        ident = f"cand_{i:02d}"
        sources.append((ident, c.source, optimizer.candidate_hash(c)))
        saved.append({"id": ident, "generator": c.generator, "job": _job_of(c), "technique": c.technique,
                      "description": c.description, "launch_override": dict(c.launch_override) if c.launch_override else None,
                      "after": c.after, "candidate_hash": optimizer.candidate_hash(c)})
    rules_order = [e.id for e in jobs.menu]
    row = {
        "name": name, "kernel": spec.kernel, "techniques": list(result.techniques), "state": result.state,
        "wall_s": wall, "stop_reason": jobs.stop_reason,
        "menu": rules_order, "planner_order": list(jobs.order),
        "planner_votes": dict(jobs.plan.votes) if jobs.plan else {},
        "jobs": {job: jobs.stats[job].to_json() for job in JOBS},
        "candidates": saved,
    }
    if refine is not None:
        base, speedup = refine
        sources.append(("base", base.source, None))
        row["refine_base"] = {"id": "base", "generator": base.generator, "speedup": speedup,
                              "launch_override": dict(base.launch_override) if base.launch_override else None}
    save_sources(root, label, name, sources)
    return row


def _model(spec: str, threads: int, n_ctx: int) -> Any:
    if spec.startswith(("http://", "https://")):
        url, _, served = spec.partition("#")
        return EndpointModel(url, model=served or None)
    # NAME+lora=FILE.gguf: the same GGUF with that adapter (``modelLora``), as in planner_offline.
    name, _, lora = spec.partition("+lora=")
    return LlamaModel(resolve_model(name), LoadOptions(n_ctx=n_ctx, threads=threads, lora_path=lora or None),
                      name=os.path.basename(name) + ("+lora" if lora else ""))


def generation_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for job in JOBS:
        stats = [r["jobs"][job] for r in rows]
        checked = sum(s["compile_checked"] for s in stats)
        out[job] = {
            "calls": sum(s["calls"] for s in stats),
            "candidates": sum(s["candidates"] for s in stats),
            "compile_checked": checked,
            "compiled": sum(s["compiled"] for s in stats),
            "compile_share": sum(s["compiled"] for s in stats) / checked if checked else None,
            "hunks_failed": sum(s["hunks_failed"] for s in stats),
            "invalid": sum(s["invalid"] for s in stats),
            "tokens_per_kernel": sum(s["tokens"] for s in stats) / len(rows) if rows else None,
            "seconds_per_kernel": sum(s["wall_s"] for s in stats) / len(rows) if rows else None,
        }
    edit_checked = out["editor"]["compile_checked"] + out["repairer"]["compile_checked"]
    edit_compiled = out["editor"]["compiled"] + out["repairer"]["compiled"]
    out["editor_and_repairer_compile_share"] = edit_compiled / edit_checked if edit_checked else None
    out["planner_changed_the_first_choice"] = sum(
        1 for r in rows if r["planner_order"] and r["menu"] and r["planner_order"][0] != r["menu"][0])
    out["kernels"] = len(rows)
    out["generation_s_per_kernel"] = sum(r["wall_s"] for r in rows) / len(rows) if rows else None
    return out


def generate(args: argparse.Namespace) -> dict[str, Any]:
    names = entries(set(args.only.split(",")) if args.only else None)
    if args.count:
        names = names[: args.count]
    models = [m for m in args.models.split(",") if m]
    if args.endpoint:
        models.append(args.endpoint + ("#" + args.endpoint_model if args.endpoint_model else ""))
    budgets = JobBudgets(planner_samples=args.planner_samples, planner_picks=args.planner_picks,
                         editor_techniques=args.editor_techniques, editor_samples=args.editor_samples,
                         repair_rounds=2, planner_max_tokens=args.planner_max_tokens,
                         editor_max_tokens=args.editor_max_tokens, max_total_tokens=args.tokens,
                         max_seconds=args.seconds, turn_timeout_s=args.seconds, refine_samples=args.refine_samples)
    corpus_results = json.loads(Path(args.refine_from).read_text(encoding="utf-8")) if args.refine_from else None
    root = Path(args.generate)
    if (root / CANDIDATES_FILE).exists():
        raise SystemExit(f"model_suite: {root / CANDIDATES_FILE} exists already; generate into a new folder")
    out: dict[str, Any] = {"models": {}}
    with tempfile.TemporaryDirectory(prefix="model-suite-") as scratch:
        for spec in models:
            model = _model(spec, args.threads, args.n_ctx)
            label = spec.split("#")[0].rstrip("/").rsplit("/", 1)[-1] if spec.startswith("http") else model.name
            settings = Settings(kb_path=os.path.join(scratch, f"{label}.kb.sqlite"), model_mode="jobs")
            (root / label).mkdir(parents=True, exist_ok=True)
            session = Session(settings, workspace_root=str(ROOT), traces_path=str(root / label / "traces.sqlite3"))
            rows = []
            try:
                for name in names:
                    print(f"{label}: {name} ...", file=sys.stderr, flush=True)
                    refine = rules_best(session, name, corpus_results) if corpus_results is not None else None
                    if corpus_results is not None and refine is None:
                        print("  no accepted rule candidate to refine", file=sys.stderr, flush=True)
                        continue
                    row = generate_kernel(session, model, name, budgets, root, label, refine)
                    rows.append(row)
                    jobs = row["jobs"]
                    print(f"  {row['wall_s']:.0f} s; planner {row['planner_order'][:1]} (rules {row['menu'][:1]}); "
                          f"editor {jobs['editor']['candidates']} cand, {jobs['editor']['compiled']}/{jobs['editor']['compile_checked']} "
                          f"compiled; repairer {jobs['repairer']['candidates']} cand, "
                          f"{jobs['repairer']['compiled']}/{jobs['repairer']['compile_checked']} compiled", file=sys.stderr,
                          flush=True)
            finally:
                model.close()
            load_s = getattr(model, "load_s", None)
            out["models"][label] = {"model": spec, "load_s": load_s, "kernels": rows, "summary": generation_summary(rows)}
    out["budgets"] = {k: v for k, v in vars(budgets).items()}
    return out


# --------------------------------------------------------------------------- verification (GPU)


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values)) if values else None


def verify_kernel(row: dict[str, Any], sources: dict[tuple[str, str, str], str], label: str, session: Session,
                  cache: dict[str, Any]) -> list[dict[str, Any]]:
    from kernel_lsp.core.spec import SpecError, with_candidate_launch
    from kernel_lsp.services.harness import GpuUnavailable

    spec = load_spec(row["name"])
    path = CORPUS / row["name"] / "kernel.cu"
    source = path.read_text(encoding="utf-8")
    # The session's verifier: the file's own build flags and the harness's options, as the editor's search.
    verifier = session.verifier(str(path))
    base = row.get("refine_base")
    if base is not None:
        # A refinement is judged against the rules' best, launched as that candidate is: the same results
        # (the rules' best matched the original on the GPU machine) and faster by the harness's interval.
        source = sources[(label, row["name"], source_id(base))]
        spec = parse_spec(relaunched(spec.to_json(), base["launch_override"] or {}), spec.base_dir)
    accepted_generators: set[str] = set()
    verdicts = []
    for item in row["candidates"]:
        if item["after"] is not None and item["after"] not in accepted_generators and base is None:
            verdicts.append({**item, "status": "skipped (its base was not accepted)", "speedup": None, "accepted": False})
            continue
        key = item["candidate_hash"]
        if key not in cache:
            candidate = sources[(label, row["name"], source_id(item))]
            try:
                launch = None if base is not None else item["launch_override"]
                verdict = verifier(source, candidate, with_candidate_launch(spec, launch), None)
                cache[key] = {"accepted": verdict.accepted, "reason": verdict.reason.value, "speedup": verdict.speedup,
                              "speedup_ci_low": verdict.speedup_ci_low, "first_error": (verdict.errors or (None,))[0]}
            except (GpuUnavailable, SpecError) as exc:
                cache[key] = {"accepted": False, "reason": f"not verified: {exc}", "speedup": None}
        result = cache[key]
        if result["accepted"]:
            accepted_generators.add(item["generator"])
        verdicts.append({**item, **result, "status": result["reason"]})
    return verdicts


def verification_summary(model_rows: list[dict[str, Any]], verified: dict[str, list[dict[str, Any]]],
                         planner_budget: int) -> dict[str, Any]:
    per_job: dict[str, Any] = {}
    for job in ("rules", "editor", "repairer"):
        items = [v for r in model_rows for v in verified[r["name"]] if v["job"] == job]
        accepted = [v for v in items if v["accepted"]]
        per_job[job] = {"candidates": len(items), "accepted": len(accepted),
                        "accepted_share": len(accepted) / len(items) if items else None,
                        "speedups": sorted((v["speedup"] for v in accepted if v["speedup"]), reverse=True)}
    wins = []
    planner_best, rules_best = [], []
    for r in model_rows:
        items = verified[r["name"]]
        rule_best = max([v["speedup"] for v in items if v["job"] == "rules" and v["accepted"] and v["speedup"]] or [1.0])
        model_best = max([v["speedup"] for v in items if v["job"] in ("editor", "repairer") and v["accepted"]
                          and v["speedup"]] or [1.0])
        base = r.get("refine_base")
        if base is not None:
            # Accepted against the rules' best: faster than it by the harness's interval.
            over = max([v["speedup"] for v in items if v["accepted"] and v["speedup"]] or [None], key=lambda x: x or 0)
            if over is not None:
                wins.append({"kernel": r["name"], "over_rules_best": over, "rules_speedup": base["speedup"],
                             "model_speedup": base["speedup"] * over, "refines": base["generator"]})
            continue
        if model_best > rule_best:
            wins.append({"kernel": r["name"], "model_speedup": model_best, "rules_speedup": rule_best})

        by_generator = {v["generator"]: v for v in items}

        def entry(v: dict[str, Any]) -> str:
            """The menu entry a rule candidate belongs to: a sequence's belongs to its first step's."""
            while v["after"] is not None and v["after"] in by_generator:
                v = by_generator[v["after"]]
            return v["generator"].split(":", 1)[-1]

        def best_of(order: list[str]) -> float:
            chosen = set(order[:planner_budget])
            speedups = [v["speedup"] for v in items if v["job"] == "rules" and v["accepted"] and v["speedup"]
                        and entry(v) in chosen]
            return max(speedups or [1.0])

        planner_best.append(best_of(r["planner_order"]))
        rules_best.append(best_of(r["menu"]))
    return {"per_job": per_job, "wins_rules_did_not_find": wins,
            "planner_vs_rule_order": {"budget_menu_entries": planner_budget,
                                      "planner_geomean": _geomean(planner_best), "rule_order_geomean": _geomean(rules_best)}}


def verify_all(args: argparse.Namespace) -> dict[str, Any]:
    generation = json.loads(Path(args.generation).read_text(encoding="utf-8"))
    session = Session(Settings(), workspace_root=str(ROOT), use_kb=False)
    cache: dict[str, Any] = {}
    sources = load_sources(Path(args.verify))
    for label, model in generation["models"].items():
        verified = {}
        for row in model["kernels"]:
            print(f"{label}: verifying {row['name']} ({len(row['candidates'])} candidates) ...", file=sys.stderr, flush=True)
            verified[row["name"]] = verify_kernel(row, sources, label, session, cache)
        model["verification"] = verification_summary(model["kernels"], verified, args.planner_budget)
        model["verified_candidates"] = verified
    return generation


def print_table(record: dict[str, Any]) -> None:
    for label, model in record["models"].items():
        s = model["summary"]
        print(f"{label}: {s['kernels']} kernels, {s['generation_s_per_kernel']:.0f} s generation per kernel; "
              f"editor+repairer compile share {s['editor_and_repairer_compile_share']}")
        print(f"  {'job':9s} {'calls':>5s} {'cand':>4s} {'compiled':>9s} {'tok/kernel':>10s} {'s/kernel':>8s}")
        for job in JOBS:
            j = s[job]
            print(f"  {job:9s} {j['calls']:5d} {j['candidates']:4d} {j['compiled']:4d}/{j['compile_checked']:<4d} "
                  f"{j['tokens_per_kernel']:10.0f} {j['seconds_per_kernel']:8.1f}")
        if "verification" in model:
            v = model["verification"]
            print("  accepted: " + ", ".join(f"{job} {d['accepted']}/{d['candidates']}" for job, d in v["per_job"].items()))
            p = v["planner_vs_rule_order"]
            if p["planner_geomean"] is not None:
                print(f"  planner geomean {p['planner_geomean']:.3f}x vs rule order {p['rule_order_geomean']:.3f}x "
                      f"({p['budget_menu_entries']} menu entries)")
            print(f"  wins the rules did not find: {len(v['wins_rules_did_not_find'])}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--generate", metavar="DIR", help="generate here (CPU) and save the candidates in DIR/candidates.jsonl")
    mode.add_argument("--verify", metavar="DIR", help="verify the candidates saved in DIR/candidates.jsonl (GPU)")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--generation", help="with --verify: the JSON --generate wrote")
    parser.add_argument("--models", default="qwen2.5-coder-0.5b-instruct-q4_k_m,qwen2.5-coder-1.5b-instruct-q4_k_m")
    parser.add_argument("--endpoint", help="also a model behind this OpenAI-compatible server")
    parser.add_argument("--endpoint-model", help="the server's name for it")
    parser.add_argument("--only", default="", help="comma-separated corpus entries")
    parser.add_argument("--count", type=int, default=0, help="the first N corpus entries (after --only)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--seconds", type=float, default=240.0, help="model and compiler seconds per kernel (default 240)")
    parser.add_argument("--tokens", type=int, default=30_000, help="model tokens per kernel (default 30000)")
    parser.add_argument("--planner-samples", type=int, default=3)
    parser.add_argument("--planner-picks", type=int, default=3)
    parser.add_argument("--editor-techniques", type=int, default=1)
    parser.add_argument("--editor-samples", type=int, default=2)
    parser.add_argument("--planner-max-tokens", type=int, default=48)
    parser.add_argument("--editor-max-tokens", type=int, default=400)
    parser.add_argument("--planner-budget", type=int, default=3, help="with --verify: menu entries compared (default 3)")
    parser.add_argument("--refine-from", metavar="CORPUS_JSON",
                        help="refinement only: the editor on each kernel's fastest accepted rule candidate in this "
                             "corpus_suite.py result; verified against that candidate")
    parser.add_argument("--refine-samples", type=int, default=2, help="editor samples on the candidate refined (default 2)")
    args = parser.parse_args(argv)
    command = " ".join(["python", "benchmarks/model_suite.py", *(argv if argv is not None else sys.argv[1:])])
    if args.generate:
        record = generate(args)
        record.update({"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                       "generation_command": command, "generation_machine": _machine()})
    else:
        if not args.generation:
            parser.error("--verify needs --generation (the JSON --generate wrote)")
        record = verify_all(args)
        record.update({"verification_date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                       "verification_command": command, "verification_machine": _machine()})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    print_table(record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: the planner's first choice on each kernel's menu, scored by the H200's recorded verdicts.

    .venv/bin/python benchmarks/planner_offline.py --models qwen2.5-coder-0.5b-instruct-q4_k_m[+lora=FILE.gguf],...
        [--data training/data/chats.jsonl] [--split heldout|train|all] [--samples 3] [--threads 2]
        [--json benchmarks/results/planner_offline.json]

No GPU: each planner chat of ``training/data/chats.jsonl`` (``training/build_dataset.py``) holds the
planner's own prompt on the rules' menu of one kernel and, per menu entry, the speedup the recorded H200
runs verified for its best candidate (1.0 when none was faster, unknown when none of them ran). Each
model answers the prompt as the planner job does (``--samples`` samples at the job's temperatures, under
its schema; the votes ranked by ``rank_votes``, the menu's own order when no entry gets enough votes),
and its first choice gets that entry's recorded speedup: what the search would find first with that
planner. Beside it, side by side in one run: the rules' own order (the first entry) and the best entry.
A ``+lora=FILE`` model is the same GGUF with that adapter (``modelLora``). Rows of the ``heldout`` split
are the corpus's held-out kernels, which no adapter is trained on; for a base model every row is unseen.

Prints per model: rows, the share of first choices that are the best entry (and of the rules' first
entries), the geometric mean of the first choices' speedups beside the rules' first entries' and the best
entries' on the rows where both first choices have a recorded outcome, seconds and tokens per row; writes every row's answers to the JSON file with the machine, date and command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernel_lsp.services import models  # noqa: E402
from kernel_lsp.services.llm import LlamaModel, LoadOptions  # noqa: E402
from kernel_lsp.services.model_jobs import JobBudgets, parse_choice, planner_schema, rank_votes  # noqa: E402


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def load_model(spec: str, threads: int) -> tuple[str, LlamaModel]:
    name, _, lora = spec.partition("+lora=")
    path = models.resolve_model(name)
    return spec, LlamaModel(path, LoadOptions(n_ctx=4096, threads=threads, lora_path=lora or None), name=name)


def plan(model: LlamaModel, row: dict, samples: int, budgets: JobBudgets) -> dict:
    """The planner job's answer on one chat: the samples' choices and the ranked first choice."""
    menu = row["metadata"]["menu"]
    messages = row["messages"][:2]
    choices, texts, tokens = [], [], 0
    start = time.perf_counter()
    for sample in range(samples):
        temperature = budgets.temperatures[sample % len(budgets.temperatures)]
        done = model.chat(messages, schema=planner_schema(menu), max_tokens=budgets.planner_max_tokens,
                          temperature=temperature, seed=budgets.seed + 100 * sample, timeout_s=600)
        tokens += done.prompt_tokens + done.completion_tokens
        texts.append(done.text)
        parsed = parse_choice(done.text, menu)
        if parsed is not None:
            choices.append(parsed[0])
    ranked = rank_votes(choices, menu)
    first = ranked[0] if ranked else menu[0]
    return {"choices": choices, "answers": texts, "first": first, "voted": bool(ranked),
            "wall_s": time.perf_counter() - start, "tokens": tokens}


def summary(rows: list[dict]) -> dict:
    """The model's first choices beside the rules' first entry and the best one, on the rows where both first
    choices have a recorded outcome."""
    both = [r for r in rows if r["recorded"][r["first"]] is not None and r["recorded"][r["menu"][0]] is not None]
    return {
        "rows": len(rows),
        "rows_compared": len(both),
        "best_share": sum(r["first"] == r["best"] for r in rows) / len(rows) if rows else None,
        "rules_first_best_share": sum(r["menu"][0] == r["best"] for r in rows) / len(rows) if rows else None,
        "geomean_first": geomean([r["recorded"][r["first"]] for r in both]),
        "geomean_rules_first": geomean([r["recorded"][r["menu"][0]] for r in both]),
        "geomean_best": geomean([r["recorded"][r["best"]] for r in both]),
        "voted_share": sum(r["voted"] for r in rows) / len(rows) if rows else None,
        "seconds_per_row": sum(r["wall_s"] for r in rows) / len(rows) if rows else None,
        "tokens_per_row": sum(r["tokens"] for r in rows) / len(rows) if rows else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True, help="comma-separated manifest names or GGUF paths, +lora=FILE")
    parser.add_argument("--data", type=Path, default=ROOT / "training" / "data" / "chats.jsonl")
    parser.add_argument("--split", choices=("heldout", "train", "all"), default="all")
    parser.add_argument("--samples", type=int, default=JobBudgets().planner_samples)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", default=None, help="comma-separated kernel entries")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "planner_offline.json")
    args = parser.parse_args(argv)
    chats = [json.loads(line) for line in args.data.read_text(encoding="utf-8").splitlines() if line.strip()]
    chats = [c for c in chats if c["metadata"]["job"] == "planner"
             and (args.split == "all" or c["metadata"]["split"] == args.split)
             and (args.only is None or c["metadata"]["name"] in args.only.split(","))]
    budgets = JobBudgets()
    results: dict[str, list[dict]] = {}
    for spec in args.models.split(","):
        label, model = load_model(spec, args.threads)
        rows = []
        try:
            for chat in chats:
                meta = chat["metadata"]
                answer = plan(model, chat, args.samples, budgets)
                rows.append({"name": meta["name"], "split": meta["split"], "menu": meta["menu"], "best": meta["choice"],
                             "recorded": meta["recorded"], **answer})
                got = meta["recorded"][answer["first"]]
                print(f"{label[:40]:<40} {meta['name'][:36]:<36} first {answer['first'][:30]:<30} "
                      f"{'unknown' if got is None else f'{got:.2f}x':>8} (best {meta['choice'][:24]}, "
                      f"{meta['speedup']:.2f}x) {answer['wall_s']:.1f} s", flush=True)
        finally:
            model.close()
        results[label] = rows
    summaries = {label: summary(rows) for label, rows in results.items()}
    print(f"\n{'model':<48} {'rows':>5} {'cmp':>4} {'best':>6} {'rules best':>10} {'first':>7} {'rules':>7} "
          f"{'oracle':>7} {'s/row':>7}")
    for label, s in summaries.items():
        cell = lambda v: f"{v:.3f}" if v is not None else "-"  # noqa: E731
        print(f"{label[:48]:<48} {s['rows']:>5} {s['rows_compared']:>4} {cell(s['best_share']):>6} "
              f"{cell(s['rules_first_best_share']):>10} {cell(s['geomean_first']):>7} "
              f"{cell(s['geomean_rules_first']):>7} {cell(s['geomean_best']):>7} {cell(s['seconds_per_row']):>7}")
    report = {
        "benchmark": "planner_offline",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_1_5_15_min": list(os.getloadavg())},
        "units": "speedups: the recorded H200 verdicts of the chosen entry's candidates; geomeans over the rows "
                 "whose first choice has a recorded outcome",
        "split": args.split, "samples": args.samples,
        "summary": summaries,
        "rows": results,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

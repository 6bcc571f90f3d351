"""The distilled editor's training data: every rewrite the H200 verified faster, as the editor's chats.

    .venv/bin/python training/build_dataset.py [--out training/data/chats.jsonl] [--variants 2]

Reads the recorded GPU runs (``benchmarks/results/corpus_suite.json``,
``benchmarks/results/corpus_heldout_before.json``, ``benchmarks/results/optimize_suite.json``), runs the
rules again on each kernel they accepted a candidate of (no GPU), and writes one JSON line per chat
(:mod:`kernel_lsp.services.distill_data`): the editor's chats and one planner chat per kernel, each with
``messages`` and ``metadata`` (the job, the kernel, technique, generator, verified speedup, variant, split (``heldout`` for the corpus's held-out kernels, which no
training step reads)). Prints a table of rows per split and technique, and what was left out and why.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernel_lsp.config import Settings  # noqa: E402
from kernel_lsp.core.spec import parse_spec  # noqa: E402
from kernel_lsp.services import distill_data as dd  # noqa: E402
from kernel_lsp.services.session import Session  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CORPUS = ROOT / "benchmarks" / "corpus"
EXAMPLES = ROOT / "examples"


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def entry(name: str) -> tuple[str, Path, dict]:
    """(source, path, spec JSON) of a corpus entry or ``example:NAME``."""
    if name.startswith("example:"):
        folder = EXAMPLES / name.split(":", 1)[1]
        path = folder / "original.cu"
    else:
        folder = CORPUS / name
        path = folder / "kernel.cu"
    return path.read_text(encoding="utf-8"), path, json.loads((folder / "spec.json").read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "training" / "data" / "chats.jsonl")
    parser.add_argument("--variants", type=int, default=2, help="renamed variants per rewrite")
    args = parser.parse_args(argv)
    outcomes = dd.merge_outcomes([
        dd.outcomes_in_corpus_run(load("corpus_suite.json")),
        dd.outcomes_in_corpus_run(load("corpus_heldout_before.json")),
        {f"example:{k}": v for k, v in dd.outcomes_in_examples_run(load("optimize_suite.json")).items()},
    ])
    accepted = {name: by for name, by in dd.faster(outcomes).items() if by}
    found: list[dd.Rewrite] = []
    planner_rows: list[dict] = []
    left_out: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as scratch:
        session = Session(Settings(kb_path=os.path.join(scratch, "kb.sqlite")), workspace_root=str(ROOT), use_kb=False)
        for name in sorted(accepted):
            source, path, spec_json = entry(name)
            spec = parse_spec(spec_json, str(path.parent))
            heldout = bool((spec.notes or {}).get("heldout"))
            got = dd.rewrites(name, source, str(path), spec, accepted[name], session, heldout)
            plan = dd.planner_chat(name, source, str(path), spec, outcomes[name], session, heldout)
            if plan is not None:
                planner_rows.append(plan)
            missing = sorted(set(accepted[name]) - {r.generator for r in got})
            if missing:
                left_out[name] = (f"{len(missing)} of {len(accepted[name])} accepted candidates change the launch "
                                  f"or more than the kernel, or are no longer made: {', '.join(missing)}")
            found += got
    editor_rows = list(dd.chat_rows(found, variants=args.variants))
    rows = editor_rows + planner_rows
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    counts = collections.Counter((r["metadata"]["split"], r["metadata"]["job"], r["metadata"].get("technique", "-"))
                                 for r in rows)
    print(f"{'split':<8} {'job':<8} {'technique':<40} rows")
    for (split, job, technique), n in sorted(counts.items()):
        print(f"{split:<8} {job:<8} {technique:<40} {n}")
    kernels = {s: len({r['metadata']['name'] for r in rows if r['metadata']['split'] == s}) for s in ("train", "heldout")}
    print(f"{len(rows)} rows from {len(found)} rewrites of {sum(kernels.values())} kernels "
          f"(train {kernels['train']}, held out {kernels['heldout']}); written to {args.out}")
    kinds = collections.Counter(r["metadata"]["variant"].split(":", 1)[0] for r in editor_rows)
    print(f"editor rows: {kinds['original']} of the {len(found)} rewrites (the others change a line that is blank "
          f"or not unique, which the editor's one-line hunks cannot write), {kinds['renamed']} with renamed "
          f"locals, {kinds['long-indices']} with long thread indices")
    for name, why in sorted(left_out.items()):
        print(f"left out of {name}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``kernel-lsp tree show [--tree FILE]`` and ``kernel-lsp tree refine --dataset DIR``.

``show`` prints the profiling tree (the shipped default or ``--tree``).
``refine`` improves a tree on a dataset of full profiles: DIR holds raw-page CSV
exports of ``--set full`` reports (``ncu -i R.ncu-rep --csv --page raw
--print-units base > NAME.csv``) and, optionally, the .cu files whose kernels they
profile (for static facts). Each REWRITE/SPLIT edit is kept only when it raises
the score; the log lists every round. Exit status: 0 ok, 2 bad usage or data.
"""

from __future__ import annotations

import argparse
import json
import sys

from kernel_lsp.cli import EXIT_OK, EXIT_USAGE
from kernel_lsp.core import profiling_tree as T
from kernel_lsp.core.profile_render import tree_text
from kernel_lsp.core.profiling_tree import TreeError, parse_tree, tree_to_json


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("tree", help="show or refine the profiling tree")
    sub = parser.add_subparsers(dest="tree_command", metavar="ACTION")
    show = sub.add_parser("show", help="print the profiling tree")
    show.add_argument("--tree", help="tree JSON (default: the shipped tree)")
    show.add_argument("--json", action="store_true", help="print the tree's JSON")
    show.set_defaults(func=run_show)
    refine = sub.add_parser("refine", help="refine a tree on recorded full profiles")
    refine.add_argument("--dataset", required=True, help="folder of raw-page CSV exports of full profiles (+ .cu files)")
    refine.add_argument("--sources", action="append", default=[], help="folder of the profiled .cu files (repeatable)")
    refine.add_argument("--tree", help="starting tree JSON (default: the shipped tree)")
    refine.add_argument("--costs", help="section cost table JSON (default: the shipped data/ncu_sections.json)")
    refine.add_argument("--cost-weight", type=float, default=0.25, help="weight of the cost ratio in the score (default 0.25)")
    refine.add_argument("--rounds", type=int, default=20, help="most edits to accept (default 20)")
    refine.add_argument("--out", help="write the refined tree here (default: print it)")
    refine.set_defaults(func=run_refine)
    parser.set_defaults(func=lambda args: (parser.print_help(sys.stderr), EXIT_USAGE)[1])


def _tree(path: str | None):
    # Services are imported when the subcommand runs: cli.py imports every command module to build its parser.
    from kernel_lsp.services.profiler import default_tree_path

    with open(path or default_tree_path(), encoding="utf-8") as f:
        return parse_tree(f.read())


def run_show(args: argparse.Namespace) -> int:
    try:
        tree = _tree(args.tree)
    except (OSError, TreeError) as exc:
        print(f"tree: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps(tree_to_json(tree), indent=2) if args.json else tree_text(tree))
    return EXIT_OK


def run_refine(args: argparse.Namespace) -> int:
    from kernel_lsp.services.profiler import load_costs
    from kernel_lsp.services.tree_dataset import DatasetError, load_dataset

    try:
        tree = _tree(args.tree)
        samples = load_dataset(args.dataset, tuple(args.sources))
    except (OSError, T.TreeError, DatasetError) as exc:
        print(f"tree refine: {exc}", file=sys.stderr)
        return EXIT_USAGE
    costs = load_costs(args.costs)
    if costs is None:
        print("tree refine: no section cost table (data/ncu_sections.json or --costs)", file=sys.stderr)
        return EXIT_USAGE
    before = T.score(tree, samples, costs, cost_weight=args.cost_weight)
    refined, log = T.refine(tree, samples, costs, cost_weight=args.cost_weight, max_rounds=args.rounds)
    after = T.score(refined, samples, costs, cost_weight=args.cost_weight)
    for entry in log:
        verdict = "accepted" if entry.accepted else "rejected"
        print(f"round {entry.round}: {entry.kind} {entry.edit}: {entry.score_before:.4f} -> {entry.score_after:.4f} {verdict}",
              file=sys.stderr)
    print(f"{len(samples)} samples; agreement {before.agreement:.2%} -> {after.agreement:.2%}; "
          f"cost {before.cost_ratio:.2%} -> {after.cost_ratio:.2%} of full", file=sys.stderr)
    text = json.dumps(T.tree_to_json(refined), indent=2)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    else:
        print(text)
    return EXIT_OK

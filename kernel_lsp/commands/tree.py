"""``kernel-lsp tree show [--tree FILE]`` and ``kernel-lsp tree refine --dataset DIR``.

``show`` prints the profiling tree (the shipped default or ``--tree``).
``learn --corpus DIR --profiles P --outcomes O`` learns the tree from optimization feedback
(:mod:`kernel_lsp.core.tree_learning`) and evaluates it on a held-out split.
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
from dataclasses import replace

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
    learn = sub.add_parser("learn", help="learn the tree from optimization feedback on the corpus")
    learn.add_argument("--corpus", required=True, help="corpus folder (NAME/kernel.cu + NAME/spec.json)")
    learn.add_argument("--profiles", required=True, help="every-group profiles of the corpus (benchmarks/tree_data.py)")
    learn.add_argument("--outcomes", required=True, help="the harness's verdicts on the corpus (benchmarks/corpus_suite.py)")
    learn.add_argument("--budget", type=int, default=3, help="verified candidates per kernel (default 3)")
    learn.add_argument("--tree", help="starting tree JSON (default: the hand-written tree, data/profiling_tree_hand.json)")
    learn.add_argument("--cost-model", choices=("cupti", "ncu"), default="cupti",
                       help="what a profile costs: the GPU worker's CUPTI profiles (default, data/cupti_costs.json) or ncu runs")
    learn.add_argument("--cost-weight", type=float, default=0.25, help="weight of the cost ratio in the score (default 0.25)")
    learn.add_argument("--min-gain", type=float, default=0.01,
                       help="least score gain that keeps an edit, in ln-geomean units (default 0.01)")
    learn.add_argument("--rounds", type=int, default=20, help="most learning rounds (default 20)")
    learn.add_argument("--patience", type=int, default=1, help="stop after this many rounds without gain (default 1)")
    learn.add_argument("--held-out-every", type=int, default=3, help="every N-th kernel by name is held out (default 3)")
    learn.add_argument("--seed", type=int, default=0, help="seed of the knowledge base's draw (default 0)")
    learn.add_argument("--replicas", type=int, default=8,
                       help="replays a score averages, each with its own draw seed and kernel order (default 8)")
    learn.add_argument("--confirm-replicas", type=int, default=8,
                       help="replays under other seeds and orders that must confirm each kept edit (default 8; 0: none)")
    learn.add_argument("--noise-z", type=float, default=2.0,
                       help="an edit is kept only when its gain exceeds this many standard errors over the replicas (default 2)")
    learn.add_argument("--agreement-dataset",
                       help="recorded full profiles a learned tree's classes must agree with (raw-page CSV exports; "
                            "default: the checkout's tests/fixtures/ncu/dataset, which tests/unit/test_tree.py uses)")
    learn.add_argument("--agreement-sources", action="append",
                       help="folder of the .cu files of those profiles (repeatable; default: programs/ beside the dataset)")
    learn.add_argument("--min-agreement", type=float, default=0.9,
                       help="an edit is not kept below this agreement, unless the starting tree is below it (default 0.9)")
    learn.add_argument("--agreement-margin", type=float, default=0.05,
                       help="nor below the starting tree's agreement less this (default 0.05)")
    learn.add_argument("--records", help="learning records JSON: written when learning ends, resumed from when present")
    learn.add_argument("--out", help="write the learned tree here (default: print it)")
    learn.set_defaults(func=run_learn)
    parser.set_defaults(func=lambda args: (parser.print_help(sys.stderr), EXIT_USAGE)[1])


def _tree(path: str | None, hand: bool = False):
    """The tree at ``path``, else the shipped default (``hand``: the hand-written tree learning starts from)."""
    # Services are imported when the subcommand runs: cli.py imports every command module to build its parser.
    from kernel_lsp.services.profiler import default_tree_path, hand_tree_path

    with open(path or (hand_tree_path() if hand else default_tree_path()), encoding="utf-8") as f:
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
    _emit_tree(refined, args.out)
    return EXIT_OK


def _feedback_json(feedback) -> dict:
    import math

    first = math.exp(sum(math.log(c.speedup) for c in feedback.cases) / len(feedback.cases)) if feedback.cases else 1.0
    return {"geomean_speedup": feedback.geomean_speedup, "geomean_first_replica": first,
            "cost_ratio": feedback.cost_ratio, "score": feedback.value,
            "replica_scores": list(feedback.replica_values), "seconds_per_kernel": feedback.seconds_per_kernel,
            "kernels": [{"name": c.name, "state": c.state, "state_from": "source" if c.from_source else "profile",
                         "speedup": c.speedup, "tried": list(c.tried), "unknown": c.unknown, "seconds": c.seconds}
                        for c in feedback.cases]}


def run_learn(args: argparse.Namespace) -> int:
    import os

    from kernel_lsp.core import kb_logic
    from kernel_lsp.core import tree_learning as L
    from kernel_lsp.services.kb import catalogue_text
    from kernel_lsp.services.profiler import load_costs, load_cupti_costs
    from kernel_lsp.services.tree_dataset import load_corpus_cases, load_recorded_samples, split_cases

    try:
        start = _tree(args.tree, hand=True)
        cases, left_out = load_corpus_cases(args.corpus, args.profiles, args.outcomes)
        recorded = load_recorded_samples(args.agreement_dataset,
                                         tuple(args.agreement_sources) if args.agreement_sources else None)
    except (OSError, ValueError, KeyError, T.TreeError) as exc:
        print(f"tree learn: {exc}", file=sys.stderr)
        return EXIT_USAGE
    costs = load_cupti_costs() if args.cost_model == "cupti" else load_costs()
    ncu_costs = load_costs()
    if costs is None or ncu_costs is None or len(cases) < 2:
        print("tree learn: " + ("no section cost table" if costs is None or ncu_costs is None
                                else f"{len(cases)} usable kernels"), file=sys.stderr)
        return EXIT_USAGE
    # Scored as tests/unit/test_tree.py scores the shipped tree: the same samples and the ncu section table.
    agreement = L.Agreement(recorded, ncu_costs, start, min_agreement=args.min_agreement, margin=args.agreement_margin)
    states, priors = kb_logic.catalogue_states(catalogue_text()[1])
    policy = L.Policy(states, priors, budget=args.budget, seed=args.seed, replicas=args.replicas)
    train, held = split_cases(cases, args.held_out_every)
    replay_train, replay_held = L.Replay(train, costs, policy), L.Replay(held, costs, policy)
    confirm = (L.Replay(train, costs, replace(policy, seed=args.seed + args.replicas, replicas=args.confirm_replicas))
               if args.confirm_replicas > 0 else None)
    steps_done: list[dict] = []
    tree = start
    if args.records and os.path.exists(args.records):
        with open(args.records, encoding="utf-8") as f:
            previous = json.load(f)
        tree = parse_tree(previous["tree"])
        steps_done = previous.get("steps", [])
        print(f"resuming from {args.records}: {len(steps_done)} rounds done", file=sys.stderr)

    def save(tree_now, steps, evaluation=None) -> None:
        if not args.records:
            return
        with open(args.records, "w", encoding="utf-8") as f:
            json.dump({"format": "kernel-lsp-tree-learning", "budget": args.budget, "cost_weight": args.cost_weight,
                       "cost_model": args.cost_model, "command": " ".join(["kernel-lsp", *sys.argv[1:]]),
                       "min_gain": args.min_gain, "noise_z": args.noise_z, "seed": args.seed,
                       "replicas": args.replicas, "confirm_replicas": args.confirm_replicas,
                       "agreement": {"samples": agreement.samples, "start": agreement.start, "floor": agreement.floor,
                                     "min_agreement": args.min_agreement, "margin": args.agreement_margin},
                       "train": [c.sample.name for c in train],
                       "held_out": [c.sample.name for c in held], "left_out": left_out, "steps": steps,
                       "tree": T.tree_to_json(tree_now), "evaluation": evaluation}, f, indent=1)

    rounds_left = max(0, args.rounds - len(steps_done))
    learned, steps = L.learn(tree, replay_train, cost_weight=args.cost_weight, min_gain=args.min_gain,
                             noise_z=args.noise_z, max_rounds=rounds_left, patience=args.patience, confirm=confirm,
                             agreement=agreement)
    offset = len(steps_done)
    steps_done += [{"round": s.round + offset, "kind": s.kind, "edit": s.edit, "score_before": s.score_before,
                    "score_after": s.score_after, "geomean_after": s.geomean_after,
                    "cost_ratio_after": s.cost_ratio_after, "gain_se": s.gain_se, "confirm_gain": s.confirm_gain,
                    "confirm_se": s.confirm_se, "agreement_before": s.agreement_before,
                    "agreement_after": s.agreement_after, "refused_edit": s.refused_edit,
                    "refused_gain": s.refused_gain, "refused_agreement": s.refused_agreement, "kept": s.kept}
                   for s in steps]
    for s in steps_done[offset:]:
        print(f"round {s['round']}: {s['kind']} {s['edit']}: {s['score_before']:.4f} -> {s['score_after']:.4f} "
              f"(se {s.get('gain_se', 0.0):.4f}"
              + (f"; confirmed gain {s['confirm_gain']:.4f}, se {s['confirm_se']:.4f}" if s.get("confirm_gain") is not None else "")
              + (f"; agreement {s['agreement_after']:.0%}" if s.get("agreement_after") is not None else "")
              + f") {'kept' if s['kept'] else 'not kept'}"
              + (f"; above it, {s['refused_edit']} (gain {s['refused_gain']:.4f}) fell to agreement "
                 f"{s['refused_agreement']:.0%}" if s.get("refused_edit") else ""), file=sys.stderr)
    learned = replace(learned, name="learned", doc=f"Learned by `kernel-lsp tree learn` from {start.name!r} on "
                      f"{len(train)} corpus kernels (budget {args.budget} verified candidates, cost weight "
                      f"{args.cost_weight}, {args.replicas} replicas); a leaf with state_from 'source' has the optimizer "
                      f"rank its kernels by the static analysis' state; `kernel-lsp tree show` gives each learned "
                      f"node's round and score.")
    evaluation = {}
    # Agreement on the recorded profiles (the same for both splits): the full profile is its own class, and
    # without a profile there is no class to show.
    agreements = {"learned": agreement.of(learned), "hand_written": agreement.of(start), "full": 1.0, "no_profile": None}
    for split, replay in (("train", replay_train), ("held_out", replay_held)):
        evaluation[split] = {"learned": _feedback_json(replay.run(learned, args.cost_weight)),
                             "hand_written": _feedback_json(replay.run(start, args.cost_weight)),
                             "full": _feedback_json(replay.run_full(args.cost_weight)),
                             "no_profile": _feedback_json(replay.run(None, args.cost_weight))}
        for who, value in agreements.items():
            evaluation[split][who]["agreement"] = value
    save(learned, steps_done, evaluation)
    print(f"{len(cases)} kernels ({len(train)} train, {len(held)} held out); left out: {len(left_out)}", file=sys.stderr)
    print(f"{'split':9s} {'profile':13s} {'geomean':>8s} {'seed ' + str(args.seed):>8s} {'cost':>7s} {'s/kernel':>9s} "
          f"{'unknown':>8s} {'agrees':>7s}   (geomean: over {args.replicas} replicas; agrees: on {agreement.samples} "
          f"recorded full profiles, floor {agreement.floor:.0%})", file=sys.stderr)
    for split, rows in evaluation.items():
        for who, r in rows.items():
            unknown = sum(k["unknown"] for k in r["kernels"])
            print(f"{split:9s} {who:13s} {r['geomean_speedup']:7.3f}x {r['geomean_first_replica']:7.3f}x "
                  f"{r['cost_ratio']:6.1%} {r['seconds_per_kernel']:9.2f} {unknown:8d} "
                  f"{'-' if r['agreement'] is None else format(r['agreement'], '.0%'):>7s}", file=sys.stderr)
    _emit_tree(learned, args.out)
    return EXIT_OK


def _emit_tree(tree, out: str | None) -> None:  # noqa: ANN001 - profiling_tree.Tree
    """The tree's JSON into ``out``, or on stdout without one."""
    text = json.dumps(T.tree_to_json(tree), indent=2)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    else:
        print(text)

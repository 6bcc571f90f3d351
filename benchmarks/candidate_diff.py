"""Which candidates the rules list for every corpus kernel and example, and whether each compiles.

``record`` runs the rule generator the search uses (:class:`~kernel_lsp.core.rules.RuleGenerator`
with the session's preprocessed view, every sequence listed as a dry run lists it) over every
non-held-out corpus kernel and every example, and compiles each candidate with the file's own
build flags (nvcc, compile only: no GPU). It writes JSON: per kernel, every candidate's generator
name, technique, launch change and the SHA-256 of its source, whether it compiled (the first
error line if not), and each rule's precondition verdict.

``compare`` reads two such records (before and after a change of the rules) and the recorded GPU
results (``benchmarks/results/corpus_suite.json``, ``benchmarks/results/optimize_suite.json``),
and says per kernel: which candidates were added, removed or changed, which no longer compile,
and whether the candidate that won on the GPU is still listed, byte for byte or as the same
rewrite under another name (an equivalent one must compile), and still reached: the recorded
verdicts replayed over the new list (:func:`replay`) must try it within the runs' 8 candidates.
It prints a table and writes JSON.

    PYTHONPATH=. python3 benchmarks/candidate_diff.py record --out /tmp/before.json [--only A,B] [--no-compile] [--heldout] [--outside]
    PYTHONPATH=. python3 benchmarks/candidate_diff.py compare /tmp/before.json /tmp/after.json \\
        --out benchmarks/results/candidate_diff.json

``--sources DIR`` (record) also writes every candidate's source under ``DIR/<kernel>/<sha>.cu``, for
reading a changed candidate beside its predecessor.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import platform
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernel_lsp.config import Settings  # noqa: E402
from kernel_lsp.core.candidates import OptimizeRequest  # noqa: E402
from kernel_lsp.core.rules import RuleGenerator  # noqa: E402
from kernel_lsp.core.spec import parse_spec  # noqa: E402
from kernel_lsp.services.session import Session  # noqa: E402

CORPUS = ROOT / "benchmarks" / "corpus"
OUTSIDE = ROOT / "benchmarks" / "outside"
EXAMPLES = ROOT / "examples"
RESULTS = ROOT / "benchmarks" / "results"
#: Candidates verified per kernel in the recorded runs (``corpus_suite.py --budget 8``).
REPLAY_BUDGET = 8
EXAMPLE_NAMES = ("transpose", "streaming", "reduction", "matmul", "histogram", "softmax", "spmv")


def targets(only: set[str] | None, heldout: bool = False, outside: bool = False) -> Iterator[tuple[str, Path, Path]]:
    """(name, kernel file, spec file) of every non-held-out corpus kernel (with ``heldout``, the held-out
    ones too: whether their candidates compile says nothing of their speed), then with ``outside`` every
    kernel of ``benchmarks/outside`` (named ``outside:NAME``), then every example."""
    for entry in sorted(CORPUS.iterdir()):
        spec = entry / "spec.json"
        if entry.name.startswith("_") or not spec.is_file():
            continue
        if not heldout and (json.loads(spec.read_text()).get("notes") or {}).get("heldout"):
            continue
        if only is None or entry.name in only:
            yield entry.name, entry / "kernel.cu", spec
    for entry in sorted(OUTSIDE.iterdir()) if outside else ():
        spec = entry / "spec.json"
        if spec.is_file() and (only is None or f"outside:{entry.name}" in only):
            yield f"outside:{entry.name}", entry / "kernel.cu", spec
    for name in EXAMPLE_NAMES:
        if only is None or f"example:{name}" in only:
            yield f"example:{name}", EXAMPLES / name / "original.cu", EXAMPLES / name / "spec.json"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def first_error(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if "error" in line]
    return (lines[0] if lines else log.strip().splitlines()[-1] if log.strip() else "failed")[:240]


def record_one(session: Session, name: str, path: Path, spec_path: Path, compile_: bool,
               compiled: dict[str, Any], sources: Path | None) -> dict[str, Any]:
    source = path.read_text(encoding="utf-8")
    spec = parse_spec(json.loads(spec_path.read_text()), str(spec_path.parent))
    pre = session.preprocessed(str(path), source)
    generator = RuleGenerator(preprocessed=pre, reprocess=lambda text: session.preprocessed(str(path), text))
    request = OptimizeRequest(source=source, path=str(path), kernel=spec.kernel, spec=spec.to_json())
    start = time.monotonic()
    listed = list(generator.generate(request))
    generate_s = time.monotonic() - start
    candidates = []
    for c in listed:
        digest = sha(c.source)
        entry: dict[str, Any] = {
            "generator": c.generator, "technique": c.technique, "sha": digest, "after": c.after,
            "after_correct": c.after_correct,
            "launch": dict(c.launch_override) if c.launch_override else None,
            "grid_scale": list(c.grid_scale) if c.grid_scale else None, "block": list(c.block) if c.block else None,
            "grid_divide": list(c.grid_divide) if c.grid_divide else None, "description": c.description,
        }
        if sources is not None:
            folder = sources / name.replace(":", "_")
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{digest}.cu").write_text(c.source, encoding="utf-8")
        if compile_:
            if digest not in compiled:
                result = session.compile(c.source, str(path))
                compiled[digest] = {"ok": result.ok, "error": None if result.ok else first_error(result.log)}
            entry["compiles"] = compiled[digest]["ok"]
            entry["compile_error"] = compiled[digest]["error"]
        candidates.append(entry)
    # What each rule proved where it applies; a refusal's reason is what ``optimize --explain`` prints.
    rules = [{"rule": o.rule, "applicable": o.applicable, "rewrites": len(o.rewrites)} | ({"why": o.why} if o.applicable else {})
             for o in generator.outcomes]
    return {"name": name, "kernel": spec.kernel, "generate_s": round(generate_s, 3), "candidates": candidates,
            "rules": rules}


def _git_head() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                              timeout=30).stdout.strip() or None
    except OSError:
        return None


def record(args: argparse.Namespace) -> int:
    only = set(args.only.split(",")) if args.only else None
    session = Session(Settings(), workspace_root=str(ROOT), use_kb=False)
    compiled: dict[str, Any] = {}
    kernels = []
    start = time.monotonic()
    sources = Path(args.sources) if args.sources else None
    for name, path, spec in targets(only, args.heldout, args.outside):
        row = record_one(session, name, path, spec, not args.no_compile, compiled, sources)
        bad = sum(1 for c in row["candidates"] if c.get("compiles") is False)
        print(f"{name:42s} {len(row['candidates']):3d} candidates  {bad} do not compile  {row['generate_s']:.1f} s",
              flush=True)
        kernels.append(row)
    out = {"benchmark": "candidate_diff record", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join(sys.argv), "commit": _git_head(),
           "machine": {"host": platform.node(), "python": platform.python_version()},
           "compiled": not args.no_compile, "wall_s": round(time.monotonic() - start, 1), "kernels": kernels}
    write_json(Path(args.out), out)
    return 0


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` as JSON with one line per kernel (the records are read by programs, diffed by people)."""
    head = json.dumps({k: v for k, v in data.items() if k != "kernels"}, indent=1)
    rows = ",\n".join(json.dumps(k, separators=(",", ":")) for k in data["kernels"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head[:-2] + ',\n "kernels": [\n' + rows + "\n ]\n}\n", encoding="utf-8")


# --------------------------------------------------------------------------------------------- compare


def _recorded() -> tuple[dict[str, dict[str, float]], dict[str, dict[str, str]]]:
    """Per kernel, by generator: the speedup of every candidate the recorded GPU runs accepted, and what they
    said of every candidate they tried (``accepted``, ``slower`` for correct and not faster, anything else for
    wrong)."""
    speeds: dict[str, dict[str, float]] = {}
    statuses: dict[str, dict[str, str]] = {}
    for row in json.loads((RESULTS / "corpus_suite.json").read_text())["kernels"]:
        for t in row.get("tried", []):
            statuses.setdefault(row["name"], {})[t["generator"]] = t.get("status") or "unknown"
            if t.get("status") == "accepted" and t.get("speedup"):
                speeds.setdefault(row["name"], {})[t["generator"]] = t["speedup"]
    for name, data in json.loads((RESULTS / "optimize_suite.json").read_text())["raw"].items():
        for c in data["candidates"]:
            verdict = c.get("verdict") or {}
            accepted = verdict.get("accepted")
            statuses.setdefault(f"example:{name}", {})[c["generator"]] = (
                "accepted" if accepted else "slower" if verdict.get("reason") == "not_faster" else "wrong")
            if accepted and verdict.get("speedup"):
                speeds.setdefault(f"example:{name}", {})[c["generator"]] = verdict["speedup"]
    return speeds, statuses


def replay(candidates: list[dict[str, Any]], statuses: dict[str, str], budget: int = REPLAY_BUDGET) -> list[str]:
    """The generators the search would verify, in order, within ``budget`` candidates, were each verdict what
    the recorded runs said (one they did not try counts as wrong): a sequence's step only once the step
    before it was accepted, or verified correct where it only makes the step possible (``after_correct``)."""
    accepted: set[str] = set()
    correct: set[str] = set()
    tried: list[str] = []
    for c in candidates:
        if len(tried) >= budget:
            break
        after = c.get("after")
        if after is not None and after not in (accepted | correct if c.get("after_correct") else accepted):
            continue
        tried.append(c["generator"])
        status = statuses.get(c["generator"])
        if status == "accepted":
            accepted.add(c["generator"])
        elif status == "slower":
            correct.add(c["generator"])
    return tried


def _key(c: dict[str, Any]) -> tuple[str, str]:
    """What a candidate is, whatever its name: its source and its launch change."""
    launch = json.dumps([c.get("launch"), c.get("grid_scale"), c.get("block"), c.get("grid_divide")], sort_keys=True)
    return c["sha"], launch


def _rule_of(generator: str) -> str:
    """``rule:a[v]+b`` -> ``b``: the rule of a candidate's last step."""
    return re.sub(r"\[[^\]]*\]", "", generator.split(":", 1)[-1]).split("+")[-1]


def compare(args: argparse.Namespace) -> int:
    before = {k["name"]: k for k in json.loads(Path(args.before).read_text())["kernels"]}
    after_data = json.loads(Path(args.after).read_text())
    after = {k["name"]: k for k in after_data["kernels"]}
    measured, statuses = _recorded()
    rows = []
    for name in sorted(set(before) | set(after)):
        b = {c["generator"]: c for c in before.get(name, {}).get("candidates", [])}
        a = {c["generator"]: c for c in after.get(name, {}).get("candidates", [])}
        by_key_after = {_key(c): c for c in a.values()}
        by_key_before = {_key(c): c for c in b.values()}
        added = sorted(g for g, c in a.items() if _key(c) not in by_key_before)
        removed = sorted(g for g, c in b.items() if _key(c) not in by_key_after)
        renamed = sorted(f"{g} -> {by_key_after[_key(c)]['generator']}" for g, c in b.items()
                         if _key(c) in by_key_after and by_key_after[_key(c)]["generator"] != g)
        broken = sorted(g for g, c in a.items() if c.get("compiles") is False)
        broken_before = sorted(g for g, c in b.items() if c.get("compiles") is False)
        speeds = measured.get(name, {})
        win = ({"generator": max(speeds, key=speeds.get), "speedup": speeds[max(speeds, key=speeds.get)]}
               if speeds else None)
        verdict = None
        if win is not None:
            g = win["generator"]
            old = b.get(g)
            if old is None:
                verdict = "winner not listed before (the recorded run used other code)"
            elif _key(old) in by_key_after:
                now = by_key_after[_key(old)]
                # Listed is not enough: the search must still reach it within its budget.
                old_name = {c["generator"]: by_key_before[_key(c)]["generator"] for c in after.get(name, {}).get(
                    "candidates", []) if _key(c) in by_key_before}
                known = {n: statuses.get(name, {}).get(old_name.get(n, n)) for n in a}
                reached = now["generator"] in replay(after[name]["candidates"], {n: v for n, v in known.items() if v})
                verdict = ("identical" + (f" (now {now['generator']})" if now["generator"] != g else "")
                           if reached else f"identical, but not within the first {REPLAY_BUDGET} tries any more")
            elif g in a and a[g].get("compiles", True):
                verdict = "changed, compiles (same generator)"
            else:
                same_rule = [c for c in a.values() if c["technique"] == old["technique"] and c.get("compiles", True)
                             and _key(c) not in by_key_before]
                kept = {g2: v for g2, v in speeds.items() if g2 in b and _key(b[g2]) in by_key_after}
                best_kept = max(kept, key=kept.get) if kept else None
                if same_rule:
                    verdict = "replaced: " + ", ".join(c["generator"] for c in same_rule) + " (same technique, compiles)"
                elif best_kept is not None and kept[best_kept] >= 0.98 * win["speedup"]:
                    verdict = (f"dropped; {best_kept} (still listed, identical) measured {kept[best_kept]:.3f}x against "
                               f"{win['speedup']:.3f}x")
                else:
                    verdict = "LOST"
        rows.append({"name": name, "before": len(b), "after": len(a), "added": added, "removed": removed,
                     "renamed": renamed, "not_compiling": broken, "not_compiling_before": broken_before,
                     "winner": win, "winner_now": verdict})
    lost = [r["name"] for r in rows if r["winner_now"] == "LOST" or (r["winner_now"] or "").startswith("changed")
            or (r["winner_now"] or "").startswith("replaced") or "not within" in (r["winner_now"] or "")]
    lost_outright = [r["name"] for r in rows if r["winner_now"] == "LOST"]
    summary = {
        "kernels": len(rows),
        "candidates_before": sum(r["before"] for r in rows), "candidates_after": sum(r["after"] for r in rows),
        "not_compiling_before": sum(len(r["not_compiling_before"]) for r in rows),
        "not_compiling_after": sum(len(r["not_compiling"]) for r in rows),
        "winners": sum(1 for r in rows if r["winner"]),
        "winners_identical": sum(1 for r in rows if (r["winner_now"] or "").startswith("identical")
                                 and "not within" not in r["winner_now"]),
        "winners_needing_gpu_check": lost,
        "winners_lost": lost_outright,
    }
    print(f"{'kernel':42s} {'before':>6s} {'after':>6s} {'+':>3s} {'-':>3s} {'bad':>3s}  winner")
    for r in rows:
        win = f"{r['winner']['generator']}: {r['winner_now']}" if r["winner"] else ""
        print(f"{r['name']:42s} {r['before']:6d} {r['after']:6d} {len(r['added']):3d} {len(r['removed']):3d} "
              f"{len(r['not_compiling']):3d}  {win}")
    print(json.dumps(summary, indent=1))
    out = {"benchmark": "candidate_diff compare", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join(sys.argv), "before": {"file": args.before, "commit": json.loads(Path(args.before).read_text()).get("commit")},
           "after": {"file": args.after, "commit": after_data.get("commit")}, "summary": summary, "kernels": rows}
    write_json(Path(args.out), out)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="list and compile every candidate of the corpus and the examples")
    rec.add_argument("--out", required=True)
    rec.add_argument("--only", help="comma-separated names (corpus folders, example:NAME)")
    rec.add_argument("--no-compile", action="store_true", help="list only (no nvcc)")
    rec.add_argument("--sources", help="also write every candidate's source under this folder")
    rec.add_argument("--heldout", action="store_true", help="the held-out corpus kernels too (do their candidates compile)")
    rec.add_argument("--outside", action="store_true", help="the kernels of benchmarks/outside too (outside:NAME)")
    rec.set_defaults(func=record)
    cmp = sub.add_parser("compare", help="what changed between two records, against the recorded GPU winners")
    cmp.add_argument("before")
    cmp.add_argument("after")
    cmp.add_argument("--out", required=True)
    cmp.set_defaults(func=compare)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

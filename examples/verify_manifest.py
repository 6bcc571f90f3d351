"""Run every examples/manifest.json entry through `kernel-lsp verify` and compare with its expectation.

GPU machine only. Usage (from the repository root):

    python examples/verify_manifest.py [--only EXAMPLE] [--out results.json] [-- extra verify args]

Each entry runs `kernel-lsp verify ORIGINAL CANDIDATE --spec SPEC --json`, plus
`--candidate-launch JSON` when the entry has one and `--sanitize` when it needs it. Prints
one row per entry (expected reasons, verdict, speedup with its interval, how many sizes the
spec does not name were tried, wall seconds) and
writes every verdict in full to --out. Exit status 0 when every verdict is one its entry
allows, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from kernel_lsp.services import proc

EXAMPLES = Path(__file__).resolve().parent


def verify_argv(entry: dict, kernel_lsp: str | list[str], extra: list[str]) -> list[str]:
    """``kernel_lsp``: the executable, or the argv that runs it (``[python, "-m", "kernel_lsp"]``)."""
    prefix = [kernel_lsp] if isinstance(kernel_lsp, str) else list(kernel_lsp)
    argv = [*prefix, "verify", str(EXAMPLES / entry["original"]), str(EXAMPLES / entry["candidate"]),
            "--spec", str(EXAMPLES / entry["spec"]), "--json"]
    if entry["candidate_launch"] is not None:
        argv += ["--candidate-launch", json.dumps(entry["candidate_launch"])]
    if entry["needs_sanitize"]:
        argv.append("--sanitize")
    return argv + extra


def run_entry(entry: dict, kernel_lsp: str | list[str], extra: list[str], timeout_s: float) -> dict:
    res = proc.run(verify_argv(entry, kernel_lsp, extra), timeout_s=timeout_s)
    try:
        verdict = json.loads(res.stdout)
    except json.JSONDecodeError:
        verdict = {"accepted": None, "reason": f"no verdict (exit {res.returncode})", "errors": [res.stderr[-2000:]]}
    expect = entry["expect"]
    agrees = verdict.get("accepted") == expect["accepted"] and verdict.get("reason") in expect["reason"]
    return {"entry": entry, "verdict": verdict, "agrees": agrees, "wall_s": res.wall_s}


def _speedup(v: dict) -> str:
    if v.get("speedup") is None:
        return "-"
    return f"{v['speedup']:.2f}x [{v.get('speedup_ci_low') or 0:.2f}, {v.get('speedup_ci_high') or 0:.2f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run only this example's entries")
    parser.add_argument("--out", default="examples_verdicts.json", help="where to write every verdict (JSON)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per verification")
    parser.add_argument("extra", nargs="*", help="extra arguments for kernel-lsp verify (after --)")
    args = parser.parse_args(argv)
    # The installed entry point, else this Python running the package (a checkout on PYTHONPATH).
    installed = shutil.which("kernel-lsp") or str(Path(sys.executable).with_name("kernel-lsp"))
    kernel_lsp = installed if Path(installed).exists() else [sys.executable, "-m", "kernel_lsp"]
    entries = [e for e in json.loads((EXAMPLES / "manifest.json").read_text()) if args.only in (None, e["example"])]
    results = []
    started = time.time()
    print(f"{'example':10s} {'candidate':28s} {'expected':40s} {'verdict':18s} {'speedup [CI]':22s} sizes wall")
    for entry in entries:
        r = run_entry(entry, kernel_lsp, args.extra, args.timeout)
        results.append(r)
        v = r["verdict"]
        expected = ("accept" if entry["expect"]["accepted"] else "reject ") + "/".join(entry["expect"]["reason"])
        mark = "" if r["agrees"] else "  <-- UNEXPECTED"
        print(f"{entry['example']:10s} {Path(entry['candidate']).name:28s} {expected[:40]:40s} "
              f"{str(v.get('reason'))[:18]:18s} {_speedup(v):22s} {len(v.get('sizes_tried') or ()):5d} {r['wall_s']:.1f}s{mark}", flush=True)
        # Written after every entry: a run stopped by a time limit still leaves what it measured.
        Path(args.out).write_text(json.dumps({"started": started, "results": results}, indent=2))
    Path(args.out).write_text(json.dumps({"started": started, "results": results}, indent=2))
    bad = [r for r in results if not r["agrees"]]
    print(f"{len(results) - len(bad)}/{len(results)} verdicts as expected; details in {args.out}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())

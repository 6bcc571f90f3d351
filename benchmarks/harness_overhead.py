"""Wall time of one verification per manifest entry at default settings (GPU).

    python benchmarks/harness_overhead.py [--out benchmarks/results/harness_overhead.json] [--repeat 1]

Target: <= 10 s per candidate. Entries marked ``needs_sanitize`` run with
``--sanitize`` (their cheat is only visible to compute-sanitizer); the table
says which. Prints a table (entry, verdict, expected?, wall seconds, speedup)
and writes JSON with the machine, the date, the command and every raw sample
(the full verdict of each run, whose ``wall_s`` is the sample). Exits 1 when a
verdict differs from the manifest's expectation, so the table doubles as the
end-to-end check where pytest is not installed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from kernel_lsp.core.spec import with_candidate_launch  # noqa: E402
from kernel_lsp.services.harness import VerifyOptions, load_spec_file, verify  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")
TARGET_S = 10.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(HERE, "results", "harness_overhead.json"))
    parser.add_argument("--repeat", type=int, default=1, help="verifications per entry")
    args = parser.parse_args()
    with open(os.path.join(EXAMPLES, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    rows, samples = [], []
    for entry in manifest:
        spec = load_spec_file(os.path.join(EXAMPLES, entry["spec"]))
        if entry.get("candidate_launch"):
            spec = with_candidate_launch(spec, entry["candidate_launch"])
        with open(os.path.join(EXAMPLES, entry["original"]), encoding="utf-8") as f:
            original = f.read()
        with open(os.path.join(EXAMPLES, entry["candidate"]), encoding="utf-8") as f:
            candidate = f.read()
        walls = []
        sanitize = bool(entry.get("needs_sanitize"))
        for _ in range(args.repeat):
            verdict = verify(original, candidate, spec, VerifyOptions(sanitize=sanitize))
            walls.append(verdict.wall_s)
            samples.append({"entry": f"{entry['candidate']} [{entry['spec']}]", "sanitize": sanitize, "verdict": verdict.to_json()})
        expected = verdict.reason.value in entry["expect"]["reason"] and verdict.accepted == entry["expect"]["accepted"]
        name = f"{entry['candidate']} [{os.path.basename(entry['spec'])}]" + (" +sanitize" if sanitize else "")
        rows.append((name, verdict.reason.value, expected, statistics.median(walls), verdict.speedup, verdict.errors[0] if verdict.errors else ""))
    gpu = next((s["verdict"]["gpu"] for s in samples if s["verdict"].get("gpu")), None)
    print(f"{'entry':62s} {'verdict':17s} {'expected':8s} {'wall s':>7s} {'speedup':>8s}  first error")
    for name, reason, expected, wall, speedup, error in rows:
        shown = "" if speedup is None else f"{speedup:8.2f}"
        print(f"{name:62s} {reason:17s} {'yes' if expected else 'NO':8s} {wall:7.2f} {shown:>8s}  {error.splitlines()[0][:100] if error else ''}")
    walls = [r[3] for r in rows]
    unexpected = sum(not r[2] for r in rows)
    print(f"median {statistics.median(walls):.2f} s, max {max(walls):.2f} s, over {TARGET_S:.0f} s: {sum(w > TARGET_S for w in walls)} of {len(walls)}; unexpected verdicts: {unexpected}")
    result = {
        "benchmark": "harness_overhead",
        "machine": {"host": platform.node(), "python": platform.python_version(), "gpu": gpu},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "command": " ".join([sys.executable, *sys.argv]),
        "target_s": TARGET_S,
        "summary": [{"entry": n, "reason": r, "as_expected": e, "wall_s_median": w, "speedup": s} for n, r, e, w, s, _ in rows],
        "samples": samples,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())

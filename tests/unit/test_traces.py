"""The trace store and ``kernel-lsp traces export``."""

from __future__ import annotations

import argparse
import json
import threading
from dataclasses import dataclass
from pathlib import Path

from kernel_lsp.commands import traces as traces_command
from kernel_lsp.services.traces import AttemptRecord, TraceStore


def record(attempt_id: str, created: float, outcome: str = "candidate") -> AttemptRecord:
    return AttemptRecord(
        attempt_id=attempt_id,
        created_unix_s=created,
        generator="model:scripted",
        kernel="scale",
        path="scale.cu",
        technique="grid_stride_loop",
        sample=0,
        temperature=0.2,
        seed=7,
        prompt=({"role": "system", "content": "sys"}, {"role": "user", "content": "optimize"}),
        steps=({"kind": "model", "text": '{"tool": "profile", "args": {}}'}, {"kind": "tool", "tool": "profile", "result": "p"}),
        outcome=outcome,
        reason=None if outcome == "candidate" else "does not compile",
        candidate_source="__global__ void scale() {}" if outcome == "candidate" else None,
        prompt_tokens=120,
        completion_tokens=40,
        wall_s=1.5,
    )


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    speedup: float
    max_rel_err: float


def test_attempts_and_verdicts_round_trip(tmp_path: Path):
    store = TraceStore(tmp_path / "t.sqlite3")
    store.record_attempt(record("b", 2.0, "rejected"))
    store.record_attempt(record("a", 1.0))
    assert store.record_verdict("a", Verdict(True, 1.8, 3e-7))
    assert not store.record_verdict("missing", {"accepted": False})
    rows = list(store.attempts())
    assert [r["attempt_id"] for r in rows] == ["a", "b"]  # oldest first
    assert rows[0]["verdict"] == {"accepted": True, "speedup": 1.8, "max_rel_err": 3e-7}
    assert rows[1]["verdict"] is None and rows[1]["reason"] == "does not compile"
    assert rows[0]["steps"][1] == {"kind": "tool", "tool": "profile", "result": "p"}
    store.close()
    # Data survives a new connection (another process, the CLI).
    again = TraceStore(tmp_path / "t.sqlite3")
    assert len(list(again.attempts())) == 2
    again.close()


def test_concurrent_writers(tmp_path: Path):
    store = TraceStore(tmp_path / "t.sqlite3")
    threads = [
        threading.Thread(target=lambda i=i: [store.record_attempt(record(f"{i}-{j}", i + j / 100)) for j in range(20)])
        for i in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(list(store.attempts())) == 80
    store.close()


def test_cli_export_writes_one_json_line_per_attempt(tmp_path: Path, capsys):
    db = tmp_path / "t.sqlite3"
    store = TraceStore(db)
    store.record_attempt(record("a", 1.0))
    store.record_verdict("a", {"accepted": False, "why": "wrong results on seed 2"})
    store.record_attempt(record("b", 2.0, "rejected"))
    store.close()
    parser = argparse.ArgumentParser()
    traces_command.add_parser(parser.add_subparsers())
    out = tmp_path / "out.jsonl"
    args = parser.parse_args(["traces", "export", str(out), "--db", str(db)])
    assert args.func(args) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["attempt_id"] for line in lines] == ["a", "b"]
    assert lines[0]["prompt"][1]["content"] == "optimize"
    assert lines[0]["verdict"]["why"] == "wrong results on seed 2"
    assert lines[0]["candidate_source"] == "__global__ void scale() {}"
    assert "2 attempt(s) written" in capsys.readouterr().out


def test_cli_export_to_an_unwritable_place_fails_cleanly(tmp_path: Path):
    parser = argparse.ArgumentParser()
    traces_command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["traces", "export", str(tmp_path / "no" / "such" / "dir.jsonl"), "--db", str(tmp_path / "t.db")])
    assert args.func(args) == 1

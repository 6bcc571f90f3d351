"""``kernel-lsp kb ...`` subcommands, driven through their own argparse wiring."""

from __future__ import annotations

import argparse
import io
import json

import pytest

from kernel_lsp.commands import kb as kb_command
from kernel_lsp.core.kb_logic import Attempt
from kernel_lsp.services.kb import KnowledgeBase


def run_cli(argv: list[str]) -> int:
    # Only this command's parser: other commands' modules are not needed to test it.
    parser = argparse.ArgumentParser(prog="kernel-lsp")
    kb_command.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def seed_attempt(db) -> None:
    with KnowledgeBase.open(db) as kb:
        kb.record_attempt(Attempt(
            kernel_hash="k", file="a.cu", kernel="scale", state="latency-bound", technique="grid-stride-loop",
            candidate_hash="c", verdict="accepted", accepted=True, speedup=1.25, created_at="2026-01-01T00:00:00+00:00",
            original_source="__global__ void scale() {}", candidate_source="__global__ void scale() { }",
        ))


def test_show_lists_states_and_one_state(tmp_path, capsys):
    db = tmp_path / "kb.db"
    assert run_cli(["kb", "show", "--db", str(db), "--create"]) == 0
    out = capsys.readouterr().out
    assert "memory-bandwidth-saturated" in out and "kernel-fusion" in out
    assert run_cli(["kb", "show", "--db", str(db), "--state", "shared-bank-conflicts"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("shared-bank-conflicts") and "bank-conflict-padding" in out
    assert "shared_bank_conflicts_per_request >= 4" in out and "memory-bandwidth-saturated" not in out
    assert run_cli(["kb", "show", "--db", str(db), "--state", "nope"]) == 2


def test_stats(tmp_path, capsys):
    db = tmp_path / "kb.db"
    seed_attempt(db)
    assert run_cli(["kb", "stats", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "attempts        1 (1 accepted, 1 worked examples)" in out
    assert "grid-stride-loop" in out and "1.25x" in out


def test_env_var_selects_database(tmp_path, monkeypatch, capsys):
    db = tmp_path / "env.db"
    monkeypatch.setenv("KERNEL_LSP_KB", str(db))
    assert run_cli(["kb", "stats"]) == 0
    assert str(db) in capsys.readouterr().out and db.exists()


def test_export_import(tmp_path, capsys):
    a, b, out = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "x.jsonl"
    seed_attempt(a)
    assert run_cli(["kb", "export", "--db", str(a), str(out)]) == 0
    assert json.loads(out.read_text().splitlines()[0])["format"] == "kernel-lsp-kb"
    assert run_cli(["kb", "import", "--db", str(b), str(out)]) == 1  # b does not exist yet: not made unasked
    assert "pass --create" in capsys.readouterr().err and not b.exists()
    assert run_cli(["kb", "import", "--db", str(b), "--create", str(out)]) == 0
    assert "imported 1 attempts (0 already known)" in capsys.readouterr().out
    assert run_cli(["kb", "import", "--db", str(b), str(out)]) == 0
    assert "imported 0 attempts (1 already known)" in capsys.readouterr().out
    (tmp_path / "junk.jsonl").write_text("nonsense\n")
    assert run_cli(["kb", "import", "--db", str(b), str(tmp_path / "junk.jsonl")]) == 1
    assert "not a kernel-lsp knowledge-base export" in capsys.readouterr().err


def test_reset_refuses_without_tty_and_yes(tmp_path, monkeypatch, capsys):
    db = tmp_path / "kb.db"
    seed_attempt(db)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert run_cli(["kb", "reset", "--db", str(db)]) == 2
    assert "--yes" in capsys.readouterr().err
    with KnowledgeBase.open(db) as kb:
        assert kb.stats().attempts == 1
    assert run_cli(["kb", "reset", "--db", str(db), "--yes"]) == 0
    with KnowledgeBase.open(db) as kb:
        assert kb.stats().attempts == 0


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("answer", "attempts_left"), [("n\n", 1), ("y\n", 0)])
def test_reset_asks_on_a_terminal(tmp_path, monkeypatch, answer, attempts_left):
    db = tmp_path / "kb.db"
    seed_attempt(db)
    monkeypatch.setattr("sys.stdin", FakeTty(answer))
    assert run_cli(["kb", "reset", "--db", str(db)]) == 0
    with KnowledgeBase.open(db) as kb:
        assert kb.stats().attempts == attempts_left


def test_corrupt_database_message_reaches_the_user(tmp_path, capsys):
    db = tmp_path / "kb.db"
    db.write_bytes(b"SQLite format 3\x00" + b"this is not a database page" * 100)
    assert run_cli(["kb", "stats", "--db", str(db)]) == 0
    assert "moved to" in capsys.readouterr().err


def test_foreign_file_is_refused_and_left_alone(tmp_path, capsys):
    db = tmp_path / ".bashrc"
    db.write_bytes(b"this is not sqlite" * 100)
    assert run_cli(["kb", "stats", "--db", str(db)]) == 1
    assert "not a SQLite database" in capsys.readouterr().err
    assert db.read_bytes() == b"this is not sqlite" * 100
    assert sorted(p.name for p in tmp_path.iterdir()) == [".bashrc"]


def test_kb_without_action_is_usage_error(capsys):
    assert run_cli(["kb"]) == 2


def test_export_from_sqlite_import_into_postgres(tmp_path, pg_url, capsys):
    mine, out = tmp_path / "mine.db", tmp_path / "x.jsonl"
    seed_attempt(mine)
    assert run_cli(["kb", "export", "--db", str(mine), str(out)]) == 0
    assert run_cli(["kb", "import", "--db", pg_url, str(out)]) == 0
    assert "imported 1 attempts (0 already known)" in capsys.readouterr().out
    assert run_cli(["kb", "stats", "--db", pg_url]) == 0
    stats = capsys.readouterr().out
    assert pg_url in stats and "attempts        1 (1 accepted, 1 worked examples)" in stats
    assert run_cli(["kb", "restore", "--db", pg_url]) == 1
    assert "no rolling backup" in capsys.readouterr().err

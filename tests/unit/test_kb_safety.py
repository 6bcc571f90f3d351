"""The knowledge base on hostile or damaged files: foreign files, empty files, backups (SQLite's), and malformed
imports (on both backends: a SQLite file and a database on a real PostgreSQL server)."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest

from kernel_lsp.core import kb_logic
from kernel_lsp.core.kb_logic import Attempt
from kernel_lsp.services import kb as kb_service
from kernel_lsp.services.kb import KbError, KnowledgeBase
from tests.unit.test_kb_cli import run_cli


def attempt(n: int) -> Attempt:
    return Attempt(
        kernel_hash=f"k{n}", file="/src/a.cu", kernel="scale", state="latency-bound", technique="grid-stride-loop",
        candidate_hash=f"c{n}", verdict="accepted", accepted=True, speedup=1.2,
        created_at=f"2026-01-01T00:00:00.{n:06d}+00:00",
    )


@pytest.fixture
def db(tmp_path):
    return tmp_path / "kb.sqlite3"


def filled(db, count: int) -> None:
    with KnowledgeBase.open(db) as kb:
        for n in range(count):
            kb.record_attempt(attempt(n))


def age_backup(db) -> None:
    """Make the rolling backup old enough to be refreshed at the next open."""
    backup = db.with_name(db.name + kb_service.BACKUP_SUFFIX)
    old = backup.stat().st_mtime - 2 * kb_service.BACKUP_INTERVAL_S
    os.utime(backup, (old, old))


# ---------------------------------------------------------------- foreign and empty files


def test_foreign_file_is_refused_and_never_moved(tmp_path):
    bashrc = tmp_path / ".bashrc"
    bashrc.write_text("export PATH=$HOME/bin:$PATH\n")
    with pytest.raises(KbError, match="not a SQLite database"):
        KnowledgeBase.open(bashrc)
    assert bashrc.read_text() == "export PATH=$HOME/bin:$PATH\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".bashrc"]


def test_folder_as_kb_path_is_refused(tmp_path):
    with pytest.raises(KbError, match="folder"):
        KnowledgeBase.open(tmp_path)


def test_rolling_backup_is_a_readable_copy(db):
    filled(db, 3)
    backup = db.with_name(db.name + ".backup")
    assert kb_service._backup_attempts(backup) == 3


def test_empty_file_where_data_was_is_reported_and_restored(db):
    filled(db, 5)
    for side in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        if side.exists():
            side.unlink()
    db.write_bytes(b"")  # the file emptied by an accident
    with KnowledgeBase.open(db) as kb:
        assert len(kb.messages) == 1
        assert "is empty" in kb.messages[0] and "5 attempts" in kb.messages[0] and "kb restore" in kb.messages[0]
        assert kb.restore_backup() == 5
        assert len(kb.attempts()) == 5
    with KnowledgeBase.open(db) as kb:
        assert kb.messages == ()
        assert len(kb.attempts()) == 5


def test_empty_file_without_backup_is_still_said(db):
    db.write_bytes(b"")
    with KnowledgeBase.open(db) as kb:
        assert kb.messages == (f"The knowledge base {db} was an empty file; it was made a fresh one.",)


def test_corrupt_file_replaced_mentions_the_backup(db):
    filled(db, 4)
    with KnowledgeBase.open(db) as kb:
        kb._read("PRAGMA wal_checkpoint(TRUNCATE)")
    data = db.read_bytes()
    db.write_bytes(data[:100] + os.urandom(len(data) - 100))
    with KnowledgeBase.open(db) as kb:
        assert "moved to" in kb.messages[0]
        assert any("4 attempts" in m for m in kb.messages[1:])


def test_backup_with_more_attempts_is_not_replaced_by_a_smaller_database(db):
    filled(db, 6)
    backup = db.with_name(db.name + ".backup")
    with KnowledgeBase.open(db) as kb:
        kb._write(lambda conn: conn.execute("DELETE FROM attempts WHERE kernel_hash != 'k0'"))
    age_backup(db)
    with KnowledgeBase.open(db):
        pass
    assert kb_service._backup_attempts(backup) == 6


def test_reset_is_not_reported_as_loss_and_can_be_undone(db):
    filled(db, 3)
    with KnowledgeBase.open(db) as kb:
        kb.reset()
    with KnowledgeBase.open(db) as kb:
        assert kb.messages == ()
        with pytest.raises(KbError, match="not empty|no usable"):
            kb.record_attempt(attempt(99))
            kb.restore_backup()
        assert kb.restore_backup(force=True) == 3
        assert len(kb.attempts()) == 3


def test_restore_cli(db, capsys):
    filled(db, 2)
    assert run_cli(["kb", "restore", "--db", str(db)]) == 1  # not empty: refused without --force
    assert "not empty" in capsys.readouterr().err
    assert run_cli(["kb", "restore", "--db", str(db), "--force"]) == 0
    assert "restored 2 attempts" in capsys.readouterr().out


# ---------------------------------------------------------------- import


def export_lines(tmp_path) -> list[dict]:
    with KnowledgeBase.open(tmp_path / "src.db") as kb:
        derived = kb.match_state({"l2_hit_rate_pct": 95.0, "l1_hit_rate_pct": 90.0, "dram_throughput_pct": 5.0})
        kb.record_attempt(attempt(1))
        kb.record_attempt(replace(attempt(2), state=derived.state))
        kb.export_jsonl(tmp_path / "out.jsonl")
    return [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]


def write(tmp_path, records) -> str:
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return str(path)


def kind(records, name):
    return next(i for i, r in enumerate(records) if r["type"] == name)


@pytest.mark.parametrize("damage, expected", [
    (lambda rs: rs[kind(rs, "attempt")].update(accepted="false"), "'accepted' must be bool, got str"),
    (lambda rs: rs[kind(rs, "attempt")].update(speedup="1.5"), "'speedup' must be number or null"),
    (lambda rs: rs[kind(rs, "state")]["priors"][0].update(confidence=float("nan")), "'confidence' must be number, got nan"),
    (lambda rs: rs[kind(rs, "state")]["priors"].append(dict(rs[kind(rs, "state")]["priors"][0])), "appears twice"),
    (lambda rs: rs[0].update(format_version="one"), "'format_version' must be int"),
    (lambda rs: rs[kind(rs, "attempt")].update(state="nowhere"), "unknown state 'nowhere'"),
    (lambda rs: rs[kind(rs, "attempt")].update(extra=1), "unknown field 'extra'"),
    (lambda rs: rs[kind(rs, "attempt")].pop("created_at"), "missing field 'created_at'"),
    (lambda rs: rs[kind(rs, "state")]["priors"][0].update(successes=10**6), "successes <= attempts"),
])
def test_malformed_import_is_rejected_whole(tmp_path, kb_target, damage, expected):
    records = export_lines(tmp_path)
    damage(records)
    with KnowledgeBase.open(kb_target) as kb:
        before = (kb.states(), kb.entries(), kb.attempts())
        result = kb.import_jsonl(write(tmp_path, records))
        assert any(expected in p for p in result.problems), result.problems
        assert "nothing was imported" in result.problems[-1]
        assert (result.attempts_added, result.states_added) == (0, 0)
        assert (kb.states(), kb.entries(), kb.attempts()) == before


def test_huge_and_deep_lines_are_rejected_not_raised(tmp_path, kb_target):
    records = export_lines(tmp_path)
    lines = [json.dumps(r) for r in records] + ["9" * 5000, "[" * 100_000]
    with KnowledgeBase.open(kb_target) as kb:
        result = kb.import_jsonl(write(tmp_path, lines))
    assert any(f"line {len(records) + 1}: not usable JSON" in p for p in result.problems)
    assert any(f"line {len(records) + 2}:" in p for p in result.problems)
    assert result.attempts_added == 0


def test_valid_import_still_imports_everything(tmp_path, kb_target):
    records = export_lines(tmp_path)
    with KnowledgeBase.open(kb_target) as kb:
        result = kb.import_jsonl(write(tmp_path, records))
    assert (result.attempts_added, result.states_added, result.problems) == (2, 1, ())


def test_import_cli_lists_rejected_lines_and_fails(tmp_path, kb_target, capsys):
    records = export_lines(tmp_path)
    records[kind(records, "attempt")]["accepted"] = "false"
    assert run_cli(["kb", "import", "--db", kb_target, "--create", write(tmp_path, records)]) == 1
    err = capsys.readouterr().err
    assert "'accepted' must be bool" in err and "nothing was imported" in err and "Traceback" not in err


def test_schema_accepts_what_export_writes():
    record = {"type": "attempt", **{k: v for k, v in vars(attempt(1)).items()}, "id": "x"}
    assert kb_logic.validate_export_record(record) == []
    assert kb_logic.validate_export_record({**record, "accepted": 1}) == ["'accepted' must be bool, got int"]

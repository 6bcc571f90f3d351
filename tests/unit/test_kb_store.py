"""The knowledge base on both backends (a SQLite file, a database on a real PostgreSQL server): migrations,
recording, matching, examples, concurrency, export/import; paths, WAL, corruption and busy files are SQLite's."""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from kernel_lsp.core import kb_logic
from kernel_lsp.core.kb_logic import Attempt
from kernel_lsp.services import kb as kb_service
from kernel_lsp.services import kb_postgres
from kernel_lsp.services.kb import KbError, KnowledgeBase

ORIGINAL = """#include <cuda_runtime.h>
__global__ void scale(const float* in, float* out, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * in[i];
}
int main() { return 0; }
"""
CANDIDATE = ORIGINAL.replace("if (i < n) out[i] = a * in[i];", "for (; i < n; i += gridDim.x * blockDim.x) out[i] = a * in[i];")


#: A profile no seed state is within the threshold of (caches hit well, DRAM idle).
FAR = {"l2_hit_rate_pct": 95.0, "l1_hit_rate_pct": 90.0, "dram_throughput_pct": 5.0}


def make_attempt(n: int = 0, **changes) -> Attempt:
    base = Attempt(
        kernel_hash=f"k{n}", file="/src/scale.cu", kernel="scale", state="latency-bound",
        technique="grid-stride-loop", candidate_hash=f"c{n}", verdict="accepted", accepted=True, speedup=1.2,
        reason="faster", metrics_before={"dram_throughput_pct": 20.0}, metrics_after={"dram_throughput_pct": 30.0},
        features={"loops": 0, "uses_shared": False}, model=None, generator="rule:grid-stride",
        original_source=ORIGINAL, candidate_source=CANDIDATE, created_at=f"2026-01-01T00:00:{n % 60:02d}.{n:06d}+00:00",
    )
    return replace(base, **changes)


@pytest.fixture
def db(kb_target) -> str:
    """A new knowledge base on each backend."""
    return kb_target


@pytest.fixture
def new_target(request, tmp_path, db):
    """More new knowledge bases on the same backend as ``db``."""
    names = iter(range(1, 100))
    if kb_postgres.is_url(db):
        return request.getfixturevalue("postgres").new_database
    return lambda: str(tmp_path / f"kb{next(names)}.sqlite3")


@pytest.fixture
def db_file(tmp_path) -> Path:
    """A SQLite file (for what only a file has: its path, WAL, corruption, busy locks)."""
    return tmp_path / "kb.sqlite3"


def raw_connection(target: str):
    """A connection to the knowledge base's database without kernel-lsp's opening (migrations, seeding)."""
    if kb_postgres.is_url(target):
        return kb_postgres.connect(target)
    return sqlite3.connect(target, isolation_level=None)


def index_names(kb: KnowledgeBase) -> set[str]:
    if kb.is_postgres:
        return {r[0] for r in kb._read("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")}
    return {r[0] for r in kb._read("SELECT name FROM sqlite_master WHERE type = 'index'")}


# ---------------------------------------------------------------- paths and seeding


def test_path_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv(kb_service.ENV_VAR, raising=False)
    assert kb_service.resolve_db_path(None) == kb_service.default_db_path()
    assert kb_service.default_db_path().name == kb_service.DB_NAME
    monkeypatch.setenv(kb_service.ENV_VAR, str(tmp_path / "env.db"))
    assert kb_service.resolve_db_path(None) == tmp_path / "env.db"
    assert kb_service.resolve_db_path(tmp_path / "explicit.db") == tmp_path / "explicit.db"
    url = "postgresql://team@db.example/kb"
    assert kb_service.resolve_target(url) == url
    monkeypatch.setenv(kb_service.ENV_VAR, url)
    assert kb_service.resolve_target(None) == url
    assert kb_service.resolve_target(tmp_path / "explicit.db") == tmp_path / "explicit.db"


def test_password_never_shown():
    assert kb_postgres.redact("postgresql://team:s3cret@db.example:5433/kb") == "postgresql://team:***@db.example:5433/kb"
    assert kb_postgres.redact("postgresql:///kb?host=/run&password=s3cret") == "postgresql:///kb?host=/run&password=***"
    assert kb_postgres.redact("postgresql://team@db.example/kb") == "postgresql://team@db.example/kb"


def test_unreachable_server_is_a_kb_error(tmp_path):
    with pytest.raises(KbError, match="cannot connect") as raised:
        KnowledgeBase.open(f"postgresql://team:s3cret@/kb?host={tmp_path}")
    assert "s3cret" not in str(raised.value)


def test_fresh_database_is_seeded(db):
    with KnowledgeBase.open(db) as kb:
        stats = kb.stats()
        assert stats.schema_version == kb_service.SCHEMA_VERSION
        assert stats.techniques >= 25 and stats.states >= 10 and stats.entries > 0
        assert stats.size_bytes > 0
        assert kb.messages == ()
    # Opening again does not duplicate anything (the size changes with WAL checkpoints and server pages).
    with KnowledgeBase.open(db) as kb:
        assert replace(kb.stats(), size_bytes=0) == replace(stats, size_bytes=0)


def test_sqlite_file_is_in_wal_mode(db_file):
    with KnowledgeBase.open(db_file) as kb:
        assert kb._read("PRAGMA journal_mode")[0][0] == "wal"
        assert kb._read("PRAGMA busy_timeout")[0][0] == kb_service.BUSY_TIMEOUT_MS


def test_postgres_speedups_read_back_exactly(pg_url):
    # PostgreSQL's REAL is 4 bytes: the schema's REAL columns must be DOUBLE PRECISION there.
    with KnowledgeBase.open(pg_url) as kb:
        kb.record_attempt(make_attempt(1, speedup=1.2345678901234567))
        assert kb.attempts()[0].speedup == 1.2345678901234567
        assert kb.stats().path == pg_url


def test_creates_missing_folders(tmp_path):
    with KnowledgeBase.open(tmp_path / "a" / "b" / "kb.db") as kb:
        assert kb.path.exists()


# ---------------------------------------------------------------- recording


def test_record_attempt_updates_entry_and_keeps_code_only_for_successes(db):
    with KnowledgeBase.open(db) as kb:
        before = {e.technique: e for e in kb.entries("latency-bound")}["grid-stride-loop"]
        kb.record_attempt(make_attempt(1, speedup=1.05))
        kb.record_attempt(make_attempt(2, accepted=False, verdict="incorrect", speedup=None))
        after = {e.technique: e for e in kb.entries("latency-bound")}["grid-stride-loop"]
        expected = kb_logic.update_entry(kb_logic.update_entry(before, 1.05, True), None, False)
        assert after == expected
        log = kb.attempts("latency-bound", "grid-stride-loop")
        assert [a.accepted for a in log] == [True, False]
        assert log[0].original_source == ORIGINAL and log[0].candidate_source == CANDIDATE
        assert log[1].original_source is None and log[1].candidate_source is None
        # The same attempt twice is one attempt.
        kb.record_attempt(make_attempt(1, speedup=1.05))
        assert len(kb.attempts()) == 2


def test_record_attempt_fills_time_and_rejects_unknown_state(db):
    with KnowledgeBase.open(db) as kb:
        kb.record_attempt(make_attempt(1, created_at=None))
        assert kb.attempts()[0].created_at is not None
        with pytest.raises(KbError, match="unknown knowledge-base state"):
            kb.record_attempt(make_attempt(2, state="no-such-state"))
        assert len(kb.attempts()) == 1


def test_unknown_technique_gets_a_default_prior(db):
    with KnowledgeBase.open(db) as kb:
        kb.record_attempt(make_attempt(1, technique="brand-new-trick", speedup=1.5))
        entry = {e.technique: e for e in kb.entries("latency-bound")}["brand-new-trick"]
        assert entry == kb_logic.update_entry(kb_logic.default_entry("latency-bound", "brand-new-trick"), 1.5, True)


def test_failed_technique_loses_selection_share(db):
    with KnowledgeBase.open(db) as kb:
        def share(technique: str) -> int:
            return sum(any(c.technique == technique for c in kb.select("latency-bound", 2, rng_seed=s)) for s in range(400))

        before = share("multiple-accumulators")
        for n in range(4):
            kb.record_attempt(make_attempt(n, technique="multiple-accumulators", accepted=False, verdict="incorrect", speedup=None))
        assert share("multiple-accumulators") < before / 2


# ---------------------------------------------------------------- matching


def test_match_state_stores_derived_state_with_inherited_entries(db):
    with KnowledgeBase.open(db) as kb:
        assert kb.match_state({"dram_throughput_pct": 92, "memory_throughput_pct": 93, "sm_throughput_pct": 20}).state == "memory-bandwidth-saturated"
        far = FAR
        match = kb.match_state(far)
        assert match.is_new and match.parent
        states = {s.name: s for s in kb.states()}
        assert states[match.state].parent == match.parent
        parent_entries = {e.technique: e for e in kb.entries(match.parent)}
        child_entries = {e.technique: e for e in kb.entries(match.state)}
        assert set(child_entries) == set(parent_entries)
        for name, entry in child_entries.items():
            assert entry.confidence == pytest.approx(max(0.1, parent_entries[name].confidence * 0.8))
            assert entry.predicted_speedup == parent_entries[name].predicted_speedup
        again = kb.match_state(far)
        assert (again.state, again.is_new) == (match.state, False)
        assert kb.stats().derived_states == 1
        kb.record_attempt(make_attempt(1, state=match.state))
        assert kb.select(match.state, 3, rng_seed=1)


# ---------------------------------------------------------------- examples


def test_examples_fall_back_to_catalogue_then_prefer_closest_user_pairs(db):
    with KnowledgeBase.open(db) as kb:
        catalogue = kb.examples_for("latency-bound", "grid-stride-loop", {}, k=2)
        assert len(catalogue) == 1 and catalogue[0].origin == "catalogue"
        assert "__global__" in catalogue[0].before and "gridDim" in catalogue[0].after

        kb.record_attempt(make_attempt(1, features={"loops": 4, "uses_shared": True}, speedup=1.3))
        kb.record_attempt(make_attempt(2, features={"loops": 0, "uses_shared": False}, speedup=1.1,
                                       original_source=ORIGINAL.replace("a * in[i]", "a * in[i] + 1.0f"),
                                       candidate_source=CANDIDATE.replace("a * in[i]", "a * in[i] + 1.0f")))
        kb.record_attempt(make_attempt(3, accepted=False, verdict="slower", speedup=0.9))  # never an example
        examples = kb.examples_for("latency-bound", "grid-stride-loop", {"loops": 0, "uses_shared": False}, k=3)
        assert [e.origin for e in examples] == ["user", "user"]
        assert examples[0].distance == 0.0 and "+ 1.0f" in examples[0].before
        assert examples[1].distance > 0
        # Only the kernel, not the whole file.
        assert "int main" not in examples[0].before and examples[0].before.startswith("__global__ void scale")
        one = kb.examples_for("latency-bound", "grid-stride-loop", {"loops": 4, "uses_shared": True}, k=1, max_chars=10_000)
        assert len(one) == 1 and one[0].speedup == 1.3
        tiny = kb.examples_for("latency-bound", "grid-stride-loop", {}, k=2, max_chars=200)
        assert len(tiny) == 1 and tiny[0].truncated and tiny[0].chars <= 200


def test_hints_for_the_optimizer(db):
    with KnowledgeBase.open(db) as kb:
        hints = kb.hints("shared-bank-conflicts", 2, rng_seed=3)
        assert len(hints) == 2 and len({h.name for h in hints}) == 2
        assert all(h.example_before and h.example_after and h.description for h in hints)
        assert hints == kb.hints("shared-bank-conflicts", 2, rng_seed=3)


# ---------------------------------------------------------------- migrations


def test_migrates_v1_database_keeping_data(db):
    conn = raw_connection(db)
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    kb_service.MIGRATIONS[0](conn)  # exactly the tables a v1 kernel-lsp created
    conn.execute("INSERT INTO schema_version (version) VALUES (1)")
    conn.execute("INSERT INTO states VALUES ('latency-bound', 'old text', '{}', NULL, 'seed', '2025-01-01')")
    conn.execute(
        "INSERT INTO attempts (id, kernel_hash, file, kernel, state, technique, candidate_hash, verdict, reason, accepted,"
        " speedup, metrics_before_json, metrics_after_json, model, created_at, original_source, candidate_source)"
        " VALUES ('old1', 'kh', 'f.cu', 'scale', 'latency-bound', 'grid-stride-loop', 'ch', 'accepted', '', 1, 1.4,"
        " '{}', '{}', NULL, '2025-01-01T00:00:00+00:00', ?, ?)",
        (ORIGINAL, CANDIDATE),
    )
    conn.close()
    with KnowledgeBase.open(db) as kb:
        assert kb.stats().schema_version == kb_service.SCHEMA_VERSION
        [old] = kb.attempts()
        assert old.speedup == 1.4 and old.features == {} and old.generator == ""
        assert {"attempts_by_state_technique", "attempts_examples"} <= index_names(kb)
        # The old attempt is folded into the recomputed entry on top of the seed prior.
        seed = next(e for e in json.loads((Path(kb_service.__file__).parent.parent / "data" / "states.json").read_text())["states"]
                    if e["name"] == "latency-bound")
        prior = next(e for e in seed["entries"] if e["technique"] == "grid-stride-loop")
        entry = {e.technique: e for e in kb.entries("latency-bound")}["grid-stride-loop"]
        assert entry.attempts == prior["attempts"] + 1
        assert {s.name: s for s in kb.states()}["latency-bound"].description != "old text"  # catalogue refreshed
        assert kb.examples_for("latency-bound", "grid-stride-loop", {}, 1)[0].origin == "user"


def test_newer_schema_is_refused_and_left_alone(db):
    with KnowledgeBase.open(db):
        pass
    conn = raw_connection(db)
    conn.execute("UPDATE schema_version SET version = ?", (kb_service.SCHEMA_VERSION + 1,))
    conn.close()
    with pytest.raises(KbError, match="newer"):
        KnowledgeBase.open(db)
    if not kb_postgres.is_url(db):
        assert not list(Path(db).parent.glob("*.corrupt-*"))
    conn = raw_connection(db)
    assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == kb_service.SCHEMA_VERSION + 1
    conn.close()


# ---------------------------------------------------------------- concurrency


def _writer(path: str, worker: int, count: int, start: multiprocessing.synchronize.Event) -> None:
    kb = KnowledgeBase.open(path)
    start.wait(10)
    for n in range(count):
        kb.record_attempt(make_attempt(worker * 1000 + n, kernel_hash=f"w{worker}-{n}"))
    kb.close()


def _writers_lose_nothing(db: str, writers: int, count: int) -> None:
    with KnowledgeBase.open(db) as kb:
        prior = {e.technique: e for e in kb.entries("latency-bound")}["grid-stride-loop"]
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    workers = [ctx.Process(target=_writer, args=(str(db), w, count, start)) for w in range(1, writers + 1)]
    for p in workers:
        p.start()
    start.set()
    for p in workers:
        p.join(120)
        assert p.exitcode == 0
    with KnowledgeBase.open(db) as kb:
        log = kb.attempts()
        assert len(log) == writers * count
        assert {a.kernel_hash for a in log} == {f"w{w}-{n}" for w in range(1, writers + 1) for n in range(count)}
        entry = {e.technique: e for e in kb.entries("latency-bound")}["grid-stride-loop"]
        # Every update landed: the entry counts all attempts, and equals a replay of the log.
        assert entry.attempts == prior.attempts + writers * count
        assert entry.successes == prior.successes + writers * count
        replayed = kb_logic.replay([prior], [(a.state, a.technique, a.speedup, a.accepted) for a in log])
        assert replayed[("latency-bound", "grid-stride-loop")] == entry


def test_two_writer_processes_lose_nothing(db):
    _writers_lose_nothing(db, 2, 60)


def test_eight_writers_into_postgres_keep_every_attempt(postgres):
    # A fresh database: the eight writers' first open also races on migrating and seeding it.
    _writers_lose_nothing(postgres.new_database(), 8, 40)


# ---------------------------------------------------------------- corruption


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_file_is_moved_aside(db_file, damage):
    db = db_file
    if damage == "garbage":
        # A SQLite header over random pages: a damaged database (a file without the header is refused instead).
        db.write_bytes(b"SQLite format 3\x00" + os.urandom(8192))
    else:
        with KnowledgeBase.open(db) as kb:
            for n in range(40):
                kb.record_attempt(make_attempt(n, original_source=ORIGINAL * 20))
            kb._read("PRAGMA wal_checkpoint(TRUNCATE)")
        data = db.read_bytes()
        db.write_bytes(data[: len(data) // 2])
    damaged = db.read_bytes()
    with KnowledgeBase.open(db) as kb:
        assert "moved to" in kb.messages[0] and str(db) in kb.messages[0]
        [aside] = [p for p in db.parent.glob(db.name + ".corrupt-*") if not p.name.endswith(("-wal", "-shm"))]
        assert aside.read_bytes() == damaged  # nothing dropped: the bytes are kept
        assert aside.name in kb.messages[0]
        assert kb.stats().techniques >= 25
        kb.record_attempt(make_attempt(1))
        assert len(kb.attempts()) == 1
    with KnowledgeBase.open(db) as kb:
        assert kb.messages == ()


# ---------------------------------------------------------------- export / import


def _content(kb: KnowledgeBase):
    return kb.states(), kb.entries(), kb.attempts()


def test_export_import_round_trip_and_idempotent(tmp_path, db, new_target):
    source = KnowledgeBase.open(db)
    derived = source.match_state(FAR)
    assert derived.is_new
    for n in range(5):
        source.record_attempt(make_attempt(n, speedup=1.0 + n / 10, accepted=n % 2 == 0))
    source.record_attempt(make_attempt(9, state=derived.state, technique="kernel-fusion", speedup=None, accepted=False))
    exported = source.export_jsonl(tmp_path / "out.jsonl")
    assert (exported.states, exported.attempts) == (1, 6)

    target = KnowledgeBase.open(new_target())
    first = target.import_jsonl(tmp_path / "out.jsonl")
    assert (first.attempts_added, first.attempts_duplicate, first.states_added, first.problems) == (6, 0, 1, ())
    assert _content(target) == _content(source)
    target.export_jsonl(tmp_path / "again.jsonl")
    assert (tmp_path / "again.jsonl").read_text() == (tmp_path / "out.jsonl").read_text()

    second = target.import_jsonl(tmp_path / "out.jsonl")
    assert (second.attempts_added, second.attempts_duplicate, second.states_added) == (0, 6, 0)
    assert _content(target) == _content(source)
    source.close()
    target.close()


def test_import_merges_with_local_attempts(tmp_path, db, new_target):
    team = KnowledgeBase.open(db)
    team.record_attempt(make_attempt(1, speedup=1.4))
    team.export_jsonl(tmp_path / "team.jsonl")
    mine = KnowledgeBase.open(new_target())
    mine.record_attempt(make_attempt(2, speedup=1.1))
    with KnowledgeBase.open(new_target()) as fresh:
        prior = {e.technique: e for e in fresh.entries("latency-bound")}["grid-stride-loop"]
    assert mine.import_jsonl(tmp_path / "team.jsonl").attempts_added == 1
    entry = {e.technique: e for e in mine.entries("latency-bound")}["grid-stride-loop"]
    assert entry == kb_logic.update_entry(kb_logic.update_entry(prior, 1.1, True), 1.4, True)


def test_import_rejects_bad_lines_and_imports_nothing(tmp_path, db):
    good = json.dumps({"type": "header", "format": "kernel-lsp-kb", "format_version": 1})
    attempt = {**json.loads(json.dumps(make_attempt(1).__dict__)), "type": "attempt"}
    unknown_state = {**attempt, "state": "nowhere", "candidate_hash": "zz"}
    (tmp_path / "mixed.jsonl").write_text("\n".join([
        good, "{not json", json.dumps(attempt), json.dumps(unknown_state), json.dumps({"type": "attempt"}), json.dumps([1]),
    ]) + "\n")
    with KnowledgeBase.open(db) as kb:
        result = kb.import_jsonl(tmp_path / "mixed.jsonl")
        # All or nothing: the one good attempt is not imported while other lines are rejected.
        assert (result.attempts_added, result.states_added) == (0, 0)
        assert kb.attempts() == []
        assert any("line 2" in p for p in result.problems) and any("unknown state 'nowhere'" in p for p in result.problems)
        assert any("line 5: missing field 'kernel_hash'" in p for p in result.problems)
        assert any("line 6: a record is a JSON object" in p for p in result.problems)
        assert "nothing was imported" in result.problems[-1]
        (tmp_path / "other.jsonl").write_text('{"type": "something"}\n')
        refused = kb.import_jsonl(tmp_path / "other.jsonl")
        assert refused.attempts_added == 0 and "not a kernel-lsp knowledge-base export" in refused.problems[-1]
        assert kb.import_jsonl(tmp_path / "missing.jsonl").problems[0].startswith("cannot read")


# ---------------------------------------------------------------- reset and stats


def test_reset_forgets_learning_and_reseeds(db):
    with KnowledgeBase.open(db) as kb:
        seeded = kb.entries()
        kb.match_state(FAR)
        kb.record_attempt(make_attempt(1))
        assert kb.stats().attempts == 1 and kb.stats().derived_states == 1
        kb.reset()
        stats = kb.stats()
        assert (stats.attempts, stats.derived_states) == (0, 0)
        assert kb.entries() == seeded


def test_stats_by_technique(db):
    with KnowledgeBase.open(db) as kb:
        kb.record_attempt(make_attempt(1, speedup=1.2))
        kb.record_attempt(make_attempt(2, speedup=0.8, accepted=False, verdict="slower"))
        kb.record_attempt(make_attempt(3, technique="kernel-fusion", speedup=None, accepted=False, verdict="incorrect"))
        stats = kb.stats()
        assert (stats.attempts, stats.accepted_attempts, stats.worked_examples) == (3, 1, 1)
        by = {t.technique: t for t in stats.by_technique}
        assert by["grid-stride-loop"].attempts == 2 and by["grid-stride-loop"].mean_speedup == pytest.approx(1.0)
        assert by["kernel-fusion"].mean_speedup is None


def test_busy_database_is_retried_then_reported(db_file, monkeypatch):
    db = db_file
    monkeypatch.setattr(kb_service, "BUSY_TIMEOUT_MS", 50)
    monkeypatch.setattr(kb_service, "WRITE_RETRIES", 2)
    kb = KnowledgeBase.open(db)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another server holding the write lock
    with pytest.raises(KbError, match="locked"):
        kb.record_attempt(make_attempt(1))
    holder.execute("COMMIT")
    kb.record_attempt(make_attempt(1))  # the same attempt goes through once the lock is free
    assert len(kb.attempts()) == 1
    holder.close()
    kb.close()


def test_export_from_sqlite_imports_into_postgres_and_back(tmp_path, pg_url):
    """``kb export`` / ``kb import`` move a knowledge base between the backends without changing it."""
    with KnowledgeBase.open(tmp_path / "mine.sqlite3") as mine:
        derived = mine.match_state(FAR)
        for n in range(4):
            mine.record_attempt(make_attempt(n, speedup=1.0 + n / 7, accepted=n != 2))
        mine.record_attempt(make_attempt(7, state=derived.state, technique="kernel-fusion", speedup=None, accepted=False))
        mine.export_jsonl(tmp_path / "mine.jsonl")
        expected = _content(mine)
    with KnowledgeBase.open(pg_url) as team:
        assert team.import_jsonl(tmp_path / "mine.jsonl").attempts_added == 5
        assert _content(team) == expected
        team.export_jsonl(tmp_path / "team.jsonl")
    assert (tmp_path / "team.jsonl").read_text() == (tmp_path / "mine.jsonl").read_text()
    with KnowledgeBase.open(tmp_path / "back.sqlite3") as back:
        back.import_jsonl(tmp_path / "team.jsonl")
        assert _content(back) == expected

"""The knowledge base: SQLite (per user) or PostgreSQL (a team's) storage around :mod:`kernel_lsp.core.kb_logic`.

Where: ``path`` argument (``Settings.kb_url`` / ``Settings.kb_path`` / ``--db``) > ``$KERNEL_LSP_KB`` >
``platformdirs.user_data_dir("kernel-lsp")/kb.sqlite3``. A ``postgresql://`` URL opens the same
schema, migrations and queries on a PostgreSQL server (:mod:`kernel_lsp.services.kb_postgres`
translates the few words of SQLite's dialect); everything below about files (WAL, corruption,
the rolling backup) is SQLite's, and PostgreSQL's writers take one advisory lock instead of
``BEGIN IMMEDIATE``.

How it stays safe:

* WAL mode and a busy timeout, so readers never block a writer; every write is one
  ``BEGIN IMMEDIATE`` transaction (the write lock is taken up front, so two servers
  cannot interleave read-modify-write of an entry), retried a bounded number of times
  when SQLite still reports the database busy.
* Versioned migrations: ``schema_version`` holds the version; ``MIGRATIONS[i]`` takes
  the schema from version ``i`` to ``i + 1``.  A file from a *newer* kernel-lsp is left
  alone and refused with a message.
* A file that is not a SQLite database at all (no SQLite header: a ``kbPath`` pointed at
  a ``.bashrc``) is refused with :class:`KbError` and never touched. A SQLite file that
  SQLite cannot read (truncated, failing ``quick_check``) is moved aside to
  ``<name>.corrupt-<UTC timestamp>`` (with its ``-wal``/``-shm``), a fresh database is
  created, and the notice is logged and kept in :attr:`KnowledgeBase.messages` for the
  server and the CLI to show.
* A rolling backup ``<name>.backup`` is written with SQLite's online backup API when the
  database is opened or closed (at most every :data:`BACKUP_INTERVAL_S`, and never
  replacing a backup that holds more attempts, unless the database was reset since). An
  empty database (a 0-byte file, a corrupt one replaced) whose backup holds attempts is
  reported in :attr:`KnowledgeBase.messages`; :meth:`KnowledgeBase.restore_backup`
  (``kernel-lsp kb restore``) brings them back.
* Entries (state x technique) are a cache of ``priors`` (the catalogue's seed entries,
  or what a derived state inherited) replayed with the attempt log in insertion order;
  import merges attempts by their stable id and recomputes, so importing twice changes
  nothing.
* SQL uses ``?`` parameters only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import platformdirs

from kernel_lsp.core import kb_logic
from kernel_lsp.core.candidates import TechniqueHint
from kernel_lsp.core.kb_logic import Attempt, Entry, Example, State, StateMatch, TechniqueChoice, state_from_json
from kernel_lsp.services import kb_postgres
from kernel_lsp.services.kb_postgres import PgConnection, PgError

log = logging.getLogger(__name__)

ENV_VAR = "KERNEL_LSP_KB"
DB_NAME = "kb.sqlite3"
BUSY_TIMEOUT_MS = 5000
"""How long SQLite itself waits for a lock before reporting busy."""
WRITE_RETRIES = 5
"""Write transactions retried this many times after SQLITE_BUSY (on top of the busy timeout)."""
EXPORT_FORMAT = "kernel-lsp-kb"
EXPORT_FORMAT_VERSION = 1
DEFAULT_EXAMPLE_CHARS = 6000
"""Default prompt budget for :meth:`KnowledgeBase.examples_for`, characters of code (before + after)."""

SQLITE_HEADER = b"SQLite format 3\x00"
#: SQLite's ``application_id`` of a kernel-lsp knowledge base ("KLSP"): set when a database is created, so a
#: file is known as ours before anything is written to it.
APPLICATION_ID = 0x4B4C5350
#: The tables of a knowledge base made before the application id was set (schema versions 1-3).
_OUR_TABLES = frozenset(("schema_version", "meta", "states", "techniques", "priors", "entries", "attempts",
                         "sqlite_sequence"))
BACKUP_SUFFIX = ".backup"
BACKUP_INTERVAL_S = 600.0
"""Shortest time between two rolling backups of one database, in seconds."""

T = TypeVar("T")


class KbError(RuntimeError):
    """The knowledge base cannot be used (unwritable, newer schema, locked too long, bad argument)."""


@dataclass(frozen=True)
class Technique:
    name: str
    title: str
    description: str
    preconditions: tuple[str, ...]
    tags: tuple[str, ...]
    example_before: str
    example_after: str


@dataclass(frozen=True)
class ExportStats:
    path: str
    states: int
    """Derived states written (catalogue states come with every kernel-lsp)."""
    attempts: int


@dataclass(frozen=True)
class ImportStats:
    attempts_added: int
    attempts_duplicate: int
    states_added: int
    problems: tuple[str, ...] = ()
    """Rejected lines with their numbers and why; when there are any, nothing was imported."""


@dataclass(frozen=True)
class TechniqueStats:
    technique: str
    attempts: int
    accepted: int
    mean_speedup: float | None
    """Mean measured speedup over attempts that were timed; None when none was."""


@dataclass(frozen=True)
class KbStats:
    path: str
    """The SQLite file, or the PostgreSQL URL without its password."""
    schema_version: int
    size_bytes: int
    states: int
    derived_states: int
    techniques: int
    entries: int
    attempts: int
    accepted_attempts: int
    worked_examples: int
    by_technique: tuple[TechniqueStats, ...] = field(default=())
    """User attempts per technique, most attempted first."""


# ---------------------------------------------------------------- migrations


def _run_script(conn: sqlite3.Connection, script: str) -> None:
    # Statement by statement: sqlite3's executescript() commits a pending transaction
    # first, which would break the one-transaction-per-migration guarantee.
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


def _migrate_1(conn: sqlite3.Connection) -> None:
    """States, techniques, priors, entries, the attempt log and a key/value meta table."""
    _run_script(conn, 
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE states (
            name TEXT PRIMARY KEY, description TEXT NOT NULL, signature_json TEXT NOT NULL,
            parent TEXT, origin TEXT NOT NULL, created_at TEXT NOT NULL);
        CREATE TABLE techniques (
            name TEXT PRIMARY KEY, description TEXT NOT NULL, preconditions_json TEXT NOT NULL,
            example_before TEXT NOT NULL, example_after TEXT NOT NULL);
        CREATE TABLE priors (
            state TEXT NOT NULL, technique TEXT NOT NULL, predicted_speedup REAL NOT NULL,
            confidence REAL NOT NULL, attempts INTEGER NOT NULL, successes INTEGER NOT NULL,
            PRIMARY KEY (state, technique));
        CREATE TABLE entries (
            state TEXT NOT NULL, technique TEXT NOT NULL, predicted_speedup REAL NOT NULL,
            confidence REAL NOT NULL, attempts INTEGER NOT NULL, successes INTEGER NOT NULL,
            PRIMARY KEY (state, technique));
        CREATE TABLE attempts (
            seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
            kernel_hash TEXT NOT NULL, file TEXT NOT NULL, kernel TEXT NOT NULL,
            state TEXT NOT NULL, technique TEXT NOT NULL, candidate_hash TEXT NOT NULL,
            verdict TEXT NOT NULL, reason TEXT NOT NULL, accepted INTEGER NOT NULL, speedup REAL,
            metrics_before_json TEXT NOT NULL, metrics_after_json TEXT NOT NULL,
            model TEXT, created_at TEXT NOT NULL, original_source TEXT, candidate_source TEXT);
        """
    )


def _migrate_2(conn: sqlite3.Connection) -> None:
    """Worked examples need the original kernel's features and the generator; techniques get a title and tags."""
    _run_script(conn, 
        """
        ALTER TABLE attempts ADD COLUMN features_json TEXT NOT NULL DEFAULT '{}';
        ALTER TABLE attempts ADD COLUMN generator TEXT NOT NULL DEFAULT '';
        ALTER TABLE techniques ADD COLUMN title TEXT NOT NULL DEFAULT '';
        ALTER TABLE techniques ADD COLUMN tags_json TEXT NOT NULL DEFAULT '[]';
        """
    )


def _migrate_3(conn: sqlite3.Connection) -> None:
    """Indexes for the two hot queries: entries by state (implicit) and worked examples by technique."""
    _run_script(conn, 
        """
        CREATE INDEX attempts_by_state_technique ON attempts (state, technique);
        CREATE INDEX attempts_examples ON attempts (technique, accepted);
        """
    )


#: MIGRATIONS[i] moves the schema from version i to i + 1.
MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (_migrate_1, _migrate_2, _migrate_3)
SCHEMA_VERSION = len(MIGRATIONS)


def _schema_version(conn: sqlite3.Connection) -> int:
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0] or 0)


# ---------------------------------------------------------------- paths and files


def default_db_path() -> Path:
    return Path(platformdirs.user_data_dir("kernel-lsp")) / DB_NAME


def resolve_db_path(path: str | os.PathLike[str] | None = None) -> Path:
    """``path`` if given, else ``$KERNEL_LSP_KB``, else the user data directory."""
    if path:
        return Path(path).expanduser()
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    return default_db_path()


def resolve_target(target: str | os.PathLike[str] | None = None) -> str | Path:
    """A ``postgresql://`` URL as it is (``target`` or ``$KERNEL_LSP_KB``), else the SQLite path of :func:`resolve_db_path`."""
    if kb_postgres.is_url(target):
        return str(target)
    if not target and kb_postgres.is_url(os.environ.get(ENV_VAR)):
        return os.environ[ENV_VAR]
    return resolve_db_path(target)


def _refuse_foreign(db_path: Path) -> bool:
    """Raise :class:`KbError` when ``db_path`` exists and is not a kernel-lsp knowledge base; True when it is
    a 0-byte file.

    A foreign file is left exactly as it is, read only: not a SQLite file, or a SQLite database of another
    application (another ``application_id``, or tables a knowledge base does not have). Moving it aside (as a
    corrupt knowledge base is), adding tables or switching its journal to WAL would change a user's file
    because a setting pointed at it. A SQLite file that cannot be read is left to the caller's recovery.
    """
    try:
        with open(db_path, "rb") as handle:
            head = handle.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return False
    except IsADirectoryError:
        raise KbError(f"the knowledge-base path {db_path} is a folder, not a SQLite file") from None
    except OSError as exc:
        raise KbError(f"cannot read the knowledge base {db_path}: {exc.strerror}") from exc
    if head and head != SQLITE_HEADER:
        raise KbError(f"{db_path} is not a SQLite database; kernel-lsp will not use it or change it "
                      "(point kbPath at a new or existing kernel-lsp knowledge base)")
    if not head:
        return True
    try:
        conn = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            app_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        return False  # unreadable: the open that follows moves a corrupt knowledge base aside
    if app_id == APPLICATION_ID or (app_id == 0 and tables <= _OUR_TABLES):
        return False
    what = f"application id {app_id:#x}" if app_id else "tables " + ", ".join(sorted(tables - _OUR_TABLES)[:5])
    raise KbError(f"{db_path} is another application's SQLite database ({what}); kernel-lsp will not use it or "
                  "change it (point kbPath or --db at a new or existing kernel-lsp knowledge base)")


def _backup_attempts(path: Path) -> int | None:
    """Attempts held by a backup file, or None when there is none or it cannot be read."""
    if not path.is_file():
        return None
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            return int(conn.execute("SELECT COUNT(*) FROM attempts").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return None


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat(timespec="microseconds")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def catalogue_text() -> tuple[str, str]:
    data = resources.files("kernel_lsp") / "data"
    return (data / "techniques.json").read_text(encoding="utf-8"), (data / "states.json").read_text(encoding="utf-8")


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _signature_json(state: State) -> str:
    return json.dumps(
        {k: {"value": s.value, "weight": s.weight, **({"scale": s.scale} if s.scale else {}),
             **({"bound": s.bound} if s.bound else {})}
         for k, s in sorted(state.signature.items())},
        sort_keys=True,
    )


_ATTEMPT_COLUMNS = (
    "id", "kernel_hash", "file", "kernel", "state", "technique", "candidate_hash", "verdict", "reason",
    "accepted", "speedup", "metrics_before_json", "metrics_after_json", "features_json", "model",
    "generator", "created_at", "original_source", "candidate_source",
)


def _attempt_row(attempt: Attempt, attempt_id: str) -> tuple[Any, ...]:
    keep_code = attempt.accepted
    return (
        attempt_id, attempt.kernel_hash, attempt.file, attempt.kernel, attempt.state, attempt.technique,
        attempt.candidate_hash, attempt.verdict, attempt.reason, int(attempt.accepted), attempt.speedup,
        json.dumps(dict(attempt.metrics_before), sort_keys=True), json.dumps(dict(attempt.metrics_after), sort_keys=True),
        json.dumps(dict(attempt.features), sort_keys=True, default=str), attempt.model, attempt.generator,
        attempt.created_at, attempt.original_source if keep_code else None, attempt.candidate_source if keep_code else None,
    )


def _attempt_from_row(row: sqlite3.Row) -> Attempt:
    return Attempt(
        kernel_hash=row["kernel_hash"], file=row["file"], kernel=row["kernel"], state=row["state"],
        technique=row["technique"], candidate_hash=row["candidate_hash"], verdict=row["verdict"],
        accepted=bool(row["accepted"]), speedup=row["speedup"], reason=row["reason"],
        metrics_before=json.loads(row["metrics_before_json"]), metrics_after=json.loads(row["metrics_after_json"]),
        features=json.loads(row["features_json"]), model=row["model"], generator=row["generator"],
        original_source=row["original_source"], candidate_source=row["candidate_source"], created_at=row["created_at"],
    )


def _entry_from_row(row: sqlite3.Row) -> Entry:
    return Entry(row["state"], row["technique"], row["predicted_speedup"], row["confidence"], row["attempts"], row["successes"])


class KnowledgeBase:
    """One open knowledge base.  Thread-safe (one connection behind a lock); many processes may open the same
    SQLite file or PostgreSQL database."""

    def __init__(self, conn: sqlite3.Connection | PgConnection, path: Path | None, messages: tuple[str, ...]):
        self._conn = conn
        self._lock = threading.RLock()
        self.path = path
        """The SQLite file; None for a PostgreSQL knowledge base."""
        self.location = str(path) if path is not None else getattr(conn, "location", "")
        """Where it is, for the user: the file, or the server's URL without its password."""
        self.messages = messages
        """Notices for the user from opening (a corrupt file moved aside)."""

    @property
    def is_postgres(self) -> bool:
        return isinstance(self._conn, PgConnection)

    # ------------------------------------------------------------ opening

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None, *, create: bool = True) -> KnowledgeBase:
        """Open (creating, migrating, seeding, or recovering) the knowledge base; raises :class:`KbError` if unusable.

        ``path``: a SQLite file, or a ``postgresql://`` URL (a team's server: the same schema and migrations).
        ``create=False``: a SQLite file that does not exist is an error, not a new knowledge base (``kb --db``
        with a mistyped path must not create one there).
        """
        target = resolve_target(path)
        if isinstance(target, str):
            return cls._open_postgres(target)
        db_path = target
        if not create and not db_path.exists():
            raise KbError(f"there is no knowledge base at {db_path} (pass --create to make a new one there)")
        try:
            db_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise KbError(f"cannot create the knowledge-base folder {db_path.parent}: {exc}") from exc
        was_empty_file = _refuse_foreign(db_path)
        messages: list[str] = []
        try:
            conn = cls._connect_checked(db_path)
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                raise KbError(f"knowledge base {db_path} is locked by another process: {exc}") from exc
            raise KbError(f"cannot open knowledge base {db_path}: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            messages.append(cls._move_aside(db_path, exc))
            try:
                conn = cls._connect_checked(db_path)
            except sqlite3.DatabaseError as again:
                raise KbError(f"cannot create a fresh knowledge base at {db_path}: {again}") from again
        kb = cls(conn, db_path, tuple(messages))
        kb._migrate()
        kb._sync_catalogue()
        kb.messages += kb._empty_notice(was_empty_file or bool(messages))
        kb._maybe_backup()
        return kb

    @classmethod
    def _open_postgres(cls, url: str) -> KnowledgeBase:
        """The team's knowledge base on a PostgreSQL server: migrated and seeded as a SQLite file is.

        The server keeps it safe (its own backups, crash recovery), so there is no rolling backup and no
        corrupt-file recovery here.
        """
        try:
            conn = kb_postgres.connect(url)
        except PgError as exc:
            raise KbError(str(exc)) from exc
        kb = cls(conn, None, ())
        try:
            kb._migrate()
            kb._sync_catalogue()
        except BaseException:
            conn.close()
            raise
        return kb

    # ------------------------------------------------------------ backup

    @property
    def backup_path(self) -> Path | None:
        """The rolling backup of a SQLite file; None for PostgreSQL (the server's own backups keep it)."""
        return self.path.with_name(self.path.name + BACKUP_SUFFIX) if self.path is not None else None

    def _learned(self) -> int:
        """Attempts plus derived states: what a reset or a lost file takes away."""
        return int(self._read("SELECT (SELECT COUNT(*) FROM attempts) + (SELECT COUNT(*) FROM states WHERE origin != 'seed')")[0][0])

    def _meta(self, key: str) -> str | None:
        rows = self._read("SELECT value FROM meta WHERE key = ?", (key,))
        return rows[0][0] if rows else None

    def _empty_notice(self, replaced: bool) -> tuple[str, ...]:
        if self._learned() or self._meta("reset_at") is not None:
            return ()
        held = _backup_attempts(self.backup_path)
        if not held:
            return (f"The knowledge base {self.path} was an empty file; it was made a fresh one.",) if replaced else ()
        when = datetime.fromtimestamp(self.backup_path.stat().st_mtime, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        return (f"The knowledge base {self.path} is empty, but its backup {self.backup_path} (from {when}) holds "
                f"{held} attempts: run 'kernel-lsp kb restore' to bring them back.",)

    def _maybe_backup(self, *, now: bool = False) -> None:
        """Refresh the rolling backup (online backup API: consistent while other processes write).

        ``now``: regardless of :data:`BACKUP_INTERVAL_S` (before a reset).
        """
        if self.path is None:
            return
        try:
            learned = self._learned()
            if not learned:
                return
            target = self.backup_path
            if target.exists():
                if not now and time.time() - target.stat().st_mtime < BACKUP_INTERVAL_S:
                    return
                reset_at = self._meta("reset_at")
                reset_since = reset_at is not None and reset_at > _iso(target.stat().st_mtime)
                if not reset_since and (_backup_attempts(target) or 0) > self.stats().attempts:
                    log.warning("not replacing %s: it holds more attempts than %s", target, self.path)
                    return
            partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
            dest = sqlite3.connect(partial)
            try:
                with self._lock:
                    self._conn.backup(dest)
            finally:
                dest.close()
            os.replace(partial, target)
        except (OSError, sqlite3.Error) as exc:  # a backup that fails must not stop the knowledge base
            log.warning("knowledge-base backup of %s failed: %s", self.path, exc)

    def restore_backup(self, *, force: bool = False) -> int:
        """Replace the database's content with its rolling backup; returns the attempts restored.

        Refuses (:class:`KbError`) when there is no usable backup, or when the database holds learning
        of its own and ``force`` is not given.
        """
        if self.backup_path is None:
            raise KbError(f"{self.location} is a PostgreSQL knowledge base: it has no rolling backup "
                          "(restore it with the server's own tools, e.g. pg_restore)")
        held = _backup_attempts(self.backup_path)
        if held is None:
            raise KbError(f"no usable backup at {self.backup_path}")
        if self._learned() and not force:
            raise KbError(f"{self.location} is not empty; restoring {self.backup_path} would replace it (use --force)")
        source = sqlite3.connect(f"{self.backup_path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            with self._lock:
                source.backup(self._conn)
        except sqlite3.Error as exc:
            raise KbError(f"cannot restore {self.backup_path}: {exc}") from exc
        finally:
            source.close()
        return held

    @staticmethod
    def _connect_checked(db_path: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(db_path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
        try:
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_MS)}")
            if int(conn.execute("PRAGMA application_id").fetchone()[0]) != APPLICATION_ID:
                # A new file, or one of ours made before the id existed (_refuse_foreign let only those through).
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            problems = [row[0] for row in conn.execute("PRAGMA quick_check").fetchall()]
            if problems != ["ok"]:
                raise sqlite3.DatabaseError("quick_check: " + "; ".join(problems[:3]))
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _move_aside(db_path: Path, exc: Exception) -> str:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        target = db_path.with_name(f"{db_path.name}.corrupt-{stamp}")
        counter = 1
        while target.exists():
            target = db_path.with_name(f"{db_path.name}.corrupt-{stamp}-{counter}")
            counter += 1
        try:
            db_path.rename(target)
        except FileNotFoundError:
            # Another process recovering the same file moved it first.
            pass
        for suffix in ("-wal", "-shm"):
            side = db_path.with_name(db_path.name + suffix)
            if side.exists():
                side.rename(target.with_name(target.name + suffix))
        message = (
            f"The knowledge base {db_path} could not be read ({exc}); it was moved to {target} "
            "and a fresh one was created. Nothing was deleted."
        )
        log.warning(message)
        return message

    def close(self) -> None:
        self._maybe_backup()
        with self._lock:
            self._conn.close()

    def __enter__(self) -> KnowledgeBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ transactions

    def _write(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn`` in one write transaction: SQLite's BEGIN IMMEDIATE, retried whole on SQLITE_BUSY;
        on PostgreSQL one transaction holding the kernel-lsp write lock (it waits instead of failing busy)."""
        if isinstance(self._conn, PgConnection):
            try:
                with self._lock:
                    return self._conn.write(fn)
            except kb_postgres.errors() as exc:
                raise KbError(f"knowledge base {self.location}: {str(exc).strip()}") from exc
        with self._lock:
            retries = 0
            while True:
                try:
                    self._conn.execute("BEGIN IMMEDIATE")
                    try:
                        result = fn(self._conn)
                        self._conn.execute("COMMIT")
                    except BaseException:
                        if self._conn.in_transaction:
                            self._conn.execute("ROLLBACK")
                        raise
                    return result
                except sqlite3.OperationalError as exc:
                    if not _is_busy(exc) or retries >= WRITE_RETRIES:
                        raise KbError(f"knowledge base {self.location}: {exc}") from exc
                    retries += 1
                    time.sleep(0.05 * 2**retries)

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def _migrate(self) -> None:
        def step(conn: sqlite3.Connection) -> None:
            version = _schema_version(conn)
            if version > SCHEMA_VERSION:
                raise KbError(
                    f"knowledge base {self.location} has schema version {version}, newer than this kernel-lsp "
                    f"understands ({SCHEMA_VERSION}); it was left unchanged"
                )
            for target in range(version, SCHEMA_VERSION):
                MIGRATIONS[target](conn)
                conn.execute("DELETE FROM schema_version")
                conn.execute("INSERT INTO schema_version (version) VALUES (?)", (target + 1,))

        self._write(step)

    # ------------------------------------------------------------ catalogue

    def _sync_catalogue(self, force: bool = False) -> None:
        """Load the shipped techniques and seed states when they changed since the last open."""
        techniques_text, states_text = catalogue_text()
        digest = hashlib.sha256((techniques_text + "\0" + states_text).encode()).hexdigest()

        def step(conn: sqlite3.Connection) -> None:
            row = conn.execute("SELECT value FROM meta WHERE key = ?", ("catalogue_sha256",)).fetchone()
            if row is not None and row[0] == digest and not force:
                return
            for t in json.loads(techniques_text)["techniques"]:
                conn.execute(
                    "INSERT INTO techniques (name, title, description, preconditions_json, tags_json, example_before, example_after)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET title = excluded.title,"
                    " description = excluded.description, preconditions_json = excluded.preconditions_json,"
                    " tags_json = excluded.tags_json, example_before = excluded.example_before,"
                    " example_after = excluded.example_after",
                    (t["name"], t["title"], t["description"], json.dumps(t["preconditions"]), json.dumps(t["tags"]),
                     t["example"]["before"], t["example"]["after"]),
                )
            seeds = json.loads(states_text)["states"]
            for s in seeds:
                state = state_from_json(s["name"], s["description"], s["signature"], None)
                conn.execute(
                    "INSERT INTO states (name, description, signature_json, parent, origin, created_at)"
                    " VALUES (?, ?, ?, NULL, 'seed', ?) ON CONFLICT (name) DO UPDATE SET"
                    " description = excluded.description, signature_json = excluded.signature_json, origin = 'seed'",
                    (state.name, state.description, _signature_json(state), _now()),
                )
                conn.execute("DELETE FROM priors WHERE state = ?", (state.name,))
                conn.executemany(
                    "INSERT INTO priors (state, technique, predicted_speedup, confidence, attempts, successes)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    [(state.name, e["technique"], e["predicted_speedup"], e["confidence"], e["attempts"], e["successes"])
                     for e in s["entries"]],
                )
            self._recompute(conn, [s["name"] for s in seeds])
            conn.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                ("catalogue_sha256", digest),
            )

        self._write(step)

    @staticmethod
    def _recompute(conn: sqlite3.Connection, states: list[str]) -> None:
        """Rebuild the entries of ``states`` from their priors and the attempt log (in insertion order)."""
        for name in states:
            priors = [_entry_from_row(r) for r in conn.execute("SELECT * FROM priors WHERE state = ?", (name,))]
            log_rows = conn.execute(
                "SELECT state, technique, speedup, accepted FROM attempts WHERE state = ? ORDER BY seq", (name,)
            ).fetchall()
            entries = kb_logic.replay(priors, ((r[0], r[1], r[2], bool(r[3])) for r in log_rows))
            conn.execute("DELETE FROM entries WHERE state = ?", (name,))
            conn.executemany(
                "INSERT INTO entries (state, technique, predicted_speedup, confidence, attempts, successes)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [(e.state, e.technique, e.predicted_speedup, e.confidence, e.attempts, e.successes) for e in entries.values()],
            )

    # ------------------------------------------------------------ reading

    def techniques(self) -> list[Technique]:
        return [
            Technique(r["name"], r["title"], r["description"], tuple(json.loads(r["preconditions_json"])),
                      tuple(json.loads(r["tags_json"])), r["example_before"], r["example_after"])
            for r in sorted(self._read("SELECT * FROM techniques"), key=lambda r: r["name"])
        ]

    def states(self) -> list[State]:
        return [
            state_from_json(r["name"], r["description"], json.loads(r["signature_json"]), r["parent"])
            for r in sorted(self._read("SELECT * FROM states"), key=lambda r: r["name"])
        ]

    def entries(self, state: str | None = None) -> list[Entry]:
        if state is None:
            rows = self._read("SELECT * FROM entries")
        else:
            rows = self._read("SELECT * FROM entries WHERE state = ?", (state,))
        return sorted((_entry_from_row(r) for r in rows), key=lambda e: (e.state, e.technique))

    def attempts(self, state: str | None = None, technique: str | None = None) -> list[Attempt]:
        """The attempt log in insertion order, optionally filtered."""
        # The filters are added as needed: PostgreSQL cannot type a parameter that is only tested for NULL.
        where = [(column, value) for column, value in (("state", state), ("technique", technique)) if value is not None]
        clause = " WHERE " + " AND ".join(f"{column} = ?" for column, _ in where) if where else ""
        rows = self._read(f"SELECT * FROM attempts{clause} ORDER BY seq", tuple(value for _, value in where))
        return [_attempt_from_row(r) for r in rows]

    # ------------------------------------------------------------ matching and selection

    def match_state(self, signature: Mapping[str, float], *, threshold: float = kb_logic.MATCH_THRESHOLD,
                    create: bool = True) -> StateMatch:
        """Nearest state, or a new derived one (stored with inherited entries when ``create``)."""
        match = kb_logic.match_state(signature, self.states(), threshold)
        if match.is_new and create and match.derived is not None:
            derived = match.derived

            def step(conn: sqlite3.Connection) -> None:
                inserted = conn.execute(
                    "INSERT INTO states (name, description, signature_json, parent, origin, created_at)"
                    " VALUES (?, ?, ?, ?, 'derived', ?) ON CONFLICT DO NOTHING",
                    (derived.name, derived.description, _signature_json(derived), derived.parent, _now()),
                ).rowcount
                if not inserted:
                    return  # another server derived the same state first
                parent_entries = sorted((_entry_from_row(r) for r in conn.execute(
                    "SELECT * FROM entries WHERE state = ?", (derived.parent,))), key=lambda e: e.technique)
                conn.executemany(
                    "INSERT INTO priors (state, technique, predicted_speedup, confidence, attempts, successes)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    [(e.state, e.technique, e.predicted_speedup, e.confidence, e.attempts, e.successes)
                     for e in kb_logic.inherit_entries(parent_entries, derived.name)],
                )
                self._recompute(conn, [derived.name])

            self._write(step)
        return match

    def select(self, state: str, k: int, rng_seed: int | None = None) -> list[TechniqueChoice]:
        """Up to ``k`` techniques for ``state`` (weighted random top-k, see core/kb_logic.py)."""
        descriptions = {r["name"]: r["description"] for r in self._read("SELECT name, description FROM techniques")}
        return kb_logic.select(self.entries(state), k, seed=rng_seed, descriptions=descriptions)

    def hints(self, state: str, k: int, kernel_features: Mapping[str, Any] | None = None,
              rng_seed: int | None = None, max_chars: int = DEFAULT_EXAMPLE_CHARS) -> list[TechniqueHint]:
        """:meth:`select` plus the closest example of each choice, as the optimizer's ``TechniqueHint``s."""
        hints = []
        budget = max_chars // max(k, 1)
        for choice in self.select(state, k, rng_seed):
            examples = self.examples_for(state, choice.technique, kernel_features or {}, 1, budget)
            example = examples[0] if examples else None
            hints.append(TechniqueHint(
                name=choice.technique, description=choice.description, predicted_speedup=choice.predicted_speedup,
                confidence=choice.confidence, example_before=example.before if example else None,
                example_after=example.after if example else None,
            ))
        return hints

    # ------------------------------------------------------------ recording

    def record_attempt(self, attempt: Attempt) -> None:
        """Append a verified attempt and update its entry; a repeated attempt (same stable id) is ignored.

        Raises :class:`KbError` when ``attempt.state`` is not a known state.
        """
        if attempt.created_at is None:
            attempt = replace(attempt, created_at=_now())
        attempt_id = attempt.stable_id()

        def step(conn: sqlite3.Connection) -> None:
            if conn.execute("SELECT 1 FROM states WHERE name = ?", (attempt.state,)).fetchone() is None:
                raise KbError(f"unknown knowledge-base state '{attempt.state}' (use match_state first)")
            inserted = conn.execute(
                f"INSERT INTO attempts ({', '.join(_ATTEMPT_COLUMNS)}) VALUES ({', '.join('?' * len(_ATTEMPT_COLUMNS))})"
                " ON CONFLICT DO NOTHING",
                _attempt_row(attempt, attempt_id),
            ).rowcount
            if not inserted:
                return
            row = conn.execute("SELECT * FROM entries WHERE state = ? AND technique = ?",
                               (attempt.state, attempt.technique)).fetchone()
            entry = _entry_from_row(row) if row else kb_logic.default_entry(attempt.state, attempt.technique)
            updated = kb_logic.update_entry(entry, attempt.speedup, attempt.accepted)
            conn.execute(
                "INSERT INTO entries (state, technique, predicted_speedup, confidence, attempts, successes)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (state, technique) DO UPDATE SET"
                " predicted_speedup = excluded.predicted_speedup, confidence = excluded.confidence,"
                " attempts = excluded.attempts, successes = excluded.successes",
                (updated.state, updated.technique, updated.predicted_speedup, updated.confidence,
                 updated.attempts, updated.successes),
            )

        self._write(step)

    # ------------------------------------------------------------ examples

    def examples_for(self, state: str, technique: str, kernel_features: Mapping[str, Any], k: int = 2,
                     max_chars: int = DEFAULT_EXAMPLE_CHARS) -> list[Example]:
        """The ``k`` closest verified before/after pairs for ``technique``, within ``max_chars`` of code.

        Order: same state first, then feature distance to ``kernel_features``, then higher
        speedup, then newer.  Only the kernel's own definition is shown, not the whole file.
        Until the user has a verified success for the technique, the catalogue's example is used.
        """
        rows = self._read(
            "SELECT seq, state, kernel, features_json, original_source, candidate_source, speedup FROM attempts"
            " WHERE technique = ? AND accepted = 1 AND original_source IS NOT NULL AND candidate_source IS NOT NULL",
            (technique,),
        )
        ranked = []
        seen = set()
        for r in rows:
            before = kb_logic.kernel_excerpt(r["original_source"], r["kernel"])
            after = kb_logic.kernel_excerpt(r["candidate_source"], r["kernel"])
            if (before, after) in seen:
                continue
            seen.add((before, after))
            distance = kb_logic.feature_distance(kernel_features, json.loads(r["features_json"]))
            example = Example(technique, before, after, "user", r["state"], r["speedup"], distance)
            ranked.append(((r["state"] != state, distance, -(r["speedup"] or 0.0), -r["seq"]), example))
        candidates = [example for _, example in sorted(ranked, key=lambda item: item[0])]
        if not candidates:
            row = self._read("SELECT example_before, example_after FROM techniques WHERE name = ?", (technique,))
            if row:
                candidates = [Example(technique, row[0]["example_before"], row[0]["example_after"], "catalogue")]
        return kb_logic.fit_examples(candidates, k, max_chars)

    # ------------------------------------------------------------ export / import

    def export_jsonl(self, path: str | os.PathLike[str]) -> ExportStats:
        """Write derived states (with their priors) and the whole attempt log as JSON lines."""
        target = Path(path)
        lines = [json.dumps({"type": "header", "format": EXPORT_FORMAT, "format_version": EXPORT_FORMAT_VERSION,
                             "schema_version": SCHEMA_VERSION})]
        state_rows = sorted(self._read("SELECT * FROM states WHERE origin != 'seed'"),
                            key=lambda r: (r["created_at"], r["name"]))
        for r in state_rows:
            priors = [asdict(_entry_from_row(p)) for p in sorted(self._read(
                "SELECT * FROM priors WHERE state = ?", (r["name"],)), key=lambda p: p["technique"])]
            for p in priors:
                del p["state"]
            lines.append(json.dumps({
                "type": "state", "name": r["name"], "description": r["description"],
                "signature": json.loads(r["signature_json"]), "parent": r["parent"], "origin": r["origin"],
                "created_at": r["created_at"], "priors": priors,
            }, sort_keys=True))
        attempt_rows = self._read("SELECT * FROM attempts ORDER BY seq")
        for r in attempt_rows:
            record = asdict(_attempt_from_row(r))
            record.update(type="attempt", id=r["id"])
            lines.append(json.dumps(record, sort_keys=True))
        partial = target.with_name(target.name + ".partial")
        partial.write_text("\n".join(lines) + "\n", encoding="utf-8")
        partial.replace(target)
        return ExportStats(str(target), len(state_rows), len(attempt_rows))

    def import_jsonl(self, path: str | os.PathLike[str]) -> ImportStats:
        """Merge an export: new derived states and attempts are added (attempts de-duplicated by id), entries recomputed.

        All or nothing: every line is first checked against the export schema
        (:func:`kernel_lsp.core.kb_logic.validate_export_record`, no type coercion) and every
        attempt's state must exist here or in the file; when any line is rejected nothing is
        imported and ``problems`` lists each rejected line with why. A state already present
        here keeps its local definition; imported attempts are appended after the local ones,
        so the merged entries are the local ones updated with the imported attempts in the
        file's order.
        """
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            return ImportStats(0, 0, 0, (f"cannot read {path}: {exc}",))
        problems: list[str] = []
        records: list[tuple[int, dict[str, Any]]] = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.append(f"line {number}: not JSON ({exc.msg})")
                continue
            except RecursionError:
                problems.append(f"line {number}: nested too deeply")
                continue
            except ValueError as exc:  # integers beyond Python's digit limit
                problems.append(f"line {number}: not usable JSON ({exc})")
                continue
            found = kb_logic.validate_export_record(record)
            if found:
                problems += [f"line {number}: {why}" for why in found]
                continue
            records.append((number, record))
        headers = [(n, r) for n, r in records if r["type"] == "header"]
        if not headers or headers[0][1]["format"] != EXPORT_FORMAT:
            return ImportStats(0, 0, 0, tuple(problems) + (f"{path} is not a kernel-lsp knowledge-base export; nothing was imported",))
        if headers[0][1]["format_version"] > EXPORT_FORMAT_VERSION:
            return ImportStats(0, 0, 0, tuple(problems) + (
                f"{path} uses export format {headers[0][1]['format_version']}, newer than this kernel-lsp reads; "
                "nothing was imported",))
        problems += [f"line {n}: a second header" for n, _ in headers[1:]]
        known = {r["name"] for r in self._read("SELECT name FROM states")}
        known |= {r["name"] for _, r in records if r["type"] == "state"}
        problems += [f"line {n}: attempt for unknown state '{r['state']}'" for n, r in records
                     if r["type"] == "attempt" and r["state"] not in known]
        problems += self._conflicting_ids(records)
        if problems:
            return ImportStats(0, 0, 0, tuple(problems) + (f"nothing was imported: {len(problems)} problem(s) in {path}",))

        def step(conn: sqlite3.Connection) -> tuple[int, int, int]:
            states_added = attempts_added = duplicates = 0
            touched: set[str] = set()
            for _, record in records:
                if record["type"] == "state":
                    state = state_from_json(record["name"], record["description"], record["signature"], record.get("parent"))
                    inserted = conn.execute(
                        "INSERT INTO states (name, description, signature_json, parent, origin, created_at)"
                        " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                        (state.name, state.description, _signature_json(state), state.parent,
                         "derived" if record["origin"] == "seed" else record["origin"], record["created_at"]),
                    ).rowcount
                    if inserted:
                        states_added += 1
                        touched.add(state.name)
                        conn.executemany(
                            "INSERT INTO priors (state, technique, predicted_speedup, confidence, attempts, successes)"
                            " VALUES (?, ?, ?, ?, ?, ?)",
                            [(state.name, p["technique"], p["predicted_speedup"], p["confidence"], p["attempts"],
                              p["successes"]) for p in record.get("priors", [])],
                        )
                elif record["type"] == "attempt":
                    attempt = _attempt_from_record(record)
                    inserted = conn.execute(
                        f"INSERT INTO attempts ({', '.join(_ATTEMPT_COLUMNS)})"
                        f" VALUES ({', '.join('?' * len(_ATTEMPT_COLUMNS))}) ON CONFLICT DO NOTHING",
                        _attempt_row(attempt, record.get("id") or attempt.stable_id()),
                    ).rowcount
                    if inserted:
                        attempts_added += 1
                        touched.add(attempt.state)
                    else:
                        duplicates += 1
            self._recompute(conn, sorted(touched))
            return states_added, attempts_added, duplicates

        try:
            states_added, attempts_added, duplicates = self._write(step)
        except (sqlite3.DatabaseError, KbError) as exc:  # rolled back: the database is unchanged
            return ImportStats(0, 0, 0, (f"nothing was imported: {exc}",))
        return ImportStats(attempts_added, duplicates, states_added, ())

    def _conflicting_ids(self, records: list[tuple[int, dict[str, Any]]]) -> list[str]:
        """One problem per attempt whose id another attempt of the file, or of this knowledge base, has with
        other values: de-duplicating by id would keep one and drop the other without a word. The same
        attempt again (an export imported twice) is no conflict."""
        problems: list[str] = []
        # Compared as stored (the row an attempt becomes), so a re-imported export matches its rows.
        first: dict[str, tuple[int, tuple[Any, ...]]] = {}
        for number, record in records:
            if record["type"] != "attempt":
                continue
            attempt = _attempt_from_record(record)
            attempt_id = record.get("id") or attempt.stable_id()
            stored = _attempt_row(attempt, attempt_id)
            seen = first.setdefault(attempt_id, (number, stored))
            if seen[0] != number and seen[1] != stored:
                problems.append(f"line {number}: attempt id '{attempt_id}' is also line {seen[0]}'s, with other values")
        ids = list(first)
        for start in range(0, len(ids), 500):  # SQLite's bound-parameter limit
            chunk = ids[start : start + 500]
            rows = self._read(f"SELECT * FROM attempts WHERE id IN ({', '.join('?' * len(chunk))})", tuple(chunk))
            for row in rows:
                number, stored = first[row["id"]]
                if tuple(row[column] for column in _ATTEMPT_COLUMNS) != stored:
                    problems.append(f"line {number}: attempt id '{row['id']}' is already in {self.location} "
                                    "with other values")
        return problems

    # ------------------------------------------------------------ maintenance

    def reset(self) -> None:
        """Forget everything learned: attempts, derived states, entries; the catalogue is re-seeded.

        The rolling backup is refreshed first, so ``kb restore --force`` can undo a reset.
        """
        self._maybe_backup(now=True)

        def step(conn: sqlite3.Connection) -> None:
            for table in ("attempts", "entries", "priors", "states", "techniques"):
                conn.execute(f"DELETE FROM {table}")  # table names are constants, not input
            conn.execute("DELETE FROM meta WHERE key = ?", ("catalogue_sha256",))
            # An empty database after a reset is wanted: no "empty, restore?" notice, and the next
            # backup may replace the one taken before the reset.
            conn.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                         ("reset_at", _now()))

        self._write(step)
        self._sync_catalogue(force=True)

    def stats(self) -> KbStats:
        def count(sql: str, params: tuple[Any, ...] = ()) -> int:
            return int(self._read(sql, params)[0][0])

        by_technique = tuple(sorted(
            (TechniqueStats(r["technique"], int(r["n"]), int(r["ok"]), r["mean"]) for r in self._read(
                "SELECT technique, COUNT(*) AS n, SUM(accepted) AS ok, AVG(speedup) AS mean FROM attempts GROUP BY technique")),
            key=lambda t: (-t.attempts, t.technique)))
        try:
            size = self.path.stat().st_size if self.path is not None else self._conn.database_bytes()  # type: ignore[union-attr]
        except OSError:
            size = 0
        with self._lock:
            version = _schema_version(self._conn)
        return KbStats(
            path=self.location,
            schema_version=version,
            size_bytes=size,
            states=count("SELECT COUNT(*) FROM states"),
            derived_states=count("SELECT COUNT(*) FROM states WHERE origin != 'seed'"),
            techniques=count("SELECT COUNT(*) FROM techniques"),
            entries=count("SELECT COUNT(*) FROM entries"),
            attempts=count("SELECT COUNT(*) FROM attempts"),
            accepted_attempts=count("SELECT COUNT(*) FROM attempts WHERE accepted = 1"),
            worked_examples=count("SELECT COUNT(*) FROM attempts WHERE accepted = 1 AND original_source IS NOT NULL"),
            by_technique=by_technique,
        )


def _attempt_from_record(record: Mapping[str, Any]) -> Attempt:
    """An attempt from an export record that passed :func:`kb_logic.validate_export_record` (types already exact)."""
    speedup = record.get("speedup")
    return Attempt(
        kernel_hash=record["kernel_hash"], file=record["file"], kernel=record["kernel"],
        state=record["state"], technique=record["technique"], candidate_hash=record["candidate_hash"],
        verdict=record["verdict"], accepted=record["accepted"],
        speedup=float(speedup) if speedup is not None else None, reason=record.get("reason", ""),
        metrics_before=dict(record.get("metrics_before") or {}), metrics_after=dict(record.get("metrics_after") or {}),
        features=dict(record.get("features") or {}), model=record.get("model"), generator=record.get("generator", ""),
        original_source=record.get("original_source"), candidate_source=record.get("candidate_source"),
        created_at=record["created_at"],
    )


def iter_entries_by_state(kb: KnowledgeBase) -> Iterator[tuple[State, list[Entry]]]:
    """Every state with its entries, best predicted first (for ``kb show``)."""
    entries: dict[str, list[Entry]] = {}
    for entry in kb.entries():
        entries.setdefault(entry.state, []).append(entry)
    for state in kb.states():
        yield state, sorted(entries.get(state.name, []), key=lambda e: (-e.predicted_speedup * e.confidence, e.technique))

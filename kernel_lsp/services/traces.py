"""Traces of optimization attempts, kept as data for distilling a better local model.

One row per attempt: the prompt, every model turn and tool call, the candidate
(or why there was none), and the harness's verdict once the optimizer has it.
Stored in SQLite (WAL mode, so the server and a CLI run can write at once) at
``<data dir>/traces.sqlite3``; ``kernel-lsp traces export FILE.jsonl`` writes one
JSON object per attempt.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel_lsp.services.models import data_dir

_SCHEMA = """
CREATE TABLE IF NOT EXISTS attempts (
    attempt_id TEXT PRIMARY KEY,
    created_unix_s REAL NOT NULL,
    generator TEXT NOT NULL,
    kernel TEXT NOT NULL,
    path TEXT NOT NULL,
    technique TEXT NOT NULL,
    outcome TEXT NOT NULL,
    record TEXT NOT NULL,
    verdict TEXT
)
"""


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt of a generator at one technique (one sample)."""

    attempt_id: str
    created_unix_s: float
    generator: str
    """``model:<name>`` or ``rule:<name>``."""
    kernel: str
    path: str
    technique: str
    sample: int
    temperature: float | None
    seed: int | None
    prompt: tuple[Mapping[str, str], ...]
    """The opening messages (system and user) as sent to the model."""
    steps: tuple[Mapping[str, Any], ...]
    """Model turns, tool calls with results, and feedback, in order."""
    outcome: str
    """``candidate`` (handed to the harness) or ``rejected`` (with ``reason``)."""
    reason: str | None
    candidate_source: str | None
    """The whole candidate file, when there is one."""
    prompt_tokens: int
    completion_tokens: int
    wall_s: float


def default_trace_path() -> Path:
    return data_dir() / "traces.sqlite3"


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


class TraceStore:
    """Append attempts and their verdicts; export them as JSON lines. Thread-safe."""

    def __init__(self, path: str | os.PathLike[str] | None = None):
        self.path = Path(path) if path is not None else default_trace_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=10.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(_SCHEMA)
        self._db.commit()

    def record_attempt(self, record: AttemptRecord) -> None:
        row = dataclasses.asdict(record)
        with self._lock, self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO attempts (attempt_id, created_unix_s, generator, kernel, path, technique, "
                "outcome, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.attempt_id,
                    record.created_unix_s,
                    record.generator,
                    record.kernel,
                    record.path,
                    record.technique,
                    record.outcome,
                    json.dumps(row, default=str),
                ),
            )

    def record_verdict(self, attempt_id: str, verdict: Mapping[str, Any] | Any) -> bool:
        """Attach the harness's verdict (a mapping or a dataclass); False if the attempt is unknown."""
        payload = json.dumps(_jsonable(verdict), default=str)
        with self._lock, self._db:
            cursor = self._db.execute("UPDATE attempts SET verdict = ? WHERE attempt_id = ?", (payload, attempt_id))
            return cursor.rowcount == 1

    def attempts(self) -> Iterator[dict[str, Any]]:
        """Every attempt as a dict (the AttemptRecord fields plus ``verdict``), oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT record, verdict FROM attempts ORDER BY created_unix_s, rowid").fetchall()
        for record, verdict in rows:
            item = json.loads(record)
            item["verdict"] = json.loads(verdict) if verdict is not None else None
            yield item

    def export_jsonl(self, out: str | os.PathLike[str]) -> int:
        """Write every attempt as one JSON line to ``out``; return how many."""
        count = 0
        with open(out, "w", encoding="utf-8") as handle:
            for item in self.attempts():
                handle.write(json.dumps(item, ensure_ascii=False) + "\n")
                count += 1
        return count

    def close(self) -> None:
        with self._lock:
            self._db.close()

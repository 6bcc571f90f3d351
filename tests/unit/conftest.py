"""Fixtures shared by the unit tests: a real PostgreSQL server, and knowledge-base targets on both backends."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import pg_server


@pytest.fixture(scope="session")
def postgres() -> Iterator[pg_server.PgServer]:
    """One PostgreSQL server for the session. Without PostgreSQL installed the tests that use it skip,
    except in CI (``CI`` set), which installs it (``make system-deps``): there they fail."""
    try:
        server = pg_server.start()
    except FileNotFoundError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(postgres: pg_server.PgServer) -> str:
    """A fresh, empty PostgreSQL database."""
    return postgres.new_database()


@pytest.fixture(params=["sqlite", "postgresql"])
def kb_target(request: pytest.FixtureRequest, tmp_path) -> str:
    """Where a knowledge base is opened: a new SQLite file, or a new database on the test server."""
    if request.param == "sqlite":
        return str(tmp_path / "kb.sqlite3")
    return request.getfixturevalue("pg_url")

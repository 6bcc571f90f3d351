"""A real PostgreSQL server for the tests: initdb into a temporary folder, started on a Unix socket only.

The binaries come from PATH (``initdb``, ``pg_ctl``) or Debian's ``/usr/lib/postgresql/<version>/bin``
(``make system-deps`` installs the ``postgresql`` package). PostgreSQL refuses to run as root, so
as root the server runs as the ``postgres`` user the Debian package creates (else ``nobody``) in a
folder that user owns. No TCP port is opened: parallel test runs cannot collide.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

SUPERUSER = "kernel_lsp"
START_TIMEOUT_S = 60


def binaries() -> str | None:
    """The folder holding initdb and pg_ctl, or None when PostgreSQL is not installed."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return os.path.dirname(os.path.realpath(found))
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(folder, "initdb")) and os.path.exists(os.path.join(folder, "pg_ctl")):
            return folder
    return None


def _run_as() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("running as root and neither a 'postgres' nor a 'nobody' user exists to run PostgreSQL")


@dataclass
class PgServer:
    folder: str
    bin_dir: str
    user: str | None
    _names: itertools.count

    @property
    def socket_dir(self) -> str:
        return self.folder

    def url(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}@/{database}?host={self.socket_dir}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its URL."""
        import psycopg

        name = f"kb_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def _pg(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([os.path.join(self.bin_dir, argv[0]), *argv[1:]], user=self.user, capture_output=True,
                              text=True, timeout=START_TIMEOUT_S, check=True)

    def stop(self) -> None:
        try:
            self._pg("pg_ctl", "-D", os.path.join(self.folder, "data"), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


def start() -> PgServer:
    bin_dir = binaries()
    if bin_dir is None:
        raise FileNotFoundError("PostgreSQL is not installed (initdb/pg_ctl not on PATH nor in /usr/lib/postgresql)")
    user = _run_as()
    folder = tempfile.mkdtemp(prefix="kernel-lsp-pg-")
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(folder, entry.pw_uid, entry.pw_gid)
    server = PgServer(folder, bin_dir, user, itertools.count())
    data = os.path.join(folder, "data")
    try:
        server._pg("initdb", "-D", data, "-U", SUPERUSER, "--auth=trust", "--no-sync", "-E", "UTF8")
        # fsync off: the tests need PostgreSQL's locking and transactions, not its durability across crashes.
        options = f"-k {folder} -c listen_addresses='' -c fsync=off -c max_connections=40"
        server._pg("pg_ctl", "-D", data, "-l", os.path.join(folder, "log"), "-o", options, "-w", "start")
    except subprocess.CalledProcessError as exc:
        log_text = ""
        log_path = os.path.join(folder, "log")
        if os.path.exists(log_path):
            with open(log_path, encoding="utf-8", errors="replace") as f:
                log_text = f.read()[-2000:]
        shutil.rmtree(folder, ignore_errors=True)
        raise RuntimeError(f"PostgreSQL did not start: {exc.stderr}\n{log_text}") from exc
    return server

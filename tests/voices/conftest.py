"""A real PostgreSQL server for the voice store's tests, started once per session on loopback in a temp folder.

Needs the server binaries (Debian: ``apt-get install postgresql``; ``.ci/run`` installs them) and skips with that
message only when they are absent. PostgreSQL refuses to run as root: as root the server runs as the ``postgres``
user (``runuser``). Durability is off (``fsync``, ``synchronous_commit``): these databases live for one test run.
Each test that asks for ``pg_url`` gets a fresh, empty database.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class PostgresServer:
    host: str
    port: int
    password: str
    data_dir: Path

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres:{self.password}@{self.host}:{self.port}/{dbname}"


def _binaries() -> Path | None:
    found = [Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin") if (Path(p) / "initdb").is_file()]
    if found:
        return max(found, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb and shutil.which("pg_ctl") else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgres_server():
    pytest.importorskip("psycopg", reason="the PostgreSQL voice store needs psycopg: pip install -e '.[postgres]'")
    bin_dir = _binaries()
    if bin_dir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found: apt-get install postgresql")
    as_user: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="cadenza-pg-"))
    if os.geteuid() == 0:  # postgres will not run as root
        try:
            account = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the PostgreSQL server as")
        os.chown(root, account.pw_uid, account.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    password = secrets.token_urlsafe(12)
    pwfile = root / "pw"
    pwfile.write_text(password + "\n")
    if as_user:
        os.chown(pwfile, account.pw_uid, account.pw_gid)
    data, port = root / "data", _free_port()

    def run(*cmd: str) -> None:
        done = subprocess.run([*as_user, *cmd], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:2])} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")

    run(str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", f"--pwfile={pwfile}", "--auth-host=scram-sha-256",
        "--auth-local=peer", "-E", "UTF8", "--no-sync", "--no-instructions")
    options = (f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={root} -c fsync=off "
               "-c synchronous_commit=off -c full_page_writes=off -c max_connections=60")
    run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-o", options, "-w", "-t", "60", "start")
    try:
        yield PostgresServer("127.0.0.1", port, password, data)
    finally:
        subprocess.run([*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


_numbers = itertools.count()


@contextlib.contextmanager
def _database(server: PostgresServer) -> Iterator[str]:
    """A fresh, empty database on the test server (dropped afterwards, with any connection still open to it)."""
    import psycopg

    name = f"voices_{os.getpid()}_{next(_numbers)}"
    with psycopg.connect(server.url(), autocommit=True) as admin:
        # PostgreSQL 15+ logs a new database's pages to the WAL by default; copying the files is faster here.
        strategy = " STRATEGY file_copy" if admin.info.server_version >= 150000 else ""
        admin.execute(f"CREATE DATABASE {name}{strategy}")
    try:
        yield server.url(name)
    finally:
        with psycopg.connect(server.url(), autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def pg_url(postgres_server) -> Iterator[str]:
    with _database(postgres_server) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def voices_location(request, tmp_path) -> str:
    """Where a test's voices live, once per backend: a folder (SQLite) or a fresh database (PostgreSQL)."""
    if request.param == "sqlite":
        return str(tmp_path / "voices")
    return request.getfixturevalue("pg_url")


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def module_voices_location(request, tmp_path_factory) -> Iterator[str]:
    """Like ``voices_location``, shared by a module's tests (for the many small ones that only check refusals)."""
    if request.param == "sqlite":
        yield str(tmp_path_factory.mktemp("shared") / "voices")
        return
    with _database(request.getfixturevalue("postgres_server")) as url:
        yield url

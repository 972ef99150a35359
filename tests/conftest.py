"""Fixtures for tests against the real database and real worker processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connection

import tests.support.agents  # noqa: F401 - registers the test agents in this process
from task_queue.models import Worker
from tests.support.server import LiveServer

REPO = Path(__file__).resolve().parent.parent
TEST_AGENT_MODULES = "tests.support.agents"


def wait_for(condition: Callable[[], object], *, timeout: float = 30, what: str = "condition"):
    """Poll ``condition`` (a database query, a process state) until it is truthy.

    Tests synchronise on state this way rather than sleeping a guessed time; the
    timeout only bounds a failure.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def test_database_url() -> str:
    """A DATABASE_URL for the test database, for processes the tests start."""
    settings = connection.settings_dict
    name = settings["NAME"]
    if settings["ENGINE"] == "automechanica.embedded_postgres":
        from automechanica.embedded_postgres import server

        return server.connection_url(name)
    user = quote(settings["USER"] or "", safe="")
    password = f":{quote(settings['PASSWORD'], safe='')}" if settings["PASSWORD"] else ""
    host = quote(settings["HOST"] or "", safe="")
    port = f":{settings['PORT']}" if settings["PORT"] else ""
    return f"postgresql://{user}{password}@{host}{port}/{name}"


def manage_env() -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": test_database_url(),
        "AUTOMECHANICA_AGENT_MODULES": TEST_AGENT_MODULES,
        "PYTHONUNBUFFERED": "1",
    }


class ManageProcess:
    """A ``manage.py COMMAND`` subprocess on the test database, its log in a file."""

    def __init__(self, command: str, args: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", command, *args],
            cwd=REPO,
            env=manage_env(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 60) -> int:
        return self.process.wait(timeout)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.kill()
        self._log.close()


class WorkerProcess(ManageProcess):
    """A ``manage.py runworker`` subprocess."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        super().__init__("runworker", args, log_path)

    @property
    def worker_id(self) -> str:
        return Worker.objects.get(pid=self.pid).worker_id

    def wait_ready(self, timeout: float = 60) -> WorkerProcess:
        """Until the worker has registered: it listens and is about to take tasks."""
        wait_for(
            lambda: self._alive_or_fail() and Worker.objects.filter(pid=self.pid).exists(),
            timeout=timeout,
            what=f"worker {self.pid} to register",
        )
        return self

    def _alive_or_fail(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"worker exited with {self.process.returncode}:\n{self.log()}")
        return True


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


@pytest.fixture
def manage_processes(transactional_db, tmp_path) -> Iterator[Callable[..., ManageProcess]]:
    """Start any ``manage.py`` command as a subprocess; all are killed after."""
    started: list[ManageProcess] = []

    def start(command: str, *args: str) -> ManageProcess:
        started.append(
            ManageProcess(command, list(args), tmp_path / f"{command}-{len(started)}.log")
        )
        return started[-1]

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def live_servers(transactional_db, tmp_path) -> Iterator[Callable[[], LiveServer]]:
    """Start real daphne servers on the test database; all are stopped after."""
    started: list[LiveServer] = []

    def start() -> LiveServer:
        server = LiveServer(manage_env(), tmp_path / f"daphne-{len(started)}.log", REPO)
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


def count_rows(sql: str, params: list | None = None) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchone()[0]


def kill(worker: WorkerProcess) -> None:
    worker.signal(signal.SIGKILL)
    worker.wait(10)

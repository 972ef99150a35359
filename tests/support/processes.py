"""``manage.py`` commands run as separate processes on the test database.

The fixtures ``worker_processes`` and ``manage_processes`` (tests/conftest.py) start
:class:`WorkerProcess` and :class:`ManageProcess` objects and kill them after the
test; :func:`run_manage` runs a command to its end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from task_queue.models import Worker
from tests.support.database import database_url
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parent.parent.parent
TEST_AGENT_MODULES = "tests.support.agents"


def manage_env() -> dict[str, str]:
    """The environment of a process the tests start: the test database, and the test
    agents (tests/support/agents.py) loaded beside the built-in ones."""
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "AUTOMECHANICA_AGENT_MODULES": TEST_AGENT_MODULES,
        "PYTHONUNBUFFERED": "1",
    }


def start_python(code: str, *args: str) -> subprocess.Popen:
    """``python -c CODE ARGS`` started on the test database, its output piped as text
    (read it with ``communicate``)."""
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env=manage_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_python_without_otel(code: str, *args: str) -> subprocess.CompletedProcess:
    """``python -c CODE ARGS`` on the test database with no ``OTEL_*`` variable set (so
    OpenTelemetry is off unless the code turns it on), to its end, output captured."""
    env = {name: value for name, value in manage_env().items() if not name.startswith("OTEL_")}
    env.setdefault("DJANGO_SETTINGS_MODULE", "automechanica.settings")
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_manage(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None, **options: Any
) -> subprocess.CompletedProcess:
    """Run ``manage.py ARGS`` on the test database (in ``env``, by default
    :func:`manage_env`) to its end; its output is captured as text unless ``options``
    say otherwise (they go to :func:`subprocess.run`)."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=env or manage_env(),
        timeout=timeout,
        **{"capture_output": True, "text": True, **options},
    )


class ManageProcess:
    """A ``manage.py COMMAND`` subprocess on the test database, its log in a file; it
    leads a process group of its own (see :func:`kill_group`)."""

    def __init__(
        self, command: str, args: list[str], log_path: Path, env: dict[str, str] | None = None
    ) -> None:
        """``env``: variables (settings) added to :func:`manage_env`."""
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", command, *args],
            cwd=REPO,
            env=manage_env() | (env or {}),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
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
        if not self._log.closed:
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


def kill(worker: ManageProcess) -> None:
    """SIGKILL, as a crash would: the process gets no chance to clean up."""
    worker.signal(signal.SIGKILL)
    worker.wait(10)


def kill_group(process: ManageProcess) -> None:
    """SIGKILL the process's whole group (it and anything it started), as an OOM kill
    of a container or a lost machine would."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(10)

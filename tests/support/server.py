"""A real daphne server on the test database, for tests that go over HTTP."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.waiting import wait_for


class LiveServer:
    """``daphne automechanica.asgi:application`` on a socket this process opened
    (``--fd``), so the port is known before the server starts and never races."""

    def __init__(self, env: dict[str, str], log_path: Path, cwd: Path) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.env, self.cwd = env, cwd
        self.process = self._spawn()

    def _spawn(self) -> subprocess.Popen:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "--fd",
                str(self.sock.fileno()),
                "automechanica.asgi:application",
            ],
            cwd=self.cwd,
            # SIGABRT writes every thread's stack to the log (_terminate).
            env=self.env | {"PYTHONFAULTHANDLER": "1"},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            pass_fds=[self.sock.fileno()],
        )

    def restart(self) -> None:
        """Stop the server and start another on the same socket (the same port):
        clients see their connections drop, then the server come back. Returns once
        the new server answers."""
        with self.stopped():
            pass

    @contextmanager
    def stopped(self) -> Iterator[None]:
        """The server stopped for the block (what it runs happens while no one serves),
        then :meth:`restart`'s new server on the same port, answering."""
        self._terminate()
        try:
            yield
        finally:
            self.process = self._spawn()
            wait_for(self.ready, timeout=60, what="daphne to answer again")

    def _terminate(self, seconds: float = 30) -> None:
        """SIGTERM, as a deployment stops it; a server still running after ``seconds``
        is a bug, shown with its threads' stacks (and killed)."""
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(seconds)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGABRT)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            stacks = self.log()
            raise AssertionError(f"daphne ignored SIGTERM for {seconds:g} s:\n{stacks}") from None

    def ready(self) -> bool:
        """True once the server answers (401: it is up and wants a token)."""
        if self.process.poll() is not None:
            raise AssertionError(f"daphne exited:\n{self.log()}")
        try:
            urllib.request.urlopen(self.url + "/api/v1/agents", timeout=5)
        except urllib.error.HTTPError as error:
            return error.code == 401
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False
        return True

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        try:
            self._terminate()
        finally:
            self._log.close()
            self.sock.close()


def http(method: str, url: str, token: str | None, body: Any = None) -> tuple[int, Any]:
    """One JSON request; (status, decoded body) whatever the status."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Content-Type": "application/json"}
        | ({"Authorization": f"Bearer {token}"} if token else {}),
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def free_port() -> int:
    """A loopback port no one listens on now (for a server the test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

"""``queue_bench --remote``: the benchmark's workers as remote agents.

A real daphne on this process's settings and a free loopback port, a token bound to
EchoAgent, and ``--workers`` processes of the agent client (clients/python, from a venv
of its own that has only the client: ``client_venv``), each running
``--concurrency`` handlers that return at once. They claim in batches (as many as
they have free slots, with a long poll), heartbeat and send their outcomes in
batches, as any remote agent would. Registered with the benchmark in
``ApiConfig.ready``.
"""

from __future__ import annotations

import hashlib
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from task_queue.bench import BenchConfig, BenchProcesses, stop_processes

from .models import ApiToken
from .tokens import create_token

CLIENT = Path(settings.BASE_DIR) / "clients" / "python"
# The handler of the benchmark's agents: nothing to do, as EchoAgent in runworker.
HANDLER = "def echo(task):\n    return {}\n"
# The clients' long poll. A stopping client waits for its poll's answer (it would
# otherwise leave the server claiming tasks for no one): at the default 10 s, each
# remote drain took 10 s more to end. A task's arrival still answers a poll at once.
WAIT_SECONDS = 2


def client_venv(venv: Path, extras: str = "") -> Path:
    """A venv at ``venv`` with the agent client installed, with ``extras`` ("[nats]")
    if given: made once, and the client installed again whenever its source changed
    (a kept venv would otherwise run an older client)."""
    python = venv / "bin" / "python"
    stamp = venv / "automechanica-agent.source"
    source = _client_source_digest() + extras
    if stamp.exists() and stamp.read_text() == source:
        return venv
    uv = shutil.which("uv")
    existed = python.exists()
    if not existed:
        if uv:
            subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
        else:
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    if uv:
        again = ["--reinstall-package", "automechanica-agent"]
        install = [uv, "pip", "install", "-q", *again, "--python", str(python)]
    else:
        install = [str(python), "-m", "pip", "install", "-q"]
        if existed:  # installed before, perhaps from other source: the client again
            again = [*install, "--force-reinstall", "--no-deps", str(CLIENT)]
            subprocess.run(again, check=True, timeout=600)
    subprocess.run([*install, f"{CLIENT}{extras}"], check=True, timeout=600)
    stamp.write_text(source)
    return venv


def _client_source_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(CLIENT.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".toml"):
            digest.update(str(path.relative_to(CLIENT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@contextmanager
def remote_workers(config: BenchConfig, log_dir: Path) -> Iterator[BenchProcesses]:
    venv = client_venv(Path(settings.VAR_DIR) / "agent-client-venv")
    (log_dir / "bench_handlers.py").write_text(HANDLER)
    row, key = create_token("queue_bench remote", "write", ["EchoAgent"])
    server, url = _start_daphne(log_dir / "daphne.log")
    clients: list[subprocess.Popen] = []
    try:
        _wait_answering(url, server, config.timeout)
        command = [str(venv / "bin" / "automechanica-agent"), "--api", url, "--token", key,
                   "--agent", "EchoAgent", "--handler", "bench_handlers:echo",
                   "--concurrency", str(config.concurrency), "--log-level", "WARNING",
                   "--wait-seconds", str(WAIT_SECONDS)]  # fmt: skip
        for i in range(config.workers):
            with open(log_dir / f"client-{i}.log", "wb") as log:
                clients.append(
                    subprocess.Popen(command, cwd=log_dir, stdout=log, stderr=subprocess.STDOUT)
                )
        yield BenchProcesses(clients, [server])
    finally:
        stop_processes(clients)
        stop_processes([server])
        ApiToken.objects.filter(pk=row.pk).delete()


def _start_daphne(log_path: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
             "automechanica.asgi:application"],
            cwd=settings.BASE_DIR, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return server, f"http://127.0.0.1:{port}"


def _wait_answering(url: str, server: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the benchmark's daphne exited with {server.returncode}")
        try:
            urllib.request.urlopen(url + "/api/v1/agents", timeout=5)
        except urllib.error.HTTPError:
            return  # 401: up, and wants a token
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the benchmark's daphne did not answer")

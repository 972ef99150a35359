"""``manage.py orchestrator_bench [--no-stream]``: the reference orchestrator's step
latency and its API requests while nothing changes (docs/performance.md).

Starts daphne (with an access log), ``runorchestrator`` (following the stream, or
polling with ``--no-stream``) and, later, an ``EchoAgent`` worker, on the database
the settings point at, with a two-step definition (``a`` then ``b``, both echo):

1. idle: ``--open`` workflows whose first tasks wait (no worker yet); the API
   requests in ``--idle-seconds`` are counted from daphne's access log;
2. latency: the worker starts, then ``--workflows`` workflows run one after another;
   a step's latency is from ``a``'s completion (``finished_at``) to ``b``'s creation
   (``created_at``), both as PostgreSQL recorded them.

Run it on a quiet queue: the worker also takes any other ``EchoAgent`` task.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from automechanica.api.tokens import create_token
from task_queue.models import Task
from workflows.models import Workflow
from workflows.orchestrator.client import ApiClient
from workflows.orchestrator.definitions import parse
from workflows.orchestrator.driver import Orchestrator

STEP = {"agent_name": "EchoAgent", "task_type": "echo"}
DEFINITION = {
    "name": "bench_two_steps",
    "steps": [
        {"name": "a", **STEP, "payload": {"step": "a"}},
        {"name": "b", **STEP, "depends_on": ["a"], "payload": {"after": "$steps.a.result"}},
    ],
}


class Command(BaseCommand):
    help = "Measure the reference orchestrator: step latency and idle API requests."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-stream", action="store_true", help="the orchestrator polls")
        parser.add_argument("--open", type=int, default=20, help="open workflows when idle")
        parser.add_argument("--idle-seconds", type=float, default=60.0)
        parser.add_argument("--workflows", type=int, default=50, help="for the latency")

    def handle(self, *args: Any, **options: Any) -> None:
        _, token = create_token("orchestrator_bench", "write")
        with tempfile.TemporaryDirectory() as tmp:
            self._run(Path(tmp), token, options)

    def _run(self, tmp: Path, token: str, options: dict[str, Any]) -> None:
        definitions = tmp / "definitions"
        definitions.mkdir()
        (definitions / "bench.json").write_text(json.dumps(DEFINITION))
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        access_log = tmp / "access.log"
        cwd = settings.BASE_DIR  # manage.py is there
        processes = [
            _spawn(tmp, "daphne", "-m", "daphne", "-p", str(port), "--access-log",
                   str(access_log), "automechanica.asgi:application", cwd=cwd),
        ]  # fmt: skip
        try:
            client = ApiClient(url, token)
            client.get("/api/v1/agents")  # retried until daphne answers
            mode = ["--no-stream"] if options["no_stream"] else []
            processes.append(
                _spawn(tmp, "orchestrator", "manage.py", "runorchestrator", "--api", url,
                       "--token", token, "--definitions", str(definitions), *mode, cwd=cwd)
            )  # fmt: skip
            starter = Orchestrator(client)
            definition = parse(DEFINITION)
            opened = [starter.start(definition, {}) for _ in range(options["open"])]
            # The orchestrator's first pass has read every workflow's tasks, and it
            # follows the stream (where it does): the idle window measures that.
            _wait(lambda: _lines(access_log, "GET /api/v1/tasks?") >= options["open"])
            if not options["no_stream"]:
                _wait(lambda: _lines(tmp / "orchestrator.log", "following the live stream"))
            time.sleep(2)
            before = _lines(access_log)
            time.sleep(options["idle_seconds"])
            idle = _lines(access_log) - before
            # Requests while idle mean the orchestrator polled: its stream was down.
            stream_warnings = _lines(tmp / "orchestrator.log", "live stream") - _lines(
                tmp / "orchestrator.log", "following the live stream"
            )
            per_minute = idle * 60 / options["idle_seconds"]
            processes.append(_spawn(tmp, "worker", "manage.py", "runworker", "EchoAgent", cwd=cwd))
            _wait_closed(opened)
            latencies = []
            for _ in range(options["workflows"]):
                workflow_id = starter.start(definition, {})
                _wait_closed([workflow_id])
                latencies.append(_step_latency_ms(workflow_id))
        finally:
            for process in processes:
                process.terminate()
                process.wait(30)
        result = {
            "mode": "polling (--no-stream)" if options["no_stream"] else "stream",
            "open_workflows": options["open"],
            "idle_requests_per_minute": round(per_minute, 1),
            "stream_warnings_until_idle_end": stream_warnings,
            "workflows": len(latencies),
            "step_latency_ms_p50": round(statistics.median(latencies), 1),
            "step_latency_ms_p95": round(statistics.quantiles(latencies, n=20)[-1], 1),
            "load_average": [round(x, 2) for x in os.getloadavg()],
        }
        self.stdout.write(json.dumps(result))


def _spawn(tmp: Path, name: str, *args: str, cwd: Any = None) -> subprocess.Popen:
    log = (tmp / f"{name}.log").open("wb")
    return subprocess.Popen([sys.executable, *args], cwd=cwd, stdout=log, stderr=log)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lines(path: Path, containing: str = "") -> int:
    if not path.exists():
        return 0
    return sum(containing in line for line in path.read_text().splitlines())


def _wait(condition: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not ready after {timeout} s")
        time.sleep(0.1)


def _wait_closed(workflow_ids: list[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while Workflow.objects.filter(id__in=workflow_ids, open=True).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"workflows still open after {timeout} s")
        time.sleep(0.01)
    while Task.objects.filter(workflow_id__in=workflow_ids).exclude(status="completed").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"tasks still running after {timeout} s")
        time.sleep(0.01)


def _step_latency_ms(workflow_id: str) -> float:
    tasks = {
        t.idempotency_key.rsplit(":", 1)[1]: t for t in Task.objects.filter(workflow_id=workflow_id)
    }
    return (tasks["b"].created_at - tasks["a"].finished_at).total_seconds() * 1000

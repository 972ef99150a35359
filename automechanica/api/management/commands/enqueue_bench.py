"""``manage.py enqueue_bench``: enqueue throughput, end to end, three ways.

- ``api``: ``POST /api/v1/tasks`` with ``--batch`` tasks per request against a real
  daphne this command starts (a ``write`` token it makes and revokes), ``--requests``
  requests one after another on one keep-alive connection (or shared among
  ``--connections`` connections sending at once, as an orchestrator with several
  threads would); from the first request sent to the last answer read, every answer
  read whole and checked (201, every task new).
- ``api-minimal``: the same with ``Prefer: return=minimal``, answered with the ids only.
- ``cli``: ``manage.py enqueue EchoAgent echo --count N`` as a subprocess, its wall
  time from start to exit (Python and Django start-up included) with its ids read.
- ``python``: ``enqueue_many`` of N tasks in this process (the queue's own cost).

Each runs ``--repeat`` times; the report gives every run, the median and the range.
The tasks are deleted afterwards (they are pending; no worker should be taking
EchoAgent tasks meanwhile: run it on a quiet queue).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from uuid import UUID

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from automechanica.api.models import Scope
from automechanica.api.tokens import create_token
from task_queue.bench import machine_facts
from task_queue.bench import sql as bench_sql
from task_queue.operations import TaskSpec, enqueue_many

MODES = ("api", "api-minimal", "cli", "python")
# The modes that send requests to daphne, and whether they ask for the ids only.
API_MODES = {"api": False, "api-minimal": True}
AGENT, TASK_TYPE = "EchoAgent", "echo"
SERVER_START_SECONDS = 60


class Command(BaseCommand):
    help = "Measure enqueue throughput: HTTP bulk requests, the enqueue command, enqueue_many."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--mode", choices=MODES, action="append", help="all by default")
        parser.add_argument("--requests", type=int, default=50, help="API requests (50)")
        parser.add_argument("--batch", type=int, default=1000, help="tasks per request (1000)")
        parser.add_argument(
            "--connections", type=int, default=1,
            help="API connections sending at once, the requests shared among them (1)",
        )  # fmt: skip
        parser.add_argument("--count", type=int, default=100_000, help="CLI/python tasks")
        parser.add_argument("--repeat", type=int, default=3, help="runs of each mode (3)")
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args: Any, **options: Any) -> None:
        for name in ("requests", "batch", "connections", "count", "repeat"):
            if options[name] < 1:
                raise CommandError(f"--{name} must be at least 1")
        if options["connections"] > options["requests"]:
            raise CommandError("--connections must be at most --requests")
        if options["batch"] > 1000:
            raise CommandError("--batch must be at most 1000 (the API's limit)")
        modes = options["mode"] or list(MODES)
        runs: dict[str, Callable[[], float]] = {
            mode: lambda minimal=minimal: _api_run(
                server, options["requests"], options["batch"], options["connections"], minimal
            )
            for mode, minimal in API_MODES.items()
        }
        runs["cli"] = lambda: _cli_run(options["count"])
        runs["python"] = lambda: _python_run(options["count"])
        server = _Server() if API_MODES.keys() & set(modes) else None
        report: dict[str, Any] = {}
        try:
            for mode in modes:
                rates = [runs[mode]() for _ in range(options["repeat"])]
                report[mode] = {
                    "tasks_per_s": [round(rate) for rate in rates],
                    "median": round(statistics.median(rates)),
                    "range": [round(min(rates)), round(max(rates))],
                }
            for mode in API_MODES.keys() & set(report):
                report[mode]["connections"] = options["connections"]
        finally:
            if server is not None:
                server.stop()
        report["machine"] = machine_facts()
        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2))
            return
        for mode in modes:
            low, high = report[mode]["range"]
            self.stdout.write(
                f"{mode}: median {report[mode]['median']} tasks/s ({low}–{high}, "
                f"{options['repeat']} runs"
                + (
                    f", {options['connections']} connections)"
                    if "connections" in report[mode]
                    else ")"
                )
            )


class _Server:
    """daphne on a socket this process opened, and a write token for it."""

    def __init__(self) -> None:
        self.token_row, self.token = create_token("enqueue_bench", Scope.WRITE)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "--fd", str(self.sock.fileno()),
             "--access-log", os.devnull, "automechanica.asgi:application"],
            cwd=settings.BASE_DIR, stdout=self.log, stderr=subprocess.STDOUT,
            pass_fds=[self.sock.fileno()],
        )  # fmt: skip
        deadline = time.monotonic() + SERVER_START_SECONDS
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise CommandError("daphne did not start")
            time.sleep(0.1)

    def _answers(self) -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            connection.request("GET", "/api/v1/agents")
            return connection.getresponse().status == 401
        except OSError:
            return False
        finally:
            connection.close()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.sock.close()
        self.log.close()
        self.token_row.delete()


def _api_run(server: _Server, requests: int, batch: int, connections: int, minimal: bool) -> float:
    bodies = [
        json.dumps(
            [{"agent_name": AGENT, "task_type": TASK_TYPE, "payload": {"n": r * batch + i}}
             for i in range(batch)]
        ).encode()
        for r in range(requests)
    ]  # fmt: skip
    shares = [bodies[k::connections] for k in range(connections)]
    made: list[list[UUID]] = [[] for _ in shares]  # each connection's tasks, to delete
    stop = threading.Event()  # set when a connection fails or the run is interrupted
    try:
        with ThreadPoolExecutor(connections) as pool:
            try:
                started = time.perf_counter()
                sending = [
                    pool.submit(_send, server, share, batch, ids, stop, minimal)
                    for share, ids in zip(shares, made, strict=True)
                ]
                for sent in sending:
                    sent.result()
                elapsed = time.perf_counter() - started
            except BaseException:
                stop.set()  # the others stop before their next request
                raise
    finally:  # every connection has stopped: the pool waited for them
        bench_sql.delete_tasks([task_id for ids in made for task_id in ids])
    return requests * batch / elapsed


def _send(
    server: _Server,
    bodies: list[bytes],
    batch: int,
    ids: list[UUID],
    stop: threading.Event,
    minimal: bool,
) -> None:
    """``bodies`` one after another on one keep-alive connection, each answer checked
    and its tasks' ids added to ``ids``; it stops early once ``stop`` is set."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {server.token}"}
    if minimal:
        headers["Prefer"] = "return=minimal"
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        for body in bodies:
            if stop.is_set():
                return
            connection.request("POST", "/api/v1/tasks", body=body, headers=headers)
            response = connection.getresponse()
            answer = json.loads(response.read())
            if response.status == 201:  # new tasks (the bench's have no idempotency keys)
                ids.extend(
                    [UUID(id_) for id_ in answer["ids"]]
                    if minimal
                    else [UUID(item["id"]) for item in answer["items"]]
                )
            if response.status != 201 or answer.get("created") != batch:
                raise CommandError(f"the API answered {response.status}: {answer}")
    except BaseException:
        stop.set()
        raise
    finally:
        connection.close()


def _cli_run(count: int) -> float:
    command = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "enqueue",
               AGENT, TASK_TYPE, "--count", str(count)]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    ids = [UUID(line) for line in done.stdout.split()]
    bench_sql.delete_tasks(ids)
    if done.returncode != 0 or len(ids) != count:
        raise CommandError(f"enqueue failed ({done.returncode}): {done.stderr[-2000:]}")
    return count / elapsed


def _python_run(count: int) -> float:
    specs = [TaskSpec(AGENT, TASK_TYPE, {"n": i}) for i in range(count)]
    started = time.perf_counter()
    enqueued = enqueue_many(specs)
    elapsed = time.perf_counter() - started
    bench_sql.delete_tasks([task.id for task in enqueued])
    return count / elapsed

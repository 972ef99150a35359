"""The standalone agent client (clients/python), installed into a venv of its own that
has no Django and no psycopg (with the nats extra), run as its CLI against a real
daphne: it completes and fails tasks with progress, stops a cancelled task, waits out
a server restart, on SIGTERM gives its running tasks back, and follows dispatch
commands on the real NATS instead of long-polling."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import urllib.parse
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agents_app.models import AgentEvent
from automechanica.api import bench_remote
from task_queue import operations
from task_queue.models import Task, TaskHistory
from tests.support.api import token
from tests.support.brokers import NATS_URL, needs_nats
from tests.support.server import http
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

HANDLERS = """
def echo(task):
    task.progress(0.5, "half way")
    if task.payload.get("fail"):
        raise ValueError("asked to fail")
    task.sleep(task.payload.get("work_seconds", 0))
    return {"echo": task.payload}
"""


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory) -> Path:
    """A venv with only the client installed (pip install './clients/python[nats]')."""
    venv = bench_remote.client_venv(tmp_path_factory.mktemp("client") / "venv", "[nats]")
    no_django = subprocess.run([str(venv / "bin" / "python"), "-c", "import django"])
    assert no_django.returncode != 0, "the client's venv must not have Django"
    return venv


class ClientProcess:
    def __init__(self, venv: Path, workdir: Path, server_url: str, key: str, *args: str):
        (workdir / "handlers.py").write_text(HANDLERS)
        self.log_path = workdir / "client.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        command = [str(venv / "bin" / "automechanica-agent"), "--api", server_url, "--token", key,
                   "--agent", "EchoAgent", "--handler", "handlers:echo", *args]  # fmt: skip
        self.process = subprocess.Popen(
            command, cwd=workdir, stdout=self._log, stderr=subprocess.STDOUT,
            env={"PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._log.close()


@pytest.fixture
def clients(client_venv, tmp_path):
    started: list[ClientProcess] = []

    def start(server_url: str, key: str, *args: str) -> ClientProcess:
        workdir = tmp_path / f"client-{len(started)}"
        workdir.mkdir()
        started.append(ClientProcess(client_venv, workdir, server_url, key, *args))
        return started[-1]

    yield start
    for client in started:
        client.stop()
        print(f"--- {client.log_path}:\n{client.log()[-4000:]}")


def finished(ids) -> bool:
    return not Task.objects.filter(id__in=ids, status__in=["pending", "running"]).exists()


def test_the_client_runs_tasks_through_a_server_restart(live_servers, clients):
    server = live_servers()
    key = token("write", "client", ("EchoAgent",))
    ids = [operations.enqueue("EchoAgent", "echo", {"n": n}).id for n in range(20)]
    failing = operations.enqueue("EchoAgent", "echo", {"fail": True}, max_attempts=1).id
    client = clients(server.url, key, "--worker", "client:1", "--concurrency", "4",
                     "--lease-seconds", "6", "--wait-seconds", "3")  # fmt: skip
    wait_for(lambda: finished([*ids, failing]), timeout=60, what="the first tasks done")
    # The server goes away and comes back: the client waits it out.
    server.restart()
    later = [operations.enqueue("EchoAgent", "echo", {"n": n}).id for n in range(20, 30)]
    wait_for(server.ready, timeout=60, what="daphne back")
    wait_for(lambda: finished(later), timeout=90, what="the tasks after the restart done")
    done = [*ids, *later]
    assert Task.objects.filter(id__in=done, status="completed").count() == len(done)
    assert Task.objects.get(id=ids[3]).result == {"echo": {"n": 3}}
    actors = set(TaskHistory.objects.filter(task_id__in=done).values_list("actor", flat=True))
    assert actors == {"client:1"}
    assert AgentEvent.objects.filter(task_id__in=done).count() == len(done)
    dead = Task.objects.get(id=failing)
    assert dead.status == "dead" and dead.error_info["type"] == "ValueError"
    assert "asked to fail" in dead.error_info["traceback"]
    assert client.process.poll() is None


def test_the_client_stops_a_cancelled_task_and_gives_tasks_back_on_sigterm(live_servers, clients):
    server = live_servers()
    key = token("write", "client", ("EchoAgent",))
    slow = [operations.enqueue("EchoAgent", "echo", {"work_seconds": 120}).id for _ in range(3)]
    client = clients(server.url, key, "--worker", "client:2", "--concurrency", "3",
                     "--lease-seconds", "6", "--grace-seconds", "1",
                     "--wait-seconds", "3")  # fmt: skip
    wait_for(
        lambda: Task.objects.filter(id__in=slow, status="running", progress=0.5).count() == 3,
        timeout=60,
        what="three tasks running, their progress written by a heartbeat",
    )
    status, _ = http("POST", f"{server.url}/api/v1/tasks/{slow[0]}/cancel", token("write"))
    assert status == 200
    wait_for(
        lambda: Task.objects.get(id=slow[0]).status == "cancelled",
        timeout=30,
        what="the cancelled task stopped at its next heartbeat",
    )
    client.process.send_signal(signal.SIGTERM)
    assert client.process.wait(30) == 0, client.log()
    rows = Task.objects.filter(id__in=slow[1:])
    assert {(t.status, t.attempts, t.lease_token) for t in rows} == {("pending", 0, None)}
    assert set(
        TaskHistory.objects.filter(task_id__in=slow[1:]).values_list("event", flat=True)
    ) == {"released"}


def test_a_result_the_server_refuses_fails_its_task_and_the_others_complete(live_servers, clients):
    # Outcomes go with the next claim while tasks keep coming: one the server refuses
    # (a result over its size limit) must not hold up the claim or the others.
    server = live_servers(QUEUE_MAX_PAYLOAD_BYTES="2000")
    key = token("write", "client", ("EchoAgent",))
    big = operations.enqueue("EchoAgent", "echo", {"text": "x" * 3000}).id
    small = [operations.enqueue("EchoAgent", "echo", {"n": n}).id for n in range(12)]
    clients(server.url, key, "--worker", "client:3", "--concurrency", "4", "--wait-seconds", "3")
    wait_for(lambda: finished([big, *small]), timeout=60, what="every task finished")
    assert Task.objects.filter(id__in=small, status="completed").count() == len(small)
    refused = Task.objects.get(id=big)
    assert (refused.status, refused.error_info["type"]) == ("failed", "OutcomeRefused")
    assert "payload_too_large" in refused.error_info["message"]


# What a server from before claims carried outcomes answers a claim that has them.
OLDER_SERVERS_REFUSAL = json.dumps(
    {
        "code": "validation_error",
        "message": "outcomes: Extra inputs are not permitted",
        "field_errors": [{"field": "outcomes", "message": "Extra inputs are not permitted"}],
        "details": {},
    }
).encode()


class OlderServer:
    """A proxy to a live server that answers as a server from before claims carried
    outcomes: a claim with ``outcomes`` is 422 naming that field (an unknown field, as
    every request schema refuses one); everything else goes through."""

    def __init__(self, url: str) -> None:
        self.refused = 0
        self.carrying_after_refusal = 0
        target = urllib.parse.urlsplit(url)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path.endswith("/claim") and "outcomes" in json.loads(body or b"{}"):
                    proxy.carrying_after_refusal += proxy.refused
                    proxy.refused += 1
                    return self._answer(422, OLDER_SERVERS_REFUSAL)
                upstream = HTTPConnection(target.hostname, target.port, timeout=90)
                headers = {k: self.headers[k] for k in ("Authorization", "Content-Type")}
                upstream.request("POST", self.path, body, headers)
                answer = upstream.getresponse()
                self._answer(answer.status, answer.read())
                upstream.close()

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def test_against_an_older_server_the_client_sends_outcomes_on_their_own(live_servers, clients):
    server = OlderServer(live_servers().url)
    try:
        key = token("write", "client", ("EchoAgent",))
        ids = [operations.enqueue("EchoAgent", "echo", {"n": n}).id for n in range(30)]
        client = clients(server.url, key, "--concurrency", "2", "--wait-seconds", "2")
        wait_for(lambda: finished(ids), timeout=60, what="every task finished")
    finally:
        server.close()
    assert Task.objects.filter(id__in=ids, status="completed").count() == len(ids)
    # One claim carried outcomes and was refused; none after it: one warning.
    assert (server.refused, server.carrying_after_refusal) == (1, 0)
    assert client.log().count("does not take outcomes with a claim") == 1


def test_a_batch_larger_than_a_request_may_carry_is_refused_at_once(client_venv):
    # Every batch the client sends is then one the API takes as to its shape, so a 422
    # naming ``outcomes`` itself can only come from a server that does not know it.
    made = "from automechanica_agent import Runner; Runner('http://x', 't', 'EchoAgent', print, "
    for size, refused in ((500, False), (501, True), (0, True)):
        run = subprocess.run(
            [str(client_venv / "bin" / "python"), "-c", made + f"batch_size={size})"],
            capture_output=True,
            text=True,
        )
        assert (run.returncode != 0, "batch_size must be 1 to 500" in run.stderr) == (
            refused,
            refused,
        ), run.stderr


@needs_nats
def test_the_client_follows_dispatch_commands(
    live_servers, clients, manage_processes, nats_namespace
):
    """--dispatch: the client takes relay_events --dispatch's commands from NATS (no long
    poll) and claims each task by id; a duplicate command gets a 409 and is acked, and
    one whose task is over the agent's limit (two at a time here, four slots) is
    delivered again until the task can run."""
    from task_queue.limits import set_limits
    from tests.support.dispatch import (
        commands_by_task,
        consumer_state,
        duplicate,
        nats_commands,
        nats_publish,
    )

    server = live_servers()
    key = token("write", "client", ("EchoAgent",))
    set_limits("EchoAgent", concurrency_limit=2, actor="test")
    tasks = [operations.enqueue("EchoAgent", "echo", {"work_seconds": 0.1}) for _ in range(20)]
    ids = [t.id for t in tasks]
    ns = ["--namespace", nats_namespace]
    manage_processes("relay_events", "--to", NATS_URL, *ns, "--dispatch",
                     env={"QUEUE_DISPATCH_REPUBLISH_SECONDS": "3600"})  # fmt: skip
    wait_for(
        lambda: len(commands_by_task(nats_commands(nats_namespace))) == len(ids),
        what="the relay's commands",
    )
    nats_publish(nats_namespace, [duplicate(Task.objects.get(id=i)) for i in ids[:5]])
    clients(server.url, key, "--worker", "follower:1", "--concurrency", "4",
            "--dispatch", NATS_URL, *ns)  # fmt: skip
    wait_for(lambda: finished(ids), timeout=60, what="every task done")
    completed = TaskHistory.objects.filter(task_id__in=ids, event="completed")
    assert sorted(completed.values_list("task_id", flat=True)) == sorted(ids)
    assert set(completed.values_list("actor", flat=True)) == {"follower:1"}
    wait_for(lambda: consumer_state(nats_namespace) == (0, 0), what="every command acked")

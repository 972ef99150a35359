"""Remote workers over a real daphne, as separate processes: the long poll (woken by
an enqueue, holding no thread and no connection while it waits), the worker on
``GET /api/v1/workers``, and crash safety with raw-HTTP agents killed with SIGKILL and
frozen with SIGSTOP past their leases (every task completed exactly once, every late
write refused), beside in-process workers under one concurrency limit."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from django.db import connection
from django.db.models import Sum

from agents_app.models import AgentEvent, EmbeddingJob
from task_queue import limits, operations
from task_queue.models import HELD_STATUSES as HELD
from task_queue.models import Task, TaskHistory, Worker, WorkerHeartbeat
from tests.support.api import token
from tests.support.processes import REPO
from tests.support.server import http
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

AGENT_SCRIPT = REPO / "tests" / "support" / "remote_agent.py"


class RemoteAgent:
    """tests/support/remote_agent.py as a subprocess; its JSON lines in a file."""

    def __init__(self, api: str, key: str, agent: str, worker: str, lease: float, log: Path):
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, str(AGENT_SCRIPT), api, key, agent, worker, str(lease)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={"PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"},  # no Django, no database
        )

    def events(self) -> list[dict]:
        lines = self.log_path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)
        self._log.close()


@pytest.fixture
def remote_agents(tmp_path):
    started: list[RemoteAgent] = []

    def start(*args) -> RemoteAgent:
        started.append(RemoteAgent(*args, tmp_path / f"remote-{len(started)}.log"))
        return started[-1]

    yield start
    for agent in started:
        agent.stop()
        print(f"--- {agent.log_path.name}:\n{agent.log_path.read_text()[-3000:]}")


def claim(server, key: str, **body):
    return http(
        "POST", f"{server.url}/api/v1/agents/EchoAgent/claim", key, {"worker": "w:1", **body}
    )


def test_a_long_poll_is_woken_by_an_enqueue_and_shows_its_worker(live_servers):
    # A re-registration tick of 30 s: only the enqueue's notification can answer early.
    server = live_servers(QUEUE_LEASE_SECONDS="90")
    key = token("write", "remote", ("EchoAgent",))
    answered: dict = {}

    def poll() -> None:
        began = time.monotonic()
        answered["response"] = claim(server, key, wait_seconds=60)
        answered["seconds"] = time.monotonic() - began

    waiting = threading.Thread(target=poll)
    waiting.start()
    # The claim registered its worker before waiting; no task yet.
    wait_for(lambda: Worker.objects.filter(worker_id="w:1").exists(), what="the worker's row")
    status, workers = http("GET", f"{server.url}/api/v1/workers", token("read"))
    [row] = [w for w in workers if w["worker_id"] == "w:1"]
    assert (row["kind"], row["state"], row["stale"]) == ("remote", "idle", False)
    assert waiting.is_alive()
    task = operations.enqueue("EchoAgent", "echo", {"n": 1})
    enqueued = time.monotonic()
    waiting.join(60)
    status, body = answered["response"]
    assert status == 200 and [t["id"] for t in body["tasks"]] == [str(task.id)]
    assert answered["seconds"] < 30  # woken, not answered by a tick or the deadline
    print(f"answered {time.monotonic() - enqueued:.3f} s after the enqueue")
    status, workers = http("GET", f"{server.url}/api/v1/workers", token("read"))
    [row] = [w for w in workers if w["worker_id"] == "w:1"]
    assert row["task_ids"] == [str(task.id)] and row["state"] == "busy"


def test_a_long_poll_with_nothing_due_answers_empty_at_its_deadline(live_servers):
    server = live_servers()
    began = time.monotonic()
    status, body = claim(server, token("write"), wait_seconds=1.5)
    assert (status, body) == (200, {"tasks": [], "results": []})
    assert time.monotonic() - began >= 1.5


def test_a_long_poll_records_the_outcomes_it_carries_once_before_it_waits(live_servers):
    server = live_servers()
    key = token("write", "remote", ("EchoAgent",))
    done = operations.enqueue("EchoAgent", "echo")
    status, body = claim(server, key)
    [held] = body["tasks"]
    outcome = {"task_id": held["id"], "lease_token": held["lease_token"], "status": "completed",
               "result": {"ok": True}}  # fmt: skip
    answered: dict = {}

    def poll() -> None:
        answered["response"] = claim(server, key, wait_seconds=30, outcomes=[outcome])

    waiting = threading.Thread(target=poll)
    waiting.start()
    # Recorded before the wait, while the claim still waits for a task.
    wait_for(lambda: Task.objects.get(id=done.id).status == "completed", what="the outcome")
    assert waiting.is_alive()
    task = operations.enqueue("EchoAgent", "echo", {"n": 2})
    waiting.join(30)
    status, body = answered["response"]
    assert status == 200 and [t["id"] for t in body["tasks"]] == [str(task.id)]
    assert [r["status"] for r in body["results"]] == ["completed"]
    completions = TaskHistory.objects.filter(task_id=done.id, to_status="completed")
    assert completions.count() == 1


def test_an_idle_workers_claims_write_its_row_only_when_something_changed(live_servers):
    # Each write of a remote worker's row is a heartbeat counted in worker_heartbeats.
    # Leases of 30 s: an idle worker's row is written again only after 10 s.
    server = live_servers(QUEUE_LEASE_SECONDS="30")
    key = token("write", "remote", ("EchoAgent",))

    def beats() -> int:
        counted = WorkerHeartbeat.objects.filter(worker_id="w:1").aggregate(n=Sum("beats"))
        return counted["n"] or 0

    def row() -> tuple:
        return Worker.objects.values_list("state", "task_ids").get(worker_id="w:1")

    for _ in range(4):
        assert claim(server, key) == (200, {"tasks": [], "results": []})
    assert (beats(), row()) == (1, ("idle", []))  # the first wrote it; the others left it
    task = operations.enqueue("EchoAgent", "echo")
    [held] = claim(server, key)[1]["tasks"]
    assert (beats(), row()) == (2, ("busy", [task.id]))
    outcome = {"task_id": held["id"], "lease_token": held["lease_token"], "status": "completed"}
    status, body = claim(server, key, outcomes=[outcome])
    assert (status, [r["status"] for r in body["results"]]) == (200, ["completed"])
    assert (beats(), row()) == (3, ("idle", []))  # the finished task left it
    assert claim(server, key)[1]["tasks"] == [] and beats() == 3
    # An outcome sent on its own: the next claim writes the row again.
    task = operations.enqueue("EchoAgent", "echo")
    [held] = claim(server, key)[1]["tasks"]
    assert claim(server, key)[1]["tasks"] == [] and (beats(), row()) == (5, ("busy", [task.id]))
    outcome = {"task_id": held["id"], "lease_token": held["lease_token"], "status": "completed"}
    assert http("POST", f"{server.url}/api/v1/outcomes", key, {"outcomes": [outcome]})[0] == 200
    assert row() == ("busy", [task.id])
    assert claim(server, key)[1]["tasks"] == [] and (beats(), row()) == (6, ("idle", []))


def test_waiting_long_polls_hold_no_thread_and_no_connection(live_servers):
    # Leases of 6 s: the wake-ups mark the waiting workers alive every 2 s.
    server = live_servers(WEB_DB_POOL_MAX_SIZE="4", QUEUE_LEASE_SECONDS="6")
    key = token("write")
    daphne = psutil.Process(server.process.pid)
    claim(server, key)  # the server has made its pool and its LISTEN
    threads_before = daphne.num_threads()
    polls = [
        threading.Thread(
            target=http,
            args=("POST", f"{server.url}/api/v1/agents/EchoAgent/claim", key),
            kwargs={"body": {"worker": f"poll:{i}", "wait_seconds": 30}},
        )
        for i in range(40)
    ]
    for poll in polls:
        poll.start()
    # Every poll has run its claim once (its worker's row says so) and then waits.
    wait_for(
        lambda: Worker.objects.filter(worker_id__startswith="poll:").count() == 40,
        what="40 polls to claim",
    )
    # The claims run on the worker protocol's threads, one per pooled connection (4),
    # which stay; the waits hold none.
    wait_for(
        lambda: daphne.num_threads() <= threads_before + 4 + 2,
        timeout=10,
        what=f"daphne's threads at most {threads_before} + 4 (+2) while 40 polls wait",
        describe=daphne.num_threads,
    )
    assert all(poll.is_alive() for poll in polls)
    # The test's own connection aside, the database serves only this server.
    wait_for(
        lambda: _server_connections() <= 4 + 1,
        timeout=10,
        what="the server's connections: its pool of 4, and the wake-ups' LISTEN",
        describe=_server_connections,
    )
    # The waiting workers stay alive: one statement a tick marks them all, no claim.
    first = dict(Worker.objects.filter(worker_id__startswith="poll:").values_list(
        "worker_id", "last_heartbeat_at"))  # fmt: skip
    wait_for(
        lambda: all(
            seen > first[worker]
            for worker, seen in Worker.objects.filter(worker_id__in=first).values_list(
                "worker_id", "last_heartbeat_at"
            )
        ),
        timeout=10,
        what="every waiting worker's heartbeat time to move",
    )
    for _ in range(40):  # one each: a task wakes one claim
        operations.enqueue("EchoAgent", "echo")
    for poll in polls:
        poll.join(60)
    assert Task.objects.filter(status="running").count() == 40


def _server_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def test_remote_agents_killed_and_frozen_complete_every_task_once(
    live_servers, manage_processes, worker_processes, remote_agents
):
    """Four raw-HTTP agents and a runworker share EchoAgent's tasks under a concurrency
    limit of 3. One agent is SIGKILLed and another SIGSTOPped mid-task, past its lease;
    the reaper gives their tasks back; the frozen one, resumed, finds its completion
    refused. Every task ends completed once: one history row, one AgentEvent, one
    embedding job; the limit held at every moment."""
    limits.set_limits("EchoAgent", concurrency_limit=3, actor="test", source="test")
    server = live_servers()
    key = token("write", "echo", ("EchoAgent",))
    # Long tasks for the victims to hold when they are hit, then short ones.
    tasks = [operations.enqueue("EchoAgent", "echo", {"work_seconds": 4}) for _ in range(2)]
    lease = 6.0
    victims = [remote_agents(server.url, key, "EchoAgent", f"victim-{i}:1", lease) for i in (0, 1)]
    wait_for(lambda: all(_claimed(v) for v in victims), timeout=60, what="the victims' claims")
    # Hit at once, in their 4 s tasks (the others take longer than that to start).
    victims[0].process.send_signal(signal.SIGKILL)
    victims[1].process.send_signal(signal.SIGSTOP)
    tasks += [operations.enqueue("EchoAgent", "echo", {"work_seconds": 0.2}) for _ in range(30)]
    for i in (0, 1):
        remote_agents(server.url, key, "EchoAgent", f"agent-{i}:1", lease)
    worker_processes("EchoAgent", "--concurrency", "2").wait_ready()
    manage_processes("runmaintenance")  # the reaper
    ids = [t.id for t in tasks]
    # The tasks the agent holds, sampled as fast as the database answers until all are
    # done: remote and in-process workers claim under one limit.
    samples = []
    deadline = time.monotonic() + 180
    while Task.objects.filter(id__in=ids, status="completed").count() < len(ids):
        samples.append(Task.objects.filter(agent_name="EchoAgent", status__in=HELD).count())
        assert time.monotonic() < deadline, "the tasks did not all complete"
    victims[1].process.send_signal(signal.SIGCONT)
    wait_for(lambda: _refused(victims[1]), timeout=30, what="the frozen agent's late write")
    assert [e["code"] for e in _refused(victims[1])] == ["lease_lost"]
    completed = Counter(
        TaskHistory.objects.filter(task_id__in=ids, event="completed").values_list(
            "task_id", flat=True
        )
    )
    assert completed == Counter(ids)
    assert Counter(
        AgentEvent.objects.filter(task_id__in=ids).values_list("task_id", flat=True)
    ) == (Counter(ids))
    assert EmbeddingJob.objects.filter(agent_event__task_id__in=ids).count() == len(ids)
    assert len(samples) > 50 and max(samples) <= 3, (len(samples), max(samples))


def _claimed(agent: RemoteAgent) -> bool:
    return any(e["event"] == "claimed" for e in agent.events())


def _refused(agent: RemoteAgent) -> list[dict]:
    return [e for e in agent.events() if e["event"] == "refused"]

"""Behind a real PgBouncer in transaction mode, with default settings: workers, the
API, the stream and maintenance work, nothing this product sets outlives its
transaction on the pool's server connections, and a worker whose LISTEN is not in
effect says so (issue 37 §1)."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from websockets.sync.client import connect

from task_queue.models import Task
from task_queue.operations import TaskSpec, enqueue_many
from task_queue.sql.connections import connection_params
from tests.support.api import token
from tests.support.database import database_url
from tests.support.pgbouncer import POOL_SIZE, PgBouncer, pgbouncer_binary, start_pgbouncer
from tests.support.processes import manage_env, run_manage
from tests.support.server import http
from tests.support.waiting import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(pgbouncer_binary() is None, reason="pgbouncer is not installed"),
]

SETTINGS = """
SELECT current_setting('synchronous_commit'), current_setting('enable_sort'),
       current_setting('enable_hashjoin'), current_setting('enable_mergejoin'),
       current_setting('plan_cache_mode'), current_setting('jit'),
       current_setting('statement_timeout')
"""


@pytest.fixture
def pooler(transactional_db) -> Iterator[PgBouncer]:
    bouncer = start_pgbouncer()
    yield bouncer
    bouncer.stop()


def pooled_env(bouncer: PgBouncer, **extra: str) -> dict[str, str]:
    return manage_env() | {"DATABASE_URL": bouncer.url} | extra


def manage(bouncer: PgBouncer, *args: str) -> subprocess.CompletedProcess:
    return run_manage(*args, env=pooled_env(bouncer), timeout=180)


def settings_of_every_pooled_session(bouncer: PgBouncer) -> set[tuple[str, ...]]:
    """SETTINGS as a fresh client sees them on each of the pool's server connections:
    POOL_SIZE clients, each in a transaction (so holding a server connection of its
    own) at once."""
    clients = [psycopg.connect(bouncer.url, autocommit=True) for _ in range(POOL_SIZE)]
    try:
        for client in clients:
            client.execute("BEGIN")
        return {tuple(client.execute(SETTINGS).fetchone()) for client in clients}
    finally:
        for client in clients:
            client.close()


def server_defaults() -> tuple[str, ...]:
    with psycopg.connect(**connection_params()) as direct:
        return tuple(direct.execute(SETTINGS).fetchone())


def test_enqueue_and_a_burst_worker_drain_and_leave_no_setting_on_the_pool(pooler):
    enqueued = manage(pooler, "enqueue", "EchoAgent", "echo", "--count", "500")
    assert enqueued.returncode == 0, enqueued.stderr[-3000:]

    worker = manage(pooler, "runworker", "EchoAgent", "--burst", "--concurrency", "20")

    assert worker.returncode == 0, worker.stderr[-3000:]
    assert Task.objects.filter(status="completed").count() == 500
    assert "prepared statements are off" in worker.stderr
    assert settings_of_every_pooled_session(pooler) == {server_defaults()}


def test_a_waiting_worker_warns_that_listen_is_not_in_effect_and_polls(pooler, manage_processes):
    worker = manage_processes(
        "runworker", "EchoAgent", env={"DATABASE_URL": pooler.url, "QUEUE_POLL_SECONDS": "1"}
    )
    wait_for(
        lambda: "LISTEN is not in effect" in worker.log(),
        timeout=30,
        what="the worker's warning",
        describe=worker.log,
    )
    (warning,) = [line for line in worker.log().splitlines() if "LISTEN is not in effect" in line]
    assert "WARNING" in warning and "polling for new tasks every 1.0 s" in warning
    (task,) = enqueue_many([TaskSpec("EchoAgent", "echo")])
    wait_for(
        lambda: Task.objects.get(id=task.id).status == "completed",
        timeout=30,
        what="the task, found by polling",
    )


def test_with_a_listen_url_a_worker_behind_the_pool_is_woken_by_notifications(
    pooler, manage_processes
):
    # It never polls in this test (an hour between polls): only a notification, sent
    # by an enqueue through the pool, can wake it.
    env = {
        "DATABASE_URL": pooler.url,
        "DATABASE_LISTEN_URL": database_url(),
        "QUEUE_POLL_SECONDS": "3600",
    }
    worker = manage_processes("runworker", "EchoAgent", env=env)
    wait_for(
        lambda: " ready: agents " in worker.log(),
        timeout=30,
        what="the worker to start",
        describe=worker.log,
    )
    enqueued = manage(pooler, "enqueue", "EchoAgent", "echo")
    assert enqueued.returncode == 0, enqueued.stderr[-3000:]
    task_id = enqueued.stdout.strip()
    wait_for(
        lambda: Task.objects.get(id=task_id).status == "completed",
        timeout=30,
        what="the task, found on a notification",
        describe=worker.log,
    )
    assert "LISTEN is not in effect" not in worker.log()
    assert "LISTEN goes to DATABASE_LISTEN_URL" in worker.log()


def test_the_api_and_the_stream_answer_through_the_pool(pooler, live_servers):
    server = live_servers(DATABASE_URL=pooler.url)
    writer, reader = token("write"), token("read")
    claim = {"worker": "remote-1", "limit": 5, "lease_seconds": 30, "wait_seconds": 0}
    claim_free_task = {"agent_name": "SEOAgent", "task_type": "generate_seo"}
    requests = [
        ("POST", "/api/v1/tasks", writer, {"agent_name": "EchoAgent", "task_type": "echo"}),
        ("GET", "/api/v1/tasks?limit=5", reader, None),
        ("POST", "/api/v1/agents/EchoAgent/claim", writer, claim),
        ("GET", "/api/v1/agents", reader, None),
        ("GET", "/api/v1/workers", reader, None),
    ] * 10

    def send(request: tuple) -> tuple[int, str]:
        method, path, secret, body = request
        answer = urllib.request.Request(
            server.url + path,
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {secret}"},
        )
        try:
            with urllib.request.urlopen(answer, timeout=60) as response:
                return response.status, ""
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")[-2000:]

    with ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(send, requests))

    statuses = [status for status, _ in answers]
    assert len(answers) == 50 and all(status < 500 for status in statuses), answers
    assert statuses.count(201) == 10
    # The stream's hub reads again every 2 s where no notification comes.
    ws = server.url.replace("http://", "ws://") + "/api/v1/stream"
    with connect(ws, additional_headers={"Authorization": f"Bearer {reader}"}) as stream:
        status, body = http("POST", server.url + "/api/v1/tasks", writer, claim_free_task)
        assert status == 201, body
        message = stream.recv(timeout=30)
    assert body["id"] in message, message
    # A waiting claim is answered when a task arrives: its wake-ups, whose LISTEN is
    # not in effect here, say so and look again every second.
    waiting = ThreadPoolExecutor(1).submit(
        http,
        "POST",
        server.url + "/api/v1/agents/FitmentAgent/claim",
        writer,
        claim | {"worker": "remote-2", "wait_seconds": 60},
    )
    wait_for(
        lambda: "waiting claims look for tasks every 1.0 s" in server.log_path.read_text(),
        timeout=30,
        what="the wake-ups' warning",
    )
    (task,) = enqueue_many([TaskSpec("FitmentAgent", "generate_fitment")])
    status, answer = waiting.result(timeout=90)
    assert status == 200 and [t["id"] for t in answer["tasks"]] == [str(task.id)]
    assert settings_of_every_pooled_session(pooler) == {server_defaults()}


def test_maintenance_runs_through_the_pool(pooler):
    enqueue_many([TaskSpec("EchoAgent", "echo")])

    done = manage(pooler, "runmaintenance", "--once")

    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr


def test_the_relay_refuses_to_start_through_the_pool_in_one_line(pooler):
    # Its one-relay-per-destination lock is a session lock, which the pool cannot keep.
    relay = manage(pooler, "relay_events", "--to", "nats://127.0.0.1:1", "--once")

    assert relay.returncode == 1
    (line,) = relay.stderr.strip().splitlines()
    assert "pooler in transaction mode" in line and "DATABASE_URL" in line

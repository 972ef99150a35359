"""The reference orchestrator: the command, and end to end over HTTP with real server,
worker and orchestrator processes (its definitions and plans:
tests/test_orchestrator_definitions.py)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from task_queue.models import Task, TaskStatus
from tests.support.api import token
from tests.support.processes import REPO, manage_env
from tests.support.queue import complete_pending
from tests.support.server import free_port, http
from tests.support.waiting import wait_for
from workflows.management.commands.runorchestrator import Command as RunOrchestrator
from workflows.models import Workflow
from workflows.orchestrator.client import TOKEN_VARIABLE, ApiClient, ApiError
from workflows.orchestrator.definitions import load_all, parse
from workflows.orchestrator.driver import Orchestrator
from workflows.orchestrator.follow import EventStream

DEFINITIONS = Path(__file__).parent / "support" / "definitions"
FEED = REPO / "workflows" / "orchestrator" / "examples" / "acme_feed.json"
AGENTS = ["SupplierNormalizationAgent", "FitmentAgent", "PricingAgent", "SEOAgent", "EchoAgent"]


# ------------------------------------------------------------------ the command


def test_the_orchestrator_needs_a_token(monkeypatch):
    monkeypatch.delenv(TOKEN_VARIABLE, raising=False)
    with pytest.raises(CommandError, match=f"--token or \\${TOKEN_VARIABLE}"):
        call_command("runorchestrator", "--api", "http://127.0.0.1:9", "--once")


class FailingPasses:
    """Passes that fail with ``error`` twice, then stop the loop."""

    def __init__(self, error: ApiError) -> None:
        self.stop, self.error, self.passes = threading.Event(), error, 0

    def run_once(self) -> int:
        self.passes += 1
        if self.passes <= 2:
            raise self.error
        self.stop.set()
        return 0


def run_loop(passes: FailingPasses) -> None:
    RunOrchestrator()._loop(passes, passes.stop, poll=0, once=False, demo=None)


def test_a_server_error_is_retried_and_a_refusal_ends_the_orchestrator():
    flaky = FailingPasses(ApiError("GET", "/api/v1/workflows", 503, {"message": "busy"}))
    run_loop(flaky)
    assert flaky.passes == 3  # two 503s, then a pass that worked

    refused = FailingPasses(ApiError("GET", "/api/v1/workflows", 401, {"message": "no"}))
    with pytest.raises(ApiError, match="401"):
        run_loop(refused)
    assert refused.passes == 1


class StuckWorkflowApi:
    """An API with one open workflow whose first task is ``status``."""

    def __init__(self) -> None:
        self.status = "dead"
        self.open = True
        definition = load_all()["supplier_onboarding"].as_json()
        state = {"definition": definition, "input": {}, "run_id": "r"}
        self.workflow = {"id": "wf-1", "trace_id": "tr", "metadata": {"orchestrator": state}}

    def pages(self, path: str, **params: str) -> list[dict]:
        if path == "/api/v1/workflows":
            return [self.workflow] if self.open else []
        return [
            {
                "id": "t-1",
                "idempotency_key": "wf:r:normalize",
                "status": self.status,
                "result": None,
            }
        ]


def test_a_stuck_workflow_is_reported_once_per_change(caplog):
    api = StuckWorkflowApi()
    driver = Orchestrator(api)

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]

    with caplog.at_level("INFO", logger="workflows.orchestrator.driver"):
        for _ in range(5):
            driver.run_once()
        assert warnings() == ["workflow wf-1 needs attention: ['normalize']"]
        api.status = "pending"  # revived
        driver.run_once()
        api.status = "failed"  # and stuck again
        driver.run_once()
        driver.run_once()
        assert len(warnings()) == 2
        assert "workflow wf-1: no step is stuck any more" in caplog.messages
        api.open = False  # closed: forgotten
        driver.run_once()
        assert driver._stuck == {}


# ------------------------------------------------------------------ end to end


def orchestrator(server_url: str, secret: str, log: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "runorchestrator",
            "--api",
            server_url,
            "--token",
            secret,
            "--definitions",
            str(DEFINITIONS),
            "--poll",
            "0.2",
            *args,
        ],
        cwd=REPO,
        env=manage_env(),
        stdout=subprocess.PIPE,
        stderr=log.open("wb"),
        text=True,
    )


def workflow_id(process: subprocess.Popen) -> str:
    return process.stdout.readline().strip()


def tasks_of(workflow: str, step: str = "") -> list[Task]:
    """The workflow's tasks, or those of one step. A step's tasks are keyed
    ``wf:<run>:<step>[:<index>]``: matched by the whole segment, since a run's hex id
    may itself start with a step's name (``:b`` matched ``wf:b3…:a``)."""
    tasks = Task.objects.filter(workflow_id=workflow)
    if step:
        tasks = tasks.filter(idempotency_key__regex=rf"^wf:[^:]+:{re.escape(step)}(:|$)")
    return list(tasks)


@pytest.mark.slow
def test_supplier_onboarding_runs_to_completion_across_an_orchestrator_crash(
    live_servers, worker_processes, tmp_path
):
    server = live_servers()
    secret = token("write")
    first = orchestrator(
        server.url,
        secret,
        tmp_path / "orchestrator-1.log",
        "--start",
        "supplier_onboarding",
        "--input",
        f"@{FEED}",
    )
    workflow = workflow_id(first)
    assert workflow, (tmp_path / "orchestrator-1.log").read_text()
    worker_processes("SupplierNormalizationAgent").wait_ready()
    # Normalisation done, the three fitment tasks enqueued, none run (no worker yet):
    # the orchestrator dies here, mid-workflow.
    wait_for(lambda: len(tasks_of(workflow, "fitment")) == 3, what="fitment tasks")
    first.send_signal(signal.SIGKILL)
    first.wait(10)

    second = orchestrator(server.url, secret, tmp_path / "orchestrator-2.log")
    try:
        worker_processes(*AGENTS[1:]).wait_ready()
        wait_for(
            lambda: (
                http("GET", f"{server.url}/api/v1/workflows/{workflow}", secret)[1]["status"]
                == "completed"
            ),
            timeout=90,
            what="the workflow to complete",
        )
    finally:
        second.terminate()
        second.wait(10)

    tasks = tasks_of(workflow)
    keys = sorted(t.idempotency_key.split(":", 2)[2] for t in tasks)
    assert keys == [
        "fitment:0",
        "fitment:1",
        "fitment:2",
        "normalize",
        "pricing",
        "seo:0",
        "seo:1",
        "seo:2",
    ]
    assert {t.status for t in tasks} == {TaskStatus.COMPLETED}
    # Each step got the outputs of the steps before it.
    seo = {t.result["sku"]: t for t in tasks if ":seo:" in t.idempotency_key}
    fitment = {t.result["sku"]: t.result for t in tasks if ":fitment:" in t.idempotency_key}
    assert seo["RTR-305F"].payload["product"]["fitment"] == fitment["RTR-305F"]["vehicles"]
    assert fitment["RTR-305F"]["count"] > 0
    (pricing,) = [t for t in tasks if t.idempotency_key.endswith(":pricing")]
    assert [i["sku"] for i in pricing.payload["items"]] == ["RTR-305F", "PAD-305F", "WHL-17"]
    assert pricing.payload["items"][0]["cost_cents"] == 3000


@pytest.mark.slow
def test_an_injected_failure_ends_needs_attention_until_revived(
    live_servers, worker_processes, tmp_path
):
    server = live_servers()
    secret = token("write")
    feed = {**json.loads(FEED.read_text()), "enrich_failure": "transient"}
    (tmp_path / "feed.json").write_text(json.dumps(feed))
    process = orchestrator(
        server.url,
        secret,
        tmp_path / "orchestrator.log",
        "--start",
        "flaky_onboarding",
        "--input",
        f"@{tmp_path / 'feed.json'}",
    )
    try:
        workflow = workflow_id(process)
        worker_processes(*AGENTS).wait_ready()

        def status() -> str:
            return http("GET", f"{server.url}/api/v1/workflows/{workflow}", secret)[1]["status"]

        wait_for(lambda: status() == "needs_attention", timeout=60, what="needs_attention")
        (dead,) = tasks_of(workflow, "enrich")
        assert dead.status == TaskStatus.DEAD and dead.error_info["type"] == "TransientEchoError"
        assert tasks_of(workflow, "publish") == []

        # Revived with the failure edited out, it completes and the workflow goes on.
        fixed = {**dead.payload, "fail": None}
        revived = http(
            "POST", f"{server.url}/api/v1/tasks/{dead.id}/revive", secret, {"payload": fixed}
        )
        assert revived[0] == 200
        wait_for(lambda: status() == "completed", timeout=60, what="completed after revive")
        (publish,) = tasks_of(workflow, "publish")
        assert publish.result["published"] == {"in": 3, "out": 3, "rejected": 0}
    finally:
        process.terminate()
        process.wait(10)


class LossyClient(ApiClient):
    """Loses the answer to the first workflow creation after the server committed it,
    as a dropped connection would; the client then sends the request again."""

    lost = False

    def request(self, method: str, path: str, body=None):
        if (method, path) == ("POST", "/api/v1/workflows") and not self.lost:
            self.lost = True
            super().request(method, path, body)
        return super().request(method, path, body)


@pytest.mark.slow
def test_orchestrator_survives_lost_answers_bad_workflows_and_cancelled_tasks(live_servers):
    server = live_servers()
    client = LossyClient(server.url, token("write"))
    orchestrator = Orchestrator(client)
    fan_out = parse(
        {
            "name": "fan_out",
            "steps": [
                {
                    "name": "each",
                    "agent_name": "EchoAgent",
                    "task_type": "echo",
                    "for_each": "$input.items",
                    "payload": {"n": "$item"},
                },
            ],
        }
    )
    # 1,500 first tasks: more than one request takes; the answer to it is lost.
    big = orchestrator.start(fan_out, {"items": list(range(1500))})
    assert client.lost and Workflow.objects.count() == 1
    assert Task.objects.filter(workflow_id=big).count() == 1000
    assert Workflow.objects.get(id=big).open

    # A workflow whose orchestrator state was mangled does not stop the others.
    status, broken = http(
        "POST",
        f"{server.url}/api/v1/workflows",
        client.token,
        {"name": "broken", "open": True, "metadata": {"orchestrator": {}}},
    )
    assert status == 201
    two_steps = parse(
        {
            "name": "two_steps",
            "steps": [
                {"name": "a", "agent_name": "EchoAgent", "task_type": "echo"},
                {"name": "b", "agent_name": "EchoAgent", "task_type": "echo", "depends_on": ["a"]},
            ],
        }
    )
    doomed = orchestrator.start(two_steps, {})
    (first,) = tasks_of(doomed)
    assert http("POST", f"{server.url}/api/v1/tasks/{first.id}/cancel", client.token)[0] == 200

    assert orchestrator.run_once() == 500
    assert Task.objects.filter(workflow_id=big).count() == 1500
    assert not Workflow.objects.get(id=big).open
    # The step after a cancelled task can never run: the workflow is cancelled.
    assert Workflow.objects.get(id=doomed).cancelled_at is not None
    assert tasks_of(doomed) == [first]
    assert Workflow.objects.get(id=broken["id"]).open


class CountingClient(ApiClient):
    """Counts the requests it makes."""

    requests = 0

    def request(self, method: str, path: str, body=None):
        self.requests += 1
        return super().request(method, path, body)


TWO_STEPS = {
    "name": "two_steps",
    "steps": [
        {"name": "a", "agent_name": "EchoAgent", "task_type": "echo"},
        {"name": "b", "agent_name": "EchoAgent", "task_type": "echo", "depends_on": ["a"]},
    ],
}


def next_events(stream: EventStream) -> list[dict]:
    return wait_for(lambda: stream.receive(timeout=1.0), what="events on the stream")


@pytest.mark.slow
def test_following_the_stream_drives_a_workflow_per_event_and_resumes(live_servers):
    """Over a real daphne: an event costs the requests of driving its workflow, no
    event costs none, and a stream reopened after a drop resumes where it stopped."""
    server = live_servers()
    client = CountingClient(server.url, token("write"))
    driver = Orchestrator(client)
    stream = EventStream(server.url, client.token)
    assert stream.connect() is False  # no position yet: the caller makes a pass
    try:
        workflow = driver.start(parse(TWO_STEPS), {})
        assert driver.on_events([]) == 0
        before = client.requests
        complete_pending("EchoAgent")  # step a
        events = next_events(stream)
        assert [e["kind"] for e in events] == ["evt.task.completed.v1"]
        assert driver.on_events(events) == 1
        # Its tasks, step b's, and closing it (every step has its tasks).
        assert client.requests - before == 3
        assert not Workflow.objects.get(id=workflow).open
        (b,) = tasks_of(workflow, "b")

        stream.close()  # dropped; step b completes meanwhile
        complete_pending("EchoAgent")
        assert stream.connect() is True  # resumed after the last position seen
        events = next_events(stream)
        assert [e["payload"]["task_id"] for e in events] == [str(b.id)]
        before = client.requests
        assert driver.on_events(events) == 0
        assert client.requests == before  # a closed workflow is not driven any more
    finally:
        stream.close()


@pytest.mark.slow
def test_the_orchestrator_polls_while_the_stream_is_unavailable(live_servers, caplog):
    """A stream that cannot be opened (nothing listens there): the loop polls the
    API instead and the workflow still moves on."""
    server = live_servers()
    client = ApiClient(server.url, token("write"))
    driver = Orchestrator(client)
    workflow = driver.start(parse(TWO_STEPS), {})
    nowhere = EventStream(f"http://127.0.0.1:{free_port()}", client.token)
    stop = threading.Event()
    loop = threading.Thread(
        target=RunOrchestrator()._loop,
        args=(driver, stop, 0.05, False, None, nowhere),
        daemon=True,
    )
    with caplog.at_level("WARNING"):
        loop.start()
        try:
            complete_pending("EchoAgent")  # step a: the next pass enqueues b
            wait_for(lambda: tasks_of(workflow, "b"), what="step b, by polling")
            wait_for(lambda: not Workflow.objects.get(id=workflow).open, what="closed")
        finally:
            stop.set()
            loop.join(30)
    assert not loop.is_alive()
    assert any("the live stream is unavailable" in m for m in caplog.messages)

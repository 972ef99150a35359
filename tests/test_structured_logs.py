"""LOG_FORMAT=json: a real worker's every output line is a JSON object, and its lines
about a task carry the task's fields (task_queue.task_logging)."""

import asyncio
import json
import logging
import uuid
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone

from agents_app import memory
from agents_app.models import AgentEvent, EmbeddingJob
from task_queue import task_logging
from task_queue.maintenance import reaper
from task_queue.models import Task, TaskStatus
from task_queue.operations import enqueue
from task_queue.task_logging import TaskFields
from tests.support.brokers import NATS_URL, jetstream, needs_nats
from tests.support.processes import manage_env, run_manage
from tests.support.queue import OWNER, claim_and_start
from tests.test_relay import command

pytestmark = pytest.mark.django_db(transaction=True)

FIELDS = ("task_id", "trace_id", "agent", "worker", "attempt")


def test_a_workers_json_lines_carry_each_tasks_fields():
    trace = f"trace-{uuid.uuid4()}"
    ok = [enqueue("EchoAgent", "echo", {"n": n}, trace_id=trace).id for n in range(2)]
    failing = enqueue("EchoAgent", "echo", {"fail": "permanent"}, trace_id=trace).id
    # Its second attempt: the line says so, from the task, not from a counter of its own.
    retried = enqueue("EchoAgent", "echo", {"n": 9}, max_attempts=3).id
    Task.objects.filter(id=retried).update(attempts=1)

    done = run_manage(
        "runworker",
        "EchoAgent",
        "--burst",
        env={**manage_env(), "LOG_FORMAT": "json", "LOG_LEVEL": "DEBUG"},
    )

    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in (done.stdout + done.stderr).splitlines()]
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    ready = next(line for line in lines if " ready: " in line["message"])
    worker = ready["message"].split()[1]
    assert not set(FIELDS) & ready.keys()  # a line about no task names none
    about = {}
    for line in lines:
        if "task_id" in line:
            assert set(FIELDS) <= line.keys(), line
            about.setdefault(line["task_id"], []).append(line)
    assert set(about) == {str(t) for t in [*ok, failing, retried]}
    for task_id, task_lines in about.items():
        messages = [line["message"] for line in task_lines]
        assert all(task_id in message for message in messages)
        for line in task_lines:
            assert line["agent"] == "EchoAgent" and line["worker"] == worker
            # Given none, the retried task's trace is the one it started (its id, hex).
            own = uuid.UUID(task_id).hex
            assert line["trace_id"] == (own if task_id == str(retried) else trace)
            assert line["attempt"] == (2 if task_id == str(retried) else 1)
        assert messages[0].endswith("started: echo")
    assert "completed" in about[str(ok[0])][-1]["message"]
    failed = about[str(failing)][-1]
    assert failed["level"] == "WARNING" and "not to be retried: PermanentError" in failed["message"]
    assert Task.objects.get(id=failing).status == TaskStatus.FAILED


def test_at_the_default_level_a_worker_logs_each_failure_by_how_it_ended():
    trace = f"trace-{uuid.uuid4()}"
    ok = enqueue("EchoAgent", "echo", {"n": 1}, trace_id=trace).id
    failing = enqueue("EchoAgent", "echo", {"fail": "permanent"}, trace_id=trace).id
    retried = enqueue("EchoAgent", "echo", {"fail": "transient"}, trace_id=trace, max_attempts=3).id
    dead = enqueue("EchoAgent", "echo", {"fail": "transient"}, trace_id=trace, max_attempts=1).id
    env = {**manage_env(), "LOG_FORMAT": "json"}
    env.pop("LOG_LEVEL", None)

    done = run_manage("runworker", "EchoAgent", "--burst", env=env)

    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in (done.stdout + done.stderr).splitlines()]
    about = {line["task_id"]: line for line in lines if "task_id" in line}
    # One line per failure (a burst worker does not wait for the retry), none for the
    # completion.
    assert set(about) == {str(failing), str(retried), str(dead)}
    assert str(ok) not in about
    expected = {
        failing: ("WARNING", "failed, not to be retried: PermanentError"),
        retried: ("INFO", "attempt 1 of 3 failed; retried at "),
        dead: ("ERROR", "is dead: all 1 attempts failed: TransientEchoError"),
    }
    for task_id, (level, words) in expected.items():
        line = about[str(task_id)]
        assert line["level"] == level and words in line["message"], line
        assert line["trace_id"] == trace and line["agent"] == "EchoAgent"
        assert line["attempt"] == 1 and line["worker"] and line["error_type"]


@needs_nats
def test_the_relays_line_about_a_commands_task_carries_its_fields(nats_namespace):
    async def send(js) -> None:
        await js.add_stream(name=f"{nats_namespace}_GRNS_CMD", subjects=[f"{nats_namespace}.cmd.>"])
        body = command("cmd-log", target_agent_type="EchoAgent", task_type="echo", payload={})
        await js.publish(f"{nats_namespace}.cmd.task.execute.v1", body)

    asyncio.run(jetstream(send))
    args = ["--to", NATS_URL, "--namespace", nats_namespace, "--once", "--consume-commands"]
    done = run_manage("relay_events", *args, env={**manage_env(), "LOG_FORMAT": "json"})

    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in (done.stdout + done.stderr).splitlines()]
    (task,) = Task.objects.filter(idempotency_key="cmd:cmd-log")
    (line,) = [line for line in lines if line.get("task_id") == str(task.id)]
    assert line["message"] == f"command: task {task.id} created"
    fields = {name: line[name] for name in FIELDS}
    # The relay creates the task; no worker has run it yet.
    assert fields == {
        "task_id": str(task.id),
        "trace_id": "tr-cmd",
        "agent": "EchoAgent",
        "worker": None,
        "attempt": None,
    }


def test_text_is_the_default_and_an_unknown_format_is_refused():
    env = {**manage_env(), "LOG_LEVEL": "INFO"}
    env.pop("LOG_FORMAT", None)
    text = run_manage("runworker", "EchoAgent", "--burst", env=env)
    assert text.returncode == 0, text.stderr
    assert " INFO task_queue.worker: worker " in text.stderr
    assert not any(line.startswith("{") for line in text.stderr.splitlines())

    refused = run_manage("runworker", "EchoAgent", "--burst", env={**env, "LOG_FORMAT": "xml"})
    assert refused.returncode == 1
    assert "LOG_FORMAT must be text or json, not 'xml'" in refused.stderr


def test_the_embedders_line_about_a_task_carries_its_fields(monkeypatch, caplog):
    def broken(text: str) -> list[float]:
        raise RuntimeError("embedder down")

    monkeypatch.setattr(memory, "embed", broken)
    task_id = enqueue("FitmentAgent", "generate_fitment", {}, trace_id="t-embed").id
    event = AgentEvent.objects.create(
        agent_name="FitmentAgent", event_type="task_completed", content="x", task_id=task_id
    )
    EmbeddingJob.objects.create(agent_event=event)
    caplog.handler.addFilter(TaskFields())  # the filter settings.LOGGING gives its handler

    with caplog.at_level(logging.WARNING, logger="agents_app.memory"):
        memory.embed_batch("embedder:1")

    (record,) = caplog.records
    assert f"embedding the event of task {task_id} failed (retrying)" in record.getMessage()
    fields = {name: getattr(record, name) for name in FIELDS}
    assert fields == {
        "task_id": str(task_id),
        "trace_id": "t-embed",
        "agent": "FitmentAgent",
        "worker": "embedder:1",
        "attempt": None,
    }


def test_any_line_inside_a_tasks_context_carries_it_and_none_outside():
    """An agent's own lines in its handler, from a logger of its own: the worker's
    context covers them (the worker enters it around the handler)."""
    filter_ = TaskFields()
    task = SimpleNamespace(id=uuid.uuid4(), trace_id="t-1", agent_name="PricingAgent", attempts=2)

    def record() -> logging.LogRecord:
        made = logging.getLogger("agents_app.agents.pricing").makeRecord(
            "agents_app.agents.pricing", logging.INFO, __file__, 1, "priced", (), None
        )
        assert filter_.filter(made)
        return made

    with task_logging.about_task(task, "host:1"):
        inside = record()
        with task_logging.about_task(task_logging.TaskRef(uuid.uuid4(), None, "SEOAgent")):
            nested = record()
        after_nested = record()
    outside = record()

    assert {name: getattr(inside, name) for name in FIELDS} == {
        "task_id": str(task.id),
        "trace_id": "t-1",
        "agent": "PricingAgent",
        "worker": "host:1",
        "attempt": 3,
    }
    assert (nested.agent, nested.worker, nested.attempt) == ("SEOAgent", None, None)
    assert after_nested.task_id == str(task.id)
    assert not any(hasattr(outside, name) for name in FIELDS)


def test_the_reapers_line_about_a_task_it_leaves_dead_is_an_error_with_its_fields(caplog):
    caplog.handler.addFilter(TaskFields())  # the filter settings.LOGGING gives its handler
    task_id = enqueue("EchoAgent", "echo", {}, trace_id="t-reaped", max_attempts=1).id
    claim_and_start("EchoAgent")
    with caplog.at_level(logging.WARNING, logger="task_queue.maintenance.reaper"):
        reaper.reap_expired_leases(now=timezone.now() + timedelta(hours=1))
    [line] = caplog.records
    assert (line.levelname, line.message) == ("ERROR", f"lease expired on task {task_id}: now dead")
    fields = {name: getattr(line, name) for name in FIELDS}
    assert fields == {
        "task_id": str(task_id),
        "trace_id": "t-reaped",
        "agent": "EchoAgent",
        "worker": OWNER,
        "attempt": 1,
    }

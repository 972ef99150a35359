"""Tracing without OpenTelemetry (issue 17, point 6): a ``traceparent`` header gives
its trace to the tasks of the request, and with no OTEL_* configured nothing of
OpenTelemetry is imported, however installed it is. The spans themselves:
tests/test_tracing_otel.py."""

from __future__ import annotations

import json
import uuid

import pytest

from task_queue import tracing
from task_queue.models import Task, Workflow
from task_queue.tracing import exporting
from tests.support.api import ECHO
from tests.support.processes import run_python_without_otel

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
HEADER = f"00-{TRACE}-00f067aa0ba902b7-01"


def test_traceparent_headers_are_parsed_and_invalid_ones_ignored():
    assert tracing.parse_traceparent(HEADER) == (TRACE, "00f067aa0ba902b7", "01")
    assert str(tracing.parse_traceparent(f" {HEADER} ")) == HEADER
    # A later version may add fields after the flags.
    assert tracing.parse_traceparent(f"01-{TRACE}-00f067aa0ba902b7-00-more").trace_id == TRACE
    for invalid in (
        None,
        "",
        "garbage",
        HEADER.upper(),
        f"ff-{TRACE}-00f067aa0ba902b7-01",  # version ff is invalid
        f"00-{TRACE}-00f067aa0ba902b7-01-more",  # version 00 has four fields
        f"00-{'0' * 32}-00f067aa0ba902b7-01",
        f"00-{TRACE}-{'0' * 16}-01",
        f"00-{TRACE[:-1]}-00f067aa0ba902b7-01",
    ):
        assert tracing.parse_traceparent(invalid) is None, invalid


def test_traces_are_asked_for_by_an_exporter_or_an_endpoint():
    assert not exporting.configured({})
    assert not exporting.configured({"OTEL_SERVICE_NAME": "x"})
    assert exporting.configured({"OTEL_TRACES_EXPORTER": "otlp"})
    assert exporting.configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert exporting.configured({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert not exporting.configured({"OTEL_TRACES_EXPORTER": "none"})
    assert not exporting.configured({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"})


@pytest.mark.django_db
def test_a_traceparent_header_gives_its_trace_to_the_tasks_naming_none(api):
    api.headers["traceparent"] = HEADER
    alone = api.post("/api/v1/tasks", ECHO).json()
    batch = api.post("/api/v1/tasks", [ECHO, {**ECHO, "trace_id": "mine"}]).json()["items"]

    assert alone["trace_id"] == batch[0]["trace_id"] == TRACE
    assert batch[1]["trace_id"] == "mine"
    # Tracing is off here: the header itself is kept as the tasks' parent.
    assert set(Task.objects.values_list("traceparent", flat=True)) == {HEADER}


@pytest.mark.django_db
def test_without_a_header_nothing_changes(api):
    created = api.post("/api/v1/tasks", ECHO).json()
    api.headers["traceparent"] = "not a traceparent"
    ignored = api.post("/api/v1/tasks", ECHO).json()
    assert created["trace_id"] == uuid.UUID(created["id"]).hex
    assert ignored["trace_id"] == uuid.UUID(ignored["id"]).hex
    assert set(Task.objects.values_list("traceparent", flat=True)) == {None}


@pytest.mark.django_db
def test_the_headers_trace_is_not_part_of_a_keyed_request(api):
    """A client retrying a keyed enqueue under another trace finds the first task."""
    keyed = {**ECHO, "idempotency_key": "k-traced"}
    api.headers["traceparent"] = HEADER
    first = api.post("/api/v1/tasks", keyed)
    api.headers["traceparent"] = f"00-{'1' * 32}-00f067aa0ba902b7-01"
    again = api.post("/api/v1/tasks", keyed)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["trace_id"] == TRACE


@pytest.mark.django_db
def test_a_workflow_created_under_a_traceparent_is_its_trace(api):
    api.headers["traceparent"] = HEADER
    created = api.post("/api/v1/workflows", {"name": "w", "tasks": [ECHO]}).json()
    named = api.post("/api/v1/workflows", {"name": "n", "trace_id": "wf-1", "tasks": [ECHO]})
    assert created["trace_id"] == TRACE
    assert Workflow.objects.get(id=named.json()["id"]).trace_id == "wf-1"
    assert set(Task.objects.values_list("trace_id", flat=True)) == {TRACE, "wf-1"}
    # A later step, under another request's trace, joins its workflow's.
    api.headers["traceparent"] = f"00-{'1' * 32}-00f067aa0ba902b7-01"
    step = api.post("/api/v1/tasks", {**ECHO, "workflow_id": named.json()["id"]}).json()
    assert step["trace_id"] == "wf-1"


# In a process of its own: the API takes a task under a traceparent and a worker runs
# it; then no opentelemetry module may be loaded.
NOTHING_IMPORTED = """
import json, sys
import django
django.setup()
from django.test import Client
from automechanica.api.tokens import create_token
from task_queue import tracing
from task_queue.models import Task
from task_queue.worker import Worker, WorkerConfig

token = create_token("no-otel", "write", ())[1]
response = Client().post(
    "/api/v1/tasks", {"agent_name": "EchoAgent", "task_type": "echo"},
    content_type="application/json",
    headers={"Authorization": "Bearer " + token, "traceparent": sys.argv[1]},
    HTTP_HOST="localhost",
)
task_id = response.json()["id"]
Worker(WorkerConfig(agents=["EchoAgent"], burst=True)).run()
print("seen:", json.dumps({
    "status": Task.objects.get(id=task_id).status,
    "hooks": type(tracing.active).__name__,
    "otel": sorted(name for name in sys.modules if name.startswith("opentelemetry")),
}))
"""


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_without_otel_configured_nothing_of_opentelemetry_is_imported():
    done = run_python_without_otel(NOTHING_IMPORTED, HEADER)
    assert done.returncode == 0, done.stderr
    [seen] = [json.loads(line[5:]) for line in done.stdout.splitlines() if line[:5] == "seen:"]
    assert seen == {"status": "completed", "hooks": "NoTracing", "otel": []}


def test_the_hooks_do_nothing_when_off():
    """What the worker calls per claim batch and per task, with tracing off."""
    hooks = tracing.NO_TRACING
    assert hooks.claim_began() == 0
    assert hooks.claimed([], 0, "w") is None
    assert hooks.task_started(None, "w") is None
    assert hooks.task_ended(None, None, None) is None
    with hooks.enqueue(3) as (trace, parent):
        assert (trace, parent) == (None, None)

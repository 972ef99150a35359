"""OpenTelemetry spans (issue 17, point 6): a request under a ``traceparent`` flows
through the queue into the agent as one trace, enqueue → claim and process.

The worker runs in this process (an in-memory exporter cannot be shared with a
subprocess), except in the last test, where a ``runworker`` subprocess configured by
OTEL_* alone prints its spans. Needs the ``otel`` extra (``uv sync --extra otel``,
as .ci/run does)."""

from __future__ import annotations

import hashlib
import json
import re
import uuid

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode

from task_queue import operations
from task_queue.models import Task, TaskStatus
from task_queue.tracing import exporting
from task_queue.tracing.otel import otel_trace_id, stand_in_root
from task_queue.worker import Worker, WorkerConfig
from tests.support.api import ECHO
from tests.support.processes import manage_env, run_manage, run_python_without_otel

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
HEADER = f"00-{TRACE}-{CALLER_SPAN}-01"


@pytest.fixture
def spans():
    """Tracing on in this process, into memory; off again after."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    assert exporting.setup(provider)
    exporter.provider = provider
    yield exporter
    exporting.disable()
    provider.shutdown()


def run_worker() -> Worker:
    """A worker in this process, until nothing is due."""
    worker = Worker(WorkerConfig(agents=["EchoAgent"], concurrency=4, burst=True))
    worker.run()
    return worker


def named(exporter: InMemorySpanExporter, prefix: str) -> list:
    return [span for span in exporter.get_finished_spans() if span.name.startswith(prefix)]


def hex_span(span_id: int) -> str:
    return f"{span_id:016x}"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_request_under_a_traceparent_flows_through_the_queue_into_the_agent(api, spans):
    api.headers["traceparent"] = HEADER
    created = api.post("/api/v1/tasks", {**ECHO, "payload": {"n": 1}}).json()
    worker = run_worker()

    task = Task.objects.get(id=created["id"])
    assert task.status == TaskStatus.COMPLETED
    assert task.trace_id == created["trace_id"] == TRACE
    [enqueue] = named(spans, "enqueue")
    assert enqueue.kind is SpanKind.PRODUCER
    assert f"{enqueue.context.trace_id:032x}" == TRACE
    assert hex_span(enqueue.parent.span_id) == CALLER_SPAN  # the caller's span
    assert task.traceparent == f"00-{TRACE}-{hex_span(enqueue.context.span_id)}-01"

    [claim] = named(spans, "claim EchoAgent")
    [process] = named(spans, "process EchoAgent")
    for span in (claim, process):
        assert f"{span.context.trace_id:032x}" == TRACE
        assert span.parent.span_id == enqueue.context.span_id
        assert span.kind is SpanKind.CONSUMER
        assert span.attributes["automechanica.task.id"] == created["id"]
        assert span.attributes["automechanica.task.agent"] == "EchoAgent"
        assert span.attributes["automechanica.task.type"] == "echo"
        assert span.attributes["automechanica.task.attempt"] == 1
        assert span.attributes["automechanica.worker"] == worker.id
    assert enqueue.end_time <= claim.start_time <= claim.end_time <= process.start_time
    assert process.attributes["automechanica.task.outcome"] == "completed"
    assert process.status.status_code is StatusCode.UNSET


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_failed_attempt_is_an_error_span_with_its_exception(api, spans):
    api.headers["traceparent"] = HEADER
    body = {**ECHO, "payload": {"fail": "transient"}, "max_attempts": 2}
    created = api.post("/api/v1/tasks", body).json()
    run_worker()  # the first attempt; the retry waits for its backoff

    assert Task.objects.get(id=created["id"]).status == TaskStatus.PENDING
    [process] = named(spans, "process EchoAgent")
    assert process.status.status_code is StatusCode.ERROR
    assert process.attributes["automechanica.task.outcome"] == "failed"
    assert process.attributes["automechanica.task.retryable"] is True
    [event] = process.events
    assert event.name == "exception"
    assert "Traceback" in event.attributes["exception.stacktrace"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_tasks_whose_trace_no_enqueue_span_is_in_link_to_it(spans):
    """Without a traceparent the enqueue span starts a trace of its own, while each
    task's trace is its id (or its workflow's): their spans share a stand-in root in
    the task's trace and link to the enqueue span. A trace id that is not 32 hex
    digits is hashed into one. A task enqueued with tracing off has no link."""
    exporting.disable()
    untraced = operations.enqueue("EchoAgent", "echo").id
    exporting.setup(spans.provider)
    alone = operations.enqueue("EchoAgent", "echo").id
    named_trace = operations.enqueue("EchoAgent", "echo", trace_id="wf-run-1").id
    run_worker()

    [process] = [
        span
        for span in named(spans, "process")
        if span.attributes["automechanica.task.id"] == str(untraced)
    ]
    assert process.context.trace_id == uuid.UUID(str(untraced)).int
    assert process.parent.span_id == stand_in_root(process.context.trace_id)
    assert process.links == ()

    [first, second] = named(spans, "enqueue")
    for task_id, enqueue, trace in (
        (alone, first, uuid.UUID(str(alone)).int),
        (named_trace, second, otel_trace_id("wf-run-1", None)),
    ):
        [process] = [
            span
            for span in named(spans, "process")
            if span.attributes["automechanica.task.id"] == str(task_id)
        ]
        assert process.context.trace_id == trace != enqueue.context.trace_id
        assert process.parent.span_id == stand_in_root(trace)
        assert [link.context.span_id for link in process.links] == [enqueue.context.span_id]
        assert process.attributes["automechanica.trace_id"] == Task.objects.get(id=task_id).trace_id
    hashed = hashlib.sha256(b"wf-run-1").hexdigest()[:32]
    assert f"{otel_trace_id('wf-run-1', None):032x}" == hashed


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_process_configured_by_otel_variables_exports_its_spans(api):
    """Tracing chosen from the environment alone: OTEL_TRACES_EXPORTER=console prints
    the spans of a ``runworker`` subprocess, in the trace the request's header named
    (this process, with tracing off, kept the header as the task's parent)."""
    api.headers["traceparent"] = HEADER
    created = api.post("/api/v1/tasks", ECHO).json()
    env = manage_env() | {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "w-test"}
    done = run_manage("runworker", "EchoAgent", "--burst", env=env)
    assert done.returncode == 0, done.stderr

    assert Task.objects.get(id=created["id"]).status == TaskStatus.COMPLETED
    printed = [json.loads(text) for text in re.findall(r"^\{\n.*?^\}$", done.stdout, re.S | re.M)]
    by_name = {span["name"]: span for span in printed}
    process = by_name["process EchoAgent"]
    assert process["context"]["trace_id"] == f"0x{TRACE}"
    assert process["parent_id"] == f"0x{CALLER_SPAN}"
    assert process["resource"]["attributes"]["service.name"] == "w-test"
    assert by_name["claim EchoAgent"]["parent_id"] == f"0x{CALLER_SPAN}"


# A process whose own code installed a TracerProvider before Django loaded the apps.
PROVIDER_FIRST = """
import django
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

provider = TracerProvider()
trace.set_tracer_provider(provider)
django.setup()
from task_queue import tracing

print("hooks:", type(tracing.active).__name__, tracing.active.provider is provider)
"""


def test_a_tracer_provider_installed_first_turns_tracing_on():
    done = run_python_without_otel(PROVIDER_FIRST)
    assert done.returncode == 0, done.stderr
    assert "hooks: OtelTracing True" in done.stdout.splitlines()

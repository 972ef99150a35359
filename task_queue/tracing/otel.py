"""The hooks of ``task_queue.tracing`` with OpenTelemetry on: imported only by
``tracing.exporting.setup`` when the environment asks for traces (docs/tracing.md).

Each task's spans belong to the OpenTelemetry trace of its ``trace_id``: the id
itself when it is 32 lowercase hex digits (a W3C trace-id, as generated ones are),
else the first 32 hex digits of its SHA-256 (the original is the attribute
``automechanica.trace_id``). Their parent is the enqueue span stored with the task
(``tasks.traceparent``) when that span is in the same trace; otherwise a span id
derived from the trace id stands in for the trace's root (every task of the trace
shares it, so a workflow's tasks are siblings in one trace) and the spans link to
the enqueue span, if there was one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import entry_points
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

from task_queue.execution import Outcome, OutcomeKind, StopReason
from task_queue.sql.leasing import ClaimedTask
from task_queue.tracing import (
    NoTracing,
    Traceparent,
    enqueuers_trace,
    incoming_parent,
    parse_traceparent,
)

logger = logging.getLogger(__name__)

SCOPE = "automechanica.task_queue"
SYSTEM = "automechanica"
DEFAULT_SERVICE_NAME = "automechanica"
_W3C_TRACE_ID = re.compile(r"[0-9a-f]{32}")
# Stops that cut an attempt short without an outcome of its own, and are errors.
_ERROR_STOPS = {StopReason.TIMED_OUT, StopReason.LEASE_LOST}


def otel_trace_id(trace_id: str | None, task_id: Any) -> int:
    """The OpenTelemetry trace of a task's ``trace_id`` (a row written before trace
    ids has none: its task id, as a generated one would be)."""
    if trace_id is None:
        return task_id.int
    if _W3C_TRACE_ID.fullmatch(trace_id) and trace_id != "0" * 32:
        return int(trace_id, 16)
    return int(hashlib.sha256(trace_id.encode()).hexdigest()[:32], 16)


def stand_in_root(trace_id: int) -> int:
    """The span id that stands for the root of a trace no enqueue span is in."""
    digest = hashlib.sha256(b"root:" + trace_id.to_bytes(16, "big")).digest()
    return int.from_bytes(digest[:8], "big") or 1


def _context_of(parent: Traceparent) -> SpanContext:
    return SpanContext(
        int(parent.trace_id, 16),
        int(parent.span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(int(parent.flags, 16)),
    )


def _traceparent(context: SpanContext) -> str:
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def provider_from_environment() -> Any:
    """The process's TracerProvider: one installed already (``opentelemetry-instrument``,
    a deployment's own code), else one built from the OTEL_* variables and installed."""
    current = trace.get_tracer_provider()
    if not isinstance(current, trace.ProxyTracerProvider):
        return current
    resource = Resource.create()
    if resource.attributes.get("service.name", "").startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource)  # the sampler: OTEL_TRACES_SAMPLER
    names = os.environ.get("OTEL_TRACES_EXPORTER", "").strip() or "otlp"
    for name in (n.strip() for n in names.split(",") if n.strip()):
        found = entry_points(group="opentelemetry_traces_exporter", name=name)
        if not found and name == "otlp":  # the extra ships OTLP over HTTP
            found = entry_points(group="opentelemetry_traces_exporter", name="otlp_proto_http")
        if not found:
            logger.warning("unknown OTEL_TRACES_EXPORTER %r: no spans exported there", name)
            continue
        provider.add_span_processor(BatchSpanProcessor(next(iter(found)).load()()))
    trace.set_tracer_provider(provider)
    return provider


Hook = TypeVar("Hook", bound=Callable[..., Any])


def _guarded(hook: Hook) -> Hook:
    """A hook that fails logs why and returns None: tracing never stops a worker or
    its handler threads."""

    @functools.wraps(hook)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return hook(*args, **kwargs)
        except Exception:
            logger.exception("the tracing hook %s failed", hook.__name__)
            return None

    return guarded  # type: ignore[return-value]


class OtelTracing(NoTracing):
    """Spans: ``enqueue`` (producer), and per task ``claim AGENT`` and ``process AGENT``
    (consumer), with the messaging attributes and the task's own."""

    def __init__(self, provider: Any = None) -> None:
        self.provider = provider if provider is not None else provider_from_environment()
        self.tracer = self.provider.get_tracer(SCOPE)

    @contextmanager
    def enqueue(self, count: int) -> Iterator[tuple[str | None, str]]:
        """A child of the caller's span (the request's ``traceparent``, else the span
        current on this thread, else a new trace's root)."""
        parent, context = incoming_parent(), None
        if parent is not None:
            context = trace.set_span_in_context(NonRecordingSpan(_context_of(parent)))
        attributes = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.batch.message_count": count,
        }
        with self.tracer.start_as_current_span(
            "enqueue", context=context, kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            yield enqueuers_trace(parent), _traceparent(span.get_span_context())

    def claim_began(self) -> int:
        return time.time_ns()

    @_guarded
    def claimed(self, tasks: list[ClaimedTask], began: int, worker: str) -> None:
        """One span per task, over the claim statement that leased it (one statement
        leases the batch): the gap before it in the trace is the task's wait."""
        ended = time.time_ns()
        for task in tasks:
            context, links = _parent_of(task)
            self.tracer.start_span(
                f"claim {task.agent_name}",
                context=context,
                kind=SpanKind.CONSUMER,
                links=links,
                attributes=_attributes(task, worker, "receive"),
                start_time=began,
            ).end(end_time=ended)

    @_guarded
    def task_started(self, task: ClaimedTask, worker: str) -> tuple[Span, object]:
        """The ``process`` span, current on the handler's thread while it runs (so
        the agent's own spans, and what it enqueues, are its children)."""
        context, links = _parent_of(task)
        span = self.tracer.start_span(
            f"process {task.agent_name}",
            context=context,
            kind=SpanKind.CONSUMER,
            links=links,
            attributes=_attributes(task, worker, "process"),
        )
        return span, otel_context.attach(trace.set_span_in_context(span))

    @_guarded
    def task_ended(
        self, started: Any, outcome: Outcome | None, stop_reason: StopReason | None
    ) -> None:
        if started is None:  # task_started failed
            return
        span, token = started
        try:
            if outcome is not None:
                _record_outcome(span, outcome)
            elif stop_reason is not None:
                span.set_attribute("automechanica.task.outcome", "stopped")
                span.set_attribute("automechanica.task.stop_reason", stop_reason.value)
                if stop_reason in _ERROR_STOPS:
                    span.set_status(Status(StatusCode.ERROR, stop_reason.value))
        finally:
            otel_context.detach(token)
            span.end()


def _parent_of(task: ClaimedTask) -> tuple[Any, list[Link]]:
    """The context a task's spans start in, and their links (module docstring)."""
    trace_id = otel_trace_id(task.trace_id, task.id)
    enqueued = parse_traceparent(task.traceparent)
    if enqueued is not None and int(enqueued.trace_id, 16) == trace_id:
        return trace.set_span_in_context(NonRecordingSpan(_context_of(enqueued))), []
    flags = TraceFlags(TraceFlags.SAMPLED if enqueued is None else int(enqueued.flags, 16))
    root = SpanContext(trace_id, stand_in_root(trace_id), is_remote=True, trace_flags=flags)
    links = [] if enqueued is None else [Link(_context_of(enqueued))]
    return trace.set_span_in_context(NonRecordingSpan(root)), links


def _attributes(task: ClaimedTask, worker: str, operation: str) -> dict[str, Any]:
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.type": operation,
        "messaging.destination.name": task.agent_name,
        "messaging.message.id": str(task.id),
        "automechanica.task.id": str(task.id),
        "automechanica.task.agent": task.agent_name,
        "automechanica.task.type": task.task_type,
        "automechanica.task.attempt": task.attempts + 1,
        "automechanica.task.max_attempts": task.max_attempts,
        "automechanica.worker": worker,
        "automechanica.trace_id": task.trace_id or task.id.hex,
    }


def _record_outcome(span: Span, outcome: Outcome) -> None:
    span.set_attribute("automechanica.task.outcome", outcome.kind.value)
    if outcome.kind is not OutcomeKind.FAILED:
        return
    error = json.loads(outcome.error_json)
    span.set_attribute("automechanica.task.retryable", outcome.retryable)
    span.add_event(
        "exception",
        {
            "exception.type": error["type"],
            "exception.message": error["message"],
            "exception.stacktrace": error["traceback"],
        },
    )
    span.set_status(Status(StatusCode.ERROR, f"{error['type']}: {error['message']}"))

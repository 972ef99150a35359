"""OpenTelemetry spans for enqueue, claim and execution, optional (docs/tracing.md).

The queue calls the hooks of :data:`active` at four places: around an enqueue
(``operations.enqueue_many``), around a worker's claim statement, and before and after
each handler. Until ``exporting.setup`` finds OpenTelemetry installed and configured,
they are :class:`NoTracing`'s: no span, no ``opentelemetry`` import, a method call
that returns at once (per claim batch and per task). ``exporting.setup`` runs once per
process, when the queue app is ready, and swaps in ``task_queue.tracing.otel``'s hooks.

W3C ``traceparent`` headers are read here, without OpenTelemetry: a request that
carries one gives its trace to the tasks that name none, whether or not this process
exports spans.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, NamedTuple

from task_queue import task_logging

if TYPE_CHECKING:
    from task_queue.execution import Outcome, StopReason
    from task_queue.sql.leasing import ClaimedTask

logger = logging.getLogger(__name__)

# version-trace_id-span_id-flags; a later version may append fields after the flags.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


class Traceparent(NamedTuple):
    """A W3C trace context: the span a request (or an enqueue) was made under."""

    trace_id: str  # 32 lowercase hex digits
    span_id: str  # 16 lowercase hex digits
    flags: str  # 2 hex digits; 01: sampled

    def __str__(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"


def parse_traceparent(header: str | None) -> Traceparent | None:
    """The header's trace context, or None when it is absent or invalid (the W3C
    recommendation: an invalid ``traceparent`` is ignored, not refused)."""
    if not header:
        return None
    match = _TRACEPARENT.fullmatch(header.strip())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == _ZERO_TRACE:
        return None
    if span_id == _ZERO_SPAN:
        return None
    return Traceparent(trace_id, span_id, flags)


# The trace context of the request being served (its traceparent header), if any.
_incoming: ContextVar[Traceparent | None] = ContextVar("incoming_trace", default=None)


@contextmanager
def incoming(header: str | None) -> Iterator[Traceparent | None]:
    """Serve a request with this ``traceparent`` header: enqueues in the block are
    its children, and their tasks that name no trace take its trace. Yields the
    parsed header (None: absent or invalid)."""
    parent = parse_traceparent(header)
    token = _incoming.set(parent)
    try:
        yield parent
    finally:
        _incoming.reset(token)


def incoming_parent() -> Traceparent | None:
    """The trace context of the request this thread serves (:func:`incoming`)."""
    return _incoming.get()


_NO_PARENT = nullcontext((None, None))


def enqueuers_trace(parent: Traceparent | None) -> str | None:
    """The trace of tasks enqueued naming none: the request's (its ``traceparent``),
    else that of the task running on this thread (a handler enqueuing more work)."""
    return parent.trace_id if parent is not None else task_logging.current_trace_id()


class NoTracing:
    """The hooks with OpenTelemetry off: nothing recorded, nothing imported."""

    def enqueue(self, count: int) -> AbstractContextManager[tuple[str | None, str | None]]:
        """Around an enqueue of ``count`` tasks. Yields the trace of the tasks that
        name none (:func:`enqueuers_trace`) and the trace context to store with them
        (``tasks.traceparent``): here the request's, as it came."""
        parent = _incoming.get()
        if parent is None and task_logging.current_trace_id() is None:
            return _NO_PARENT
        return nullcontext((enqueuers_trace(parent), parent and str(parent)))

    def claim_began(self) -> int:
        """Before a claim statement: its start time for :meth:`claimed`."""
        return 0

    def claimed(self, tasks: list[ClaimedTask], began: int, worker: str) -> None:
        """After a claim statement that leased ``tasks``."""

    def task_started(self, task: ClaimedTask, worker: str) -> Any:
        """Before the handler runs, on its thread; the result goes to :meth:`task_ended`."""
        return None

    def task_ended(
        self, started: Any, outcome: Outcome | None, stop_reason: StopReason | None
    ) -> None:
        """After the handler, on its thread: the outcome this attempt wrote (None when
        it wrote none: stopped, or its timeout's outcome was written instead)."""


NO_TRACING = NoTracing()
# The hooks in effect: NO_TRACING until exporting.setup() enables OpenTelemetry.
active: NoTracing = NO_TRACING

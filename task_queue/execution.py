"""Running one task's handler and turning what happened into an outcome.

No database here: the worker hands a leased task in and gets an :class:`Outcome`
back, which the outcome writer records in batches.
"""

from __future__ import annotations

import json
import threading
import time
import traceback
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from task_queue.sql.leasing import ClaimedTask

from . import blobs
from .agent import Agent, PermanentError, TaskCancelled, TaskContext
from .blobs import PayloadBlobError, PayloadBlobUnavailable
from .storable import diagnostic_text, storable_json

# How much of a handler's diagnostics a task keeps: its error_info is copied into the
# task's history and its event, and its summary into agent memory, so an exception
# carrying megabytes (a whole response body, say) would be stored several times over.
ERROR_MESSAGE_MAX_CHARS = 4_000
TRACEBACK_MAX_CHARS = 16_000
SUMMARY_MAX_CHARS = 4_000


class OutcomeKind(Enum):
    COMPLETED = "completed"
    FAILED = "failed"  # retried, dead or failed: the SQL decides from the attempt count
    CANCELLED = "cancelled"


class StopReason(Enum):
    CANCEL_REQUESTED = "cancel requested"
    TIMED_OUT = "timed out"
    LEASE_LOST = "lease lost"
    SHUTDOWN = "worker shutting down"


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: OutcomeKind
    task: ClaimedTask
    result_json: str | None = None  # None: the result is the blob result_ref
    summary: str = ""
    result_ref: str | None = None
    result_blob: bytes = b""  # its bytes, which the writer keeps under the blob's lock
    retryable: bool = False
    base_delay: float = 0.0
    error_json: str = ""


class TaskTimeout(Exception):
    """The handler ran past its agent's timeout."""


@dataclass
class InFlight:
    """A task this worker holds, from its claim until its outcome is recorded."""

    task: ClaimedTask
    agent: Agent
    deadline: float  # time.monotonic() after which the attempt times out
    cancelled: threading.Event = field(default_factory=threading.Event)
    stop_reason: StopReason | None = None
    context: TaskContext | None = None  # what the handler sees, once it runs
    progress_written: tuple[float, str] | None = None  # the last report the heartbeat wrote
    _settled: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def held(self) -> tuple:
        return (self.task.id, self.task.lease_token)

    @property
    def settled(self) -> bool:
        return self._settled

    def unwritten_progress(self) -> tuple[float, str] | None:
        """The handler's latest progress report if the heartbeat has not written it."""
        reported = self.context.reported_progress if self.context is not None else None
        return None if reported is self.progress_written else reported

    def stop(self, reason: StopReason) -> None:
        """Ask the handler to stop (it sees ``cancelled`` set)."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self.cancelled.set()

    def settle(self) -> bool:
        """Claim the right to report this task's outcome; only the first caller gets it.

        A task can end three ways at once (its handler returns, its timeout fires,
        its lease is lost); exactly one of them may write.
        """
        with self._lock:
            if self._settled:
                return False
            self._settled = True
            return True


def run_handler(flight: InFlight) -> Outcome | None:
    """Run the agent on the task; None when the task was stopped for a reason that
    writes no outcome of its own (lease lost, shutdown, or a timeout already recorded)."""
    task, agent = flight.task, flight.agent
    try:
        payload = blobs.payload_of(task.payload, task.payload_ref)
    except PayloadBlobError as error:
        # The task fails with the reason (retried if the storage may come back); the
        # worker goes on.
        retryable = isinstance(error, PayloadBlobUnavailable)
        return failure(task, error, retryable=retryable, base_delay=agent.base_delay)
    context = TaskContext(
        id=task.id,
        agent_name=task.agent_name,
        task_type=task.task_type,
        payload=payload,
        attempt=task.attempts,
        max_attempts=task.max_attempts,
        workflow_id=task.workflow_id,
        trace_id=task.trace_id,
        cancelled=flight.cancelled,
    )
    flight.context = context
    try:
        if task.task_type not in agent.task_types:
            raise PermanentError(
                f"{agent.name} does not handle task type {task.task_type!r}; "
                f"it handles {', '.join(agent.task_types)}"
            )
        result = agent.handle(context)
        result_json = _result_json(result)
        summary = diagnostic_text(agent.describe(context, result), SUMMARY_MAX_CHARS)
    except TaskCancelled:
        return _stopped(flight)
    except Exception as error:
        if flight.stop_reason is not None:
            return _stopped(flight)
        return failure(
            task, error, retryable=agent.is_retryable(error), base_delay=agent.base_delay
        )
    if flight.stop_reason is StopReason.CANCEL_REQUESTED:
        return Outcome(OutcomeKind.CANCELLED, task)
    return _completed(flight, result_json, summary)


def _result_json(result: Any) -> str:
    """The result as JSON the queue stores; a permanent failure if it cannot be (so a
    result over QUEUE_MAX_PAYLOAD_BYTES fails its task, "result too large"). The worker
    protocol over HTTP refuses such a result instead, with the same checks
    (``task_queue.remote``)."""
    try:
        return blobs.check_size(storable_json(result))
    except blobs.TooLarge as error:
        raise PermanentError(f"result too large: {error}") from None
    except ValueError as error:
        raise PermanentError(f"the result {error}") from error


def _completed(flight: InFlight, result_json: str, summary: str) -> Outcome:
    return completion(flight.task, result_json, summary, base_delay=flight.agent.base_delay)


def completion(task: ClaimedTask, result_json: str, summary: str, *, base_delay: float) -> Outcome:
    """The completion of ``task``; a result over the blob threshold is written to its
    blob here, off the outcome writer's thread (which only checks it is there, under
    its lock). A blob that cannot be written fails the attempt, to be retried."""
    data = result_json.encode()
    if not blobs.needs_blob(data):
        return Outcome(OutcomeKind.COMPLETED, task, result_json=result_json, summary=summary)
    try:
        ref = blobs.put(data)
    except OSError as error:
        unavailable = PayloadBlobUnavailable(f"the result's blob could not be written: {error}")
        return failure(task, unavailable, retryable=True, base_delay=base_delay)
    return Outcome(OutcomeKind.COMPLETED, task, summary=summary, result_ref=ref, result_blob=data)


def _stopped(flight: InFlight) -> Outcome | None:
    if flight.stop_reason is StopReason.CANCEL_REQUESTED:
        return Outcome(OutcomeKind.CANCELLED, flight.task)
    if flight.stop_reason is None:
        # The handler raised TaskCancelled on its own: a failure like any other.
        error = TaskCancelled("handler raised TaskCancelled")
        return failure(flight.task, error, retryable=True, base_delay=flight.agent.base_delay)
    return None


def timed_out(flight: InFlight) -> Outcome:
    error = TaskTimeout(f"handler ran longer than {flight.agent.timeout:g} s")
    return failure(flight.task, error, retryable=True, base_delay=flight.agent.base_delay)


def failure(
    task: ClaimedTask, error: BaseException, *, retryable: bool, base_delay: float
) -> Outcome:
    trace = "".join(traceback.format_exception(error))
    return reported_failure(
        task, type(error).__name__, str(error), trace, retryable=retryable, base_delay=base_delay
    )


def reported_failure(
    task: ClaimedTask,
    error_type: str,
    message: str,
    trace: str | None,
    *,
    retryable: bool,
    base_delay: float,
) -> Outcome:
    """A failed attempt as an error's type, message and traceback (a handler's, or what
    a remote worker reported), its message and traceback cut to size."""
    info: dict[str, Any] = {
        "type": error_type,
        "message": diagnostic_text(message, ERROR_MESSAGE_MAX_CHARS),
        "traceback": diagnostic_text(trace or "", TRACEBACK_MAX_CHARS),
        "retryable": retryable,
    }
    return Outcome(
        OutcomeKind.FAILED,
        task,
        retryable=retryable,
        base_delay=base_delay,
        error_json=json.dumps(info, default=str),
    )


def unrecordable(outcome: Outcome, error: Exception) -> Outcome:
    """What to write when the database refused ``outcome``: a non-retryable failure
    that says why. A failure refused in turn is returned as is (nothing more to try)."""
    if outcome.kind is OutcomeKind.FAILED and not outcome.retryable:
        return outcome
    reason = PermanentError(f"the database refused this task's outcome: {error}")
    return failure(outcome.task, reason, retryable=False, base_delay=0.0)


def deadline_for(agent: Agent) -> float:
    return time.monotonic() + agent.timeout

"""Running one task's handler and turning what happened into an outcome
(task_queue/execution.py), without a database: plain agents, a hand-made claimed task.

No test here uses the database (pytest-django refuses any query from a test not
marked ``django_db``), so these pass where no PostgreSQL runs.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import pytest

from task_queue import blobs
from task_queue.agent import Agent, InvalidPayload, PermanentError, TaskCancelled, TaskContext
from task_queue.blobs import PayloadBlobUnavailable
from task_queue.execution import (
    ERROR_MESSAGE_MAX_CHARS,
    SUMMARY_MAX_CHARS,
    TRACEBACK_MAX_CHARS,
    ClaimedTask,
    InFlight,
    Outcome,
    OutcomeKind,
    StopReason,
    deadline_for,
    failure,
    run_handler,
    timed_out,
    unrecordable,
)
from task_queue.storable import storable_json

WORKFLOW = uuid.uuid4()


def claimed(task_type: str = "work", payload: Any = None, **fields: Any) -> ClaimedTask:
    """A task as the worker holds it after its claim."""
    values = {
        "id": uuid.uuid4(),
        "agent_name": "Test",
        "task_type": task_type,
        "payload": {"n": 1} if payload is None else payload,
        "attempts": 1,
        "max_attempts": 3,
        "workflow_id": WORKFLOW,
        "trace_id": "trace-1",
        "lease_token": uuid.uuid4(),
        "payload_ref": None,
        "traceparent": None,
        **fields,
    }
    return ClaimedTask(**values)


def flight(agent: Agent, task: ClaimedTask | None = None) -> InFlight:
    task = task or claimed()
    return InFlight(task=task, agent=agent, deadline=deadline_for(agent))


def error_of(outcome: Outcome) -> dict[str, Any]:
    assert outcome.kind is OutcomeKind.FAILED
    return json.loads(outcome.error_json)


class Returns(Agent):
    """Returns what its class says, and keeps the context it was given."""

    name = "Test"
    task_types = ("work", "other")
    base_delay = 7.0
    result: Any = {"ok": True}

    def handle(self, task: TaskContext) -> Any:
        self.seen = task
        return self.result


class Raises(Agent):
    name = "Test"
    task_types = ("work",)
    base_delay = 2.5
    error: BaseException = ValueError("boom")

    def handle(self, task: TaskContext) -> dict[str, Any]:
        raise self.error


class Waits(Agent):
    """Sleeps cooperatively until stopped; then does what ``after_stop`` says."""

    name = "Test"
    task_types = ("work",)
    timeout = 0.5
    after_stop = "raise TaskCancelled"

    def __init__(self) -> None:
        self.waiting = threading.Event()

    def handle(self, task: TaskContext) -> dict[str, Any]:
        self.waiting.set()
        if self.after_stop == "raise TaskCancelled":
            task.sleep(60)  # raises TaskCancelled once stopped
        task.cancelled.wait(60)
        if self.after_stop == "raise another error":
            raise RuntimeError("interrupted half-way")
        return {"finished": "anyway"}


def run_until_stopped(agent: Waits, reason: StopReason) -> tuple[Outcome | None, InFlight]:
    """Run the handler on a thread, as the worker does, and stop it once it waits."""
    held = flight(agent)
    result: list[Outcome | None] = []
    thread = threading.Thread(target=lambda: result.append(run_handler(held)))
    thread.start()
    assert agent.waiting.wait(10), "the handler did not start"
    held.stop(reason)
    thread.join(10)
    assert not thread.is_alive(), "the handler did not stop"
    return result[0], held


# ------------------------------------------------------------------ success


def test_success_completes_with_the_result_and_the_agents_summary():
    agent = Returns()
    task = claimed(payload={"sku": "BRK-1"})
    outcome = run_handler(flight(agent, task))
    assert outcome == Outcome(
        OutcomeKind.COMPLETED,
        task,
        result_json='{"ok": true}',
        summary="Test completed work: {'ok': True}",
    )


def test_the_handler_sees_its_task_and_the_flights_cancellation_flag():
    agent = Returns()
    task = claimed("other", payload={"sku": "BRK-1"}, attempts=2, max_attempts=5)
    held = flight(agent, task)
    run_handler(held)
    seen = agent.seen
    assert (seen.id, seen.agent_name, seen.task_type, seen.payload) == (
        task.id,
        "Test",
        "other",
        {"sku": "BRK-1"},
    )
    assert (seen.attempt, seen.max_attempts) == (2, 5)
    assert (seen.workflow_id, seen.trace_id) == (WORKFLOW, "trace-1")
    assert seen.cancelled is held.cancelled


def test_a_nul_in_the_summary_is_replaced_not_refused():
    class NulSummary(Returns):
        def describe(self, task: TaskContext, result: dict[str, Any]) -> str:
            return "done\x00"

    outcome = run_handler(flight(NulSummary()))
    assert outcome.kind is OutcomeKind.COMPLETED and outcome.summary == "done\ufffd"


def test_a_summary_is_cut_and_made_storable():
    class LongSummary(Returns):
        def describe(self, task: TaskContext, result: dict[str, Any]) -> str:
            return "start \ud800" + "x" * 1_000_000 + " end"

    summary = run_handler(flight(LongSummary())).summary
    assert len(summary) <= SUMMARY_MAX_CHARS
    assert summary.startswith("start ?x") and summary.endswith("x end")
    assert "characters cut" in summary
    summary.encode("utf-8")  # what psycopg does before PostgreSQL sees it


def test_a_payload_kept_in_a_blob_is_read_for_the_handler(monkeypatch):
    ref = "sha256-" + "a" * 64
    monkeypatch.setattr(blobs, "get", lambda wanted: b'{"big": [1, 2]}' if wanted == ref else b"{}")
    agent = Returns()
    outcome = run_handler(flight(agent, claimed(payload={}, payload_ref=ref)))
    assert outcome.kind is OutcomeKind.COMPLETED
    assert agent.seen.payload == {"big": [1, 2]}


# ------------------------------------------------------------------ errors


def test_an_ordinary_error_is_a_retryable_failure_with_the_agents_delay():
    task = claimed()
    outcome = run_handler(flight(Raises(), task))
    assert (outcome.kind, outcome.task, outcome.retryable, outcome.base_delay) == (
        OutcomeKind.FAILED,
        task,
        True,
        2.5,
    )
    error = error_of(outcome)
    assert (error["type"], error["message"], error["retryable"]) == ("ValueError", "boom", True)
    assert error["traceback"].startswith("Traceback (most recent call last):")
    assert error["traceback"].rstrip().endswith("ValueError: boom")
    assert "raise self.error" in error["traceback"]


@pytest.mark.parametrize(
    "raised",
    [PermanentError("never"), InvalidPayload("sku", "is required")],
    ids=["PermanentError", "InvalidPayload"],
)
def test_a_permanent_error_fails_without_retry(raised):
    agent = Raises()
    agent.error = raised
    outcome = run_handler(flight(agent))
    assert outcome.kind is OutcomeKind.FAILED and outcome.retryable is False
    error = error_of(outcome)
    assert (error["type"], error["message"], error["retryable"]) == (
        type(raised).__name__,
        str(raised),
        False,
    )


def test_only_the_agents_retryable_errors_are_retried():
    class OnlyConnections(Raises):
        retryable_errors = (ConnectionError,)

    agent = OnlyConnections()
    agent.error = ConnectionResetError("reset")  # a ConnectionError
    assert run_handler(flight(agent)).retryable is True
    agent.error = KeyError("sku")
    outcome = run_handler(flight(agent))
    assert outcome.retryable is False and error_of(outcome)["type"] == "KeyError"


def test_a_task_type_the_agent_does_not_handle_fails_for_good_without_running():
    agent = Returns()
    outcome = run_handler(flight(agent, claimed("unknown")))
    assert outcome.retryable is False
    assert error_of(outcome)["message"] == (
        "Test does not handle task type 'unknown'; it handles work, other"
    )
    assert not hasattr(agent, "seen")


def test_a_handler_raising_task_cancelled_on_its_own_is_a_retryable_failure():
    agent = Raises()
    agent.error = TaskCancelled("not asked to")
    outcome = run_handler(flight(agent))
    assert outcome.retryable is True and outcome.base_delay == 2.5
    error = error_of(outcome)
    assert (error["type"], error["message"]) == ("TaskCancelled", "handler raised TaskCancelled")


def test_error_text_that_postgresql_cannot_store_is_cleaned():
    agent = Raises()
    agent.error = ValueError("bad\x00byte \ud800")
    error = error_of(run_handler(flight(agent)))
    assert error["message"] == "bad\ufffdbyte ?" and "\x00" not in error["traceback"]
    assert storable_json(error)  # no NUL, no unpaired surrogate: jsonb takes it


def test_an_error_carrying_megabytes_is_kept_as_its_head_and_tail():
    agent = Raises()
    agent.error = ValueError("head " + "x" * 5_000_000 + " tail")
    outcome = run_handler(flight(agent))
    error = error_of(outcome)
    assert len(error["message"]) <= ERROR_MESSAGE_MAX_CHARS
    assert error["message"].startswith("head x") and error["message"].endswith("x tail")
    assert len(error["traceback"]) <= TRACEBACK_MAX_CHARS
    assert error["traceback"].startswith("Traceback (most recent call last):")
    assert error["traceback"].rstrip().endswith("x tail")
    assert "characters cut" in error["message"] and "characters cut" in error["traceback"]
    assert len(outcome.error_json) < 25_000


# ------------------------------------------------------------------ invalid results


@pytest.mark.parametrize(
    ("result", "reason"),
    [
        ({"when": object()}, "is not JSON-serialisable"),
        ({"ratio": float("nan")}, "is not JSON-serialisable"),
        ({"text": "nul\x00here"}, "contains a NUL character, which PostgreSQL cannot store"),
        ({"text": "half \ud800 a pair"}, "contains an unpaired surrogate"),
    ],
    ids=["object", "nan", "nul", "surrogate"],
)
def test_a_result_postgresql_cannot_store_fails_the_task_for_good(result, reason):
    class BadResult(Returns):
        pass

    BadResult.result = result
    outcome = run_handler(flight(BadResult()))
    assert outcome.retryable is False
    error = error_of(outcome)
    assert error["type"] == "PermanentError"
    assert error["message"].startswith(f"the result {reason}")


# ------------------------------------------------------------------ payload blobs


def test_a_missing_payload_blob_fails_for_good_without_running_the_handler():
    agent = Returns()
    outcome = run_handler(flight(agent, claimed(payload={}, payload_ref="sha256-nothex")))
    assert outcome.retryable is False and outcome.base_delay == Returns.base_delay
    assert error_of(outcome)["type"] == "PayloadBlobMissing"
    assert not hasattr(agent, "seen")


def test_an_unavailable_payload_store_is_a_retryable_failure(monkeypatch):
    def unavailable(ref: str) -> bytes:
        raise PayloadBlobUnavailable(f"payload blob {ref} could not be read: permission denied")

    monkeypatch.setattr(blobs, "get", unavailable)
    agent = Returns()
    outcome = run_handler(flight(agent, claimed(payload={}, payload_ref="sha256-" + "b" * 64)))
    assert outcome.retryable is True and outcome.base_delay == 7.0
    assert error_of(outcome)["type"] == "PayloadBlobUnavailable"
    assert not hasattr(agent, "seen")


# ------------------------------------------------------------------ cancellation


def test_a_cancel_request_stops_a_waiting_handler_and_cancels_the_task():
    outcome, held = run_until_stopped(Waits(), StopReason.CANCEL_REQUESTED)
    assert outcome == Outcome(OutcomeKind.CANCELLED, held.task)


@pytest.mark.parametrize("after_stop", ["raise another error", "return a result"])
def test_a_cancel_request_wins_over_what_the_handler_does_next(after_stop):
    agent = Waits()
    agent.after_stop = after_stop
    outcome, held = run_until_stopped(agent, StopReason.CANCEL_REQUESTED)
    assert outcome == Outcome(OutcomeKind.CANCELLED, held.task)


@pytest.mark.parametrize("reason", [StopReason.LEASE_LOST, StopReason.SHUTDOWN])
@pytest.mark.parametrize("after_stop", ["raise TaskCancelled", "raise another error"])
def test_a_lost_lease_or_a_shutdown_writes_no_outcome(reason, after_stop):
    """The task is someone else's (lease lost), or goes back to the queue (shutdown):
    this worker must not record anything for it."""
    agent = Waits()
    agent.after_stop = after_stop
    outcome, _ = run_until_stopped(agent, reason)
    assert outcome is None


def test_the_first_stop_reason_is_kept():
    held = flight(Returns())
    held.stop(StopReason.TIMED_OUT)
    held.stop(StopReason.CANCEL_REQUESTED)
    assert held.stop_reason is StopReason.TIMED_OUT and held.cancelled.is_set()


# ------------------------------------------------------------------ timeout


def test_a_timeout_is_a_retryable_failure_naming_the_agents_limit():
    agent = Waits()
    outcome = timed_out(flight(agent))
    assert outcome.retryable is True and outcome.base_delay == agent.base_delay
    error = error_of(outcome)
    assert (error["type"], error["message"]) == ("TaskTimeout", "handler ran longer than 0.5 s")


def test_a_timed_out_handler_writes_no_second_outcome():
    """What the worker does once the deadline passes: settle, record the timeout and
    stop the handler; the handler's own ending is then not written."""
    agent = Waits()
    held = flight(agent)
    result: list[Outcome | None] = []
    thread = threading.Thread(target=lambda: result.append(run_handler(held)))
    thread.start()
    assert agent.waiting.wait(10)
    assert held.settle()  # the timeout gets to write
    recorded = timed_out(held)
    held.stop(StopReason.TIMED_OUT)
    thread.join(10)
    assert result == [None]
    assert not held.settle() and held.settled
    assert error_of(recorded)["type"] == "TaskTimeout"


def test_only_one_ending_settles_a_task():
    held = flight(Returns())
    outcomes = []
    threads = [threading.Thread(target=lambda: outcomes.append(held.settle())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(outcomes) == [False] * 7 + [True]


def test_the_deadline_is_the_agents_timeout_from_now():
    before = time.monotonic()
    deadline = deadline_for(Waits())
    assert before + 0.5 <= deadline <= time.monotonic() + 0.5


# ------------------------------------------------------------------ refused outcomes


def test_an_outcome_the_database_refused_becomes_a_permanent_failure_saying_why():
    task = claimed()
    refused = RuntimeError("value too long for type character varying(10)")
    for original in (
        Outcome(OutcomeKind.COMPLETED, task, result_json="{}", summary="s"),
        Outcome(OutcomeKind.CANCELLED, task),
        failure(task, ValueError("boom"), retryable=True, base_delay=5.0),
    ):
        replacement = unrecordable(original, refused)
        assert (replacement.kind, replacement.task, replacement.retryable) == (
            OutcomeKind.FAILED,
            task,
            False,
        )
        assert error_of(replacement)["message"] == (
            "the database refused this task's outcome: "
            "value too long for type character varying(10)"
        )


def test_a_refused_permanent_failure_is_left_as_it_is():
    permanent = failure(claimed(), PermanentError("x"), retryable=False, base_delay=0.0)
    assert unrecordable(permanent, RuntimeError("refused")) is permanent

"""The worker protocol over HTTP: agents that run anywhere, with only a token of the
``write`` scope (bound to their agents, or not), claim tasks, heartbeat their leases
and report outcomes. The queue's side is ``task_queue.remote``: runworker's own
statements. The long poll of a claim waits outside Django (``long_poll``).

docs/remote-agents.md shows the protocol with curl.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, TypeVar
from uuid import UUID

from django.http import HttpRequest
from django.utils import timezone
from ninja import Path, Router

from task_queue import registry, remote
from task_queue.agent import progress_report
from task_queue.models import Task
from task_queue.task_specs import MAX_KEY_LENGTH

from ..agents import require_agent, token_agents, visible
from ..auth import WRITE
from ..errors import ERROR_RESPONSES, ApiError
from ..long_poll import LONG_POLL
from ..remote_schemas import (
    ClaimedTaskOut,
    ClaimOneRequest,
    ClaimOut,
    ClaimRequest,
    CompleteRequest,
    FailRequest,
    HeartbeatOut,
    HeartbeatRequest,
    OutcomeIn,
    OutcomeOut,
    OutcomesOut,
    OutcomesRequest,
)

router = Router(tags=["worker protocol"])

AgentName = Annotated[str, Path(max_length=MAX_KEY_LENGTH)]
Written = TypeVar("Written")


def _agent(request: HttpRequest, name: str, field: str = "name") -> None:
    """404 for an agent no one registered; 403 for one the token may not act as."""
    if name not in registry.names():
        raise ApiError.not_found("agent")
    require_agent(request, field, name)


def _task_agents(request: HttpRequest, ids: list[UUID], field: str) -> dict[UUID, str]:
    """The agent of each task: 404 for a task that does not exist, 403 for one of an
    agent the token is not bound to, without naming that agent (``field`` with the
    index of each, for a batch)."""
    agents = dict(Task.objects.filter(id__in=ids).values_list("id", "agent_name"))
    for index, task_id in enumerate(ids):
        where = field.format(index=index)
        if task_id not in agents:
            raise ApiError(
                404, "not_found", f"{where}: no such task", field_errors=[(where, "no such task")]
            )
        if not visible(request, agents[task_id]):
            why = "is a task of an agent this token is not bound to"
            raise ApiError(403, "agent_not_allowed", f"{where}: {why}", field_errors=[(where, why)])
    return agents


def _claimed(claimed: remote.Claimed) -> dict[str, Any]:
    task = claimed.task
    return {
        "id": task.id,
        "agent_name": task.agent_name,
        "task_type": task.task_type,
        "payload": claimed.payload,
        "priority": task.priority,
        "attempt": task.attempts + 1,
        "max_attempts": task.max_attempts,
        "trace_id": task.trace_id,
        "workflow_id": task.workflow_id,
        "lease_token": task.lease_token,
        "lease_expires_at": claimed.lease_expires_at,
    }


@router.post("/agents/{name}/claim", auth=WRITE, response={200: ClaimOut, **ERROR_RESPONSES})
def claim_tasks(request: HttpRequest, name: AgentName, body: ClaimRequest):
    """Lease up to ``limit`` due tasks of the agent, best priority first, and start
    them, as runworker does (pause, limits, priorities). With none due and
    ``wait_seconds``, the answer waits until one is (a notification, or its
    ``available_at``), at most that long; the wait holds no thread and no database
    connection. Each claim also keeps the worker on ``GET /api/v1/workers``.

    ``outcomes`` are recorded first, as ``POST /api/v1/outcomes`` records them (and
    refused as a whole as it refuses them: then nothing is claimed), once however long
    the claim then waits: a busy worker reports what it finished and takes more in
    one request instead of two."""
    _agent(request, name)
    poll = getattr(request, "scope", {}).get(LONG_POLL)
    # An earlier run of this request (a long poll's) recorded its outcomes already.
    carried = [] if poll is not None and poll.reported is not None else body.outcomes
    recorded, claimed = _refusals_named(
        lambda: remote.claim(
            body.worker,
            name,
            limit=body.limit,
            lease_seconds=body.lease_seconds,
            reports=[_reported(o) for o in carried],
            agents=token_agents(request),
            waiting=poll is not None and body.wait_seconds > 0,
        ),
        _in_outcomes,
    )
    if poll is None or poll.reported is None:
        results = _results(body.outcomes, recorded)
        if poll is not None:
            poll.reported = results
    else:
        results = poll.reported
    if not claimed and body.wait_seconds and poll is not None:
        poll.wait(body.wait_seconds, _seconds_until(remote.next_due_at(name)))
    return {"tasks": [_claimed(c) for c in claimed], "results": results}


def _seconds_until(moment: datetime | None) -> float | None:
    return None if moment is None else (moment - timezone.now()).total_seconds()


@router.post(
    "/tasks/{task_id}/claim", auth=WRITE, response={200: ClaimedTaskOut, **ERROR_RESPONSES}
)
def claim_task(request: HttpRequest, task_id: UUID, body: ClaimOneRequest):
    """Lease this task if it can start now; 409 with the reason (``details.reason``:
    ``not_due``, ``leased``, ``finished``, ``paused`` or ``over_limit``) if not. A
    dispatched agent claims by id: a duplicate command finds the task leased. A task
    whose payload's blob cannot be read fails as in runworker (``payload_unavailable``)."""
    agent = _task_agents(request, [task_id], "task_id")[task_id]
    try:
        claimed = remote.claim_one(body.worker, task_id, agent, lease_seconds=body.lease_seconds)
    except remote.NotClaimable as refused:
        raise ApiError(
            409, "not_claimable", str(refused), details={"reason": refused.reason}
        ) from None
    return _claimed(claimed)


@router.post(
    "/tasks/{task_id}/heartbeat", auth=WRITE, response={200: HeartbeatOut, **ERROR_RESPONSES}
)
def heartbeat(request: HttpRequest, task_id: UUID, body: HeartbeatRequest):
    """Extend the lease and write the progress. 409 ``lease_lost`` once the lease is
    not this token's any more (expired and recovered, or the task was cancelled): stop
    the task, nothing it reports will count."""
    _task_agents(request, [task_id], "task_id")
    progress = body.progress and progress_report(body.progress.fraction, body.progress.message)
    held = remote.heartbeat(
        task_id, body.lease_token, progress=progress, lease_seconds=body.lease_seconds
    )
    if held is None:
        raise _lease_lost("lease_token")
    return {"lease_expires_at": held.expires_at, "cancel_requested": held.cancel_requested}


def _lease_lost(field: str) -> ApiError:
    message = "the lease is not held any more (expired, recovered or cancelled): stop the task"
    return ApiError(409, "lease_lost", f"{field}: {message}", field_errors=[(field, message)])


@router.post("/tasks/{task_id}/complete", auth=WRITE, response={200: OutcomeOut, **ERROR_RESPONSES})
def complete_task(request: HttpRequest, task_id: UUID, body: CompleteRequest):
    """Record the task completed with ``result`` (its AgentEvent and embedding job in
    the same statement); 409 ``lease_lost`` if the lease is not held, and nothing is
    written."""
    report = remote.Reported(task_id, body.lease_token, result=body.result, summary=body.summary)
    return _one(request, report)


@router.post("/tasks/{task_id}/fail", auth=WRITE, response={200: OutcomeOut, **ERROR_RESPONSES})
def fail_task(request: HttpRequest, task_id: UUID, body: FailRequest):
    """Record a failed attempt: retried after backoff (``pending`` and its
    ``available_at``), ``dead`` once its attempts are spent, ``failed`` if not
    ``retryable``, ``cancelled`` if a cancel was requested. 409 ``lease_lost`` if the
    lease is not held."""
    report = remote.Reported(
        task_id, body.lease_token, error=body.error.model_dump(), retryable=body.retryable
    )
    return _one(request, report)


def _one(request: HttpRequest, report: remote.Reported) -> dict[str, Any]:
    recorded = _refusals_named(
        lambda: remote.record([report], token_agents(request)), lambda _index, field: field
    )[report.task_id]
    if recorded.status is None:
        raise _lease_lost("lease_token")
    return {"task_id": report.task_id, **vars(recorded)}


@router.post("/outcomes", auth=WRITE, response={200: OutcomesOut, **ERROR_RESPONSES})
def report_outcomes(request: HttpRequest, body: OutcomesRequest):
    """Up to 500 completions, failures and releases (tasks given back unfinished, as a
    stopping worker does) in one request, each answered in order: the task's new
    status, or ``error.code`` ``lease_lost`` (nothing written for it).
    A task of another agent than the token's is 403 for the whole request, and an
    unstorable result 413/422, before anything is written."""
    reports = [_reported(o) for o in body.outcomes]
    recorded = _refusals_named(lambda: remote.record(reports, token_agents(request)), _in_outcomes)
    return {"results": _results(body.outcomes, recorded)}


def _in_outcomes(index: int, field: str) -> str:
    return f"outcomes[{index}].{field}"


def _results(
    outcomes: list[OutcomeIn], recorded: dict[UUID, remote.Recorded]
) -> list[dict[str, Any]]:
    """Each outcome's answer, in order: its task's new status, or ``lease_lost``."""
    results = []
    for outcome in outcomes:
        written = recorded[outcome.task_id]
        if written.status is None:
            error = {"code": "lease_lost", "message": "the lease is not held any more"}
            results.append({"task_id": outcome.task_id, "error": error})
        else:
            results.append({"task_id": outcome.task_id, **vars(written)})
    return results


def _reported(outcome: OutcomeIn) -> remote.Reported:
    return remote.Reported(
        outcome.task_id,
        outcome.lease_token,
        result=outcome.result if outcome.result is not None else {},
        summary=outcome.summary,
        error=outcome.error.model_dump() if outcome.error else None,
        retryable=outcome.retryable,
        released=outcome.status == "released",
    )


def _refusals_named(write: Callable[[], Written], path: Callable[[int, str], str]) -> Written:
    """``write()``, its refusals of a report as API errors naming the report's field
    (``path(index, field)``): 404 or 403 for a task not found or not the token's, 413
    or 422 for a result the queue cannot store."""
    try:
        return write()
    except remote.NotYours as refused:
        field = path(refused.index, "task_id")
        if refused.agent is None:
            message = f"{field}: no such task"
            errors = [(field, "no such task")]
            raise ApiError(404, "not_found", message, field_errors=errors) from None
        why = "is a task of an agent this token is not bound to"
        errors = [(field, why)]
        raise ApiError(403, "agent_not_allowed", f"{field}: {why}", field_errors=errors) from None
    except remote.InvalidOutcome as invalid:
        field = path(invalid.index, invalid.field)
        status, code = (
            (413, "payload_too_large") if invalid.too_large else (422, "validation_error")
        )
        raise ApiError(
            status, code, f"{field}: {invalid.message}", field_errors=[(field, invalid.message)]
        ) from None

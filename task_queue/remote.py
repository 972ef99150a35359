"""The queue's side of the worker protocol over HTTP: what a worker that is not a
process of this project (an agent elsewhere, holding only an API token) does to the
queue. ``automechanica.api.routers.remote_workers`` serves it.

Every step is runworker's own statement, not a copy:

- a claim is ``leasing.claim_tasks`` (limits, pause, priorities, a claim position per
  remote worker) or ``leasing.claim_task`` for one named task, the same claim picking
  that task;
- a task's heartbeat is ``heartbeats.heartbeat``, extending that one lease and keeping
  the worker's row in ``workers`` (kind ``remote``);
- outcomes are ``outcomes.write_outcomes``, the outcome writer's fenced statements,
  run as the lease's holder: a write names only the task and its lease token, and
  one whose token is not the task's current one changes nothing.

The one difference is where the claim's and the outcomes' session settings live: on
the web server's pooled connections they last the transaction only
(``prepare_claim_transaction``, ``prepare_outcome_transaction``), as runworker's do
behind a pooler in transaction mode. Their plans are made
again as the table grows, as runworker's are (``remake_plans_when_grown``, which keeps
its bookkeeping per connection): without it a pooled connection kept the generic claim
plan it made on a small table, and remote claims took 3 ms at the median and 40-60 ms
at the 90th percentile against runworker's 0.35 ms (queue_bench --remote, statement
durations from PostgreSQL's log).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple
from uuid import UUID

from django.conf import settings
from django.db import transaction

from task_queue.sql import heartbeats, leasing
from task_queue.sql import outcomes as outcomes_sql
from task_queue.sql.enqueue import notify_agents

from . import blobs, registry
from .agent import Agent, default_summary
from .claim_position import ClaimPosition
from .execution import SUMMARY_MAX_CHARS, Outcome, completion, failure, reported_failure
from .models import WorkerKind, WorkerState
from .outcomes import release, write_outcomes
from .storable import diagnostic_text, storable_json

# Remote workers whose claim positions a server process keeps (the least recently
# used are forgotten: a forgotten position only means its next claim reads from the
# head of the index).
KEPT_POSITIONS = 10_000
# At most this often a busy remote worker's row is written by its claims (_Registrations).
REGISTER_EVERY_SECONDS = 1.0


class NotClaimable(Exception):
    """A named task that cannot be claimed now; ``reason`` says why (a stable code)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class InvalidOutcome(ValueError):
    """A report that cannot be recorded as given: the ``index``-th report's ``field``."""

    def __init__(self, index: int, field: str, message: str, *, too_large: bool) -> None:
        super().__init__(f"{field}: {message}")
        self.index = index
        self.field = field
        self.message = message
        self.too_large = too_large


@dataclass(frozen=True)
class Claimed:
    """A task a remote worker claimed, with its payload read back from its blob."""

    task: leasing.ClaimedTask
    payload: Any
    lease_expires_at: datetime


@dataclass(frozen=True)
class Reported:
    """What a remote worker reports of one task: a completion (``result``), a failure
    (``error``: type, message, traceback), or that it gives the task back unfinished
    (``released``: a worker stopping, as runworker's shutdown does)."""

    task_id: UUID
    lease_token: UUID
    result: Any = None
    summary: str | None = None
    error: dict[str, Any] | None = None
    retryable: bool = True
    released: bool = False


@dataclass(frozen=True)
class Recorded:
    """A reported outcome as written: the task's new status (``completed``, ``pending``
    to be retried at ``available_at``, ``dead``, ``failed`` or ``cancelled``), or None
    when its lease was no longer held and nothing was written."""

    status: str | None
    available_at: datetime | None = None


class _Positions:
    """The claim positions of remote workers, by worker. Two requests of one worker at
    once share its position: a claim may then start at the other's start, which only
    moves tasks to the next claim from the head (at most HEAD_SCAN_EVERY_SECONDS)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._positions: OrderedDict[str, ClaimPosition] = OrderedDict()

    def of(self, worker: str) -> ClaimPosition:
        with self._lock:
            position = self._positions.pop(worker, None) or ClaimPosition()
            self._positions[worker] = position
            while len(self._positions) > KEPT_POSITIONS:
                self._positions.popitem(last=False)
            return position


_positions = _Positions()


@dataclass(slots=True)
class _Registered:
    """What this process knows of a remote worker's row."""

    at: float | None = None  # time.monotonic() of its last write (committed)
    pending: list[UUID] = field(default_factory=list)  # tasks taken since, not in it yet
    idle: bool = False  # that write left it idle, and nothing changed since
    changes: int = 0  # how often outcomes of its tasks were recorded (``changed``)


class Registration(NamedTuple):
    """A write of a worker's row a claim is to make: the tasks to add (``known``)."""

    known: list[UUID]
    changes: int  # the worker's ``changes`` when it was decided


class _Registrations:
    """When this process last registered each remote worker, and the tasks its claims
    took since. Under load a worker claims many times a second: its row is written by
    a claim that got tasks when it showed none, then at most every
    REGISTER_EVERY_SECONDS with every task taken since (its newest show on /workers/
    up to that late). A claim that got none writes it too (tasks it no longer holds
    leave it), unless the last write left it idle and nothing changed since (no task
    taken, no outcome recorded): then at most every third of a lease, as runworker
    heartbeats, or every half lease for a claim that long-polls (the wake-ups' ticks
    keep a waiting worker alive meanwhile). Otherwise every long poll of an idle
    worker would write it, with the costliest statement of its claim."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._workers: OrderedDict[str, _Registered] = OrderedDict()

    def due(
        self, worker: str, taken: list[UUID], *, waiting: bool, reported: bool
    ) -> Registration | None:
        """The write of the worker's row to make now (then :meth:`written` once it
        commits), or None to leave the row as is; ``waiting``: the claim long-polls;
        ``reported``: it recorded outcomes first."""
        now = time.monotonic()
        with self._lock:
            state = self._of(worker)
            state.pending.extend(taken)
            since = math.inf if state.at is None else now - state.at
            if taken and not state.idle and since < REGISTER_EVERY_SECONDS:
                return None
            quiet = settings.QUEUE_LEASE_SECONDS / (2 if waiting else 3)
            if not state.pending and state.idle and not reported and since < quiet:
                return None
            # Written now (or rolled back with the tasks taken).
            known, state.pending = state.pending, []
            return Registration(known, state.changes)

    def written(self, worker: str, registration: Registration) -> None:
        """The worker's row was written as ``registration`` said (committed)."""
        with self._lock:
            state = self._of(worker)
            state.at = time.monotonic()
            # Outcomes recorded since it was decided may have finished tasks it showed.
            state.idle = not registration.known and state.changes == registration.changes

    def changed(self, workers: Collection[str]) -> None:
        """Outcomes of these workers' tasks were recorded (committed): the next claim
        of each writes its row (the finished tasks leave it)."""
        with self._lock:
            for worker in workers:
                state = self._of(worker)
                state.changes += 1
                state.idle = False

    def _of(self, worker: str) -> _Registered:
        state = self._workers.get(worker)
        if state is None:
            state = self._workers[worker] = _Registered()
            while len(self._workers) > KEPT_POSITIONS:
                self._workers.popitem(last=False)
        else:
            self._workers.move_to_end(worker)
        return state


_registrations = _Registrations()


def claim(
    worker: str,
    agent: str,
    *,
    limit: int,
    lease_seconds: float,
    reports: Sequence[Reported] = (),
    agents: Collection[str] | None = None,
    waiting: bool = False,
) -> tuple[dict[UUID, Recorded], list[Claimed]]:
    """Lease up to ``limit`` due tasks of ``agent`` to the remote ``worker`` and start
    them, as runworker's claim does; the worker's row is written in the same
    transaction when it is due (``_Registrations``; ``waiting``: the claim long-polls).

    ``reports`` (the worker's finished tasks) are recorded first, in that transaction,
    as :func:`record` records them (and refused as it refuses them: then nothing is
    claimed). One transaction instead of two saves a busy worker's request two
    round trips; if it wrote outcomes it commits waiting for the WAL flush, as they
    must. An agent with limits then holds its limits lock (``locks.AGENT_LIMITS``)
    through that flush too: with a limit set, 2 and 6 remote workers drained as fast
    as with two transactions (docs/performance.md). Returns what was recorded and
    what was claimed."""
    with transaction.atomic():
        recorded = _record(reports, agents, worker) if reports else {}
        written = any(r.status is not None for r in recorded.values())
        clock = leasing.prepare_claim_transaction(durable=written)
        tasks = leasing.claim_tasks(
            owner=worker,
            agents=[agent],
            limit=limit,
            lease_seconds=lease_seconds,
            now=None,
            position=_positions.of(worker),
        )
        taken = [t.id for t in tasks]
        due = _registrations.due(worker, taken, waiting=waiting, reported=written)
        if due is not None:
            _register(worker, [agent], limit, lease_seconds, known=due.known)
            transaction.on_commit(lambda: _registrations.written(worker, due))
    return recorded, _with_payloads(worker, tasks, clock + timedelta(seconds=lease_seconds))


def claim_one(worker: str, task_id: UUID, agent: str, *, lease_seconds: float) -> Claimed:
    """Lease the task ``task_id`` (of ``agent``) to ``worker`` if it can start now;
    :class:`NotClaimable` says why not."""
    with transaction.atomic():
        clock = leasing.prepare_claim_transaction()
        task = leasing.claim_task(
            owner=worker, task_id=task_id, agent=agent, lease_seconds=lease_seconds, now=None
        )
        if task is None:
            raise why_not(task_id)
        _register(worker, [agent], 1, lease_seconds, known=[task.id])
    claimed = _with_payloads(worker, [task], clock + timedelta(seconds=lease_seconds))
    if not claimed:
        raise NotClaimable("payload_unavailable", "the task's payload could not be read")
    return claimed[0]


def why_not(task_id: UUID) -> NotClaimable:
    """Why a named task could not be claimed just now (its claim took nothing)."""
    found = leasing.why_not_claimable(task_id, None)
    if found is None:
        return NotClaimable("not_found", "no such task")
    status, not_due, paused = found
    if status in ("leased", "running"):
        return NotClaimable("leased", "the task is leased to a worker already")
    if status != "pending":
        return NotClaimable("finished", f"the task is {status}")
    if not_due:
        return NotClaimable("not_due", "the task is not due yet (available_at)")
    if paused:
        return NotClaimable("paused", "the task's agent is paused")
    return NotClaimable(
        "over_limit",
        "the agent is at its concurrency or rate limit (or another claim took the task)",
    )


def next_due_at(agent: str) -> datetime | None:
    """When a task of ``agent`` can next start, as an idle runworker reads it."""
    return leasing.next_due_at([agent])


def _host_and_pid(worker: str) -> tuple[str, int]:
    """A remote worker's host and process id, when its name is ``host:pid`` (else the
    name and 0)."""
    hostname, _, pid = worker.rpartition(":")
    if hostname and pid.isascii() and pid.isdigit() and int(pid) < 2**31:
        return hostname, int(pid)
    return worker, 0


def _register(
    worker: str, agents: list[str], concurrency: int, lease_seconds: float, known: list[UUID]
) -> None:
    hostname, pid = _host_and_pid(worker)
    heartbeats.heartbeat(
        owner=worker,
        held=[],
        lease_seconds=lease_seconds,
        hostname=hostname,
        pid=pid,
        agents=agents,
        concurrency=concurrency,
        now=None,
        state=WorkerState.BUSY if known else WorkerState.IDLE,
        kind=WorkerKind.REMOTE,
        whole=False,
        known=known,
    )


def _with_payloads(
    worker: str, tasks: list[leasing.ClaimedTask], ends: datetime | None
) -> list[Claimed]:
    """The tasks with their payloads; a task whose payload's blob cannot be read fails
    with the reason, as it does in runworker, and is not handed out."""
    claimed, unreadable = [], []
    for task in tasks:
        try:
            claimed.append(Claimed(task, blobs.payload_of(task.payload, task.payload_ref), ends))
        except blobs.PayloadBlobError as error:
            retryable = isinstance(error, blobs.PayloadBlobUnavailable)
            base_delay = _base_delay(task.agent_name)
            unreadable.append(failure(task, error, retryable=retryable, base_delay=base_delay))
    if unreadable:
        write_outcomes(worker, unreadable, None)
    return claimed


def release_unread(held: Sequence[tuple[UUID, UUID]]) -> None:
    """Give back tasks a claim took for a client that left before reading its answer."""
    reports = [Reported(task_id, token, released=True) for task_id, token in held]
    record(reports)


def heartbeat(
    task_id: UUID,
    lease_token: UUID,
    *,
    progress: tuple[float, str] | None,
    lease_seconds: float | None,
) -> heartbeats.HeldLease | None:
    """Extend the lease ``lease_token`` on ``task_id`` (by ``lease_seconds``, else by the
    length its claim granted) and write the progress; None if the lease is no longer
    held."""
    holder = heartbeats.lease_holders([(task_id, lease_token)]).get(task_id)
    if holder is None:
        return None
    seconds = lease_seconds or holder.lease_seconds or settings.QUEUE_LEASE_SECONDS
    hostname, pid = _host_and_pid(holder.owner)
    held = heartbeats.heartbeat(
        owner=holder.owner,
        held=[(task_id, lease_token)],
        lease_seconds=seconds,
        hostname=hostname,
        pid=pid,
        agents=[holder.task.agent_name],
        concurrency=1,
        now=None,
        state=WorkerState.BUSY,
        progress=[progress],
        kind=WorkerKind.REMOTE,
        whole=False,
    )
    return held.get(task_id)


class NotYours(Exception):
    """The ``index``-th report is about a task that does not exist (``agent`` None) or
    is of an agent the caller may not act as."""

    def __init__(self, index: int, agent: str | None) -> None:
        super().__init__(f"report {index}: task of {agent or 'no agent'}")
        self.index = index
        self.agent = agent


def record(
    reports: Sequence[Reported], agents: Collection[str] | None = None
) -> dict[UUID, Recorded]:
    """Write what remote workers reported, each as the holder of its lease, through the
    outcome writer's statements, in one transaction; a report whose lease is no longer
    held is refused (status None) and changes nothing. Before anything is written:
    :class:`NotYours` for a task that does not exist or is not of ``agents`` (when
    given), and :class:`InvalidOutcome` for a result the queue cannot store."""
    with transaction.atomic():
        return _record(reports, agents)


def _record(
    reports: Sequence[Reported], agents: Collection[str] | None, claimer: str | None = None
) -> dict[UUID, Recorded]:
    """:func:`record`, in the caller's transaction; ``claimer``: a worker whose claim
    in it writes its row after these outcomes (so it needs no other write)."""
    holders = heartbeats.lease_holders([(r.task_id, r.lease_token) for r in reports])
    # Only the tasks whose lease is not held need their agent looked up (rarely any).
    others = heartbeats.agents_of([r.task_id for r in reports if r.task_id not in holders])
    for index, report in enumerate(reports):
        holder = holders.get(report.task_id)
        agent = holder.task.agent_name if holder else others.get(report.task_id)
        if agent is None or (agents is not None and agent not in agents):
            raise NotYours(index, agent)
    by_owner: dict[str, list[Outcome]] = {}
    releases: dict[str, list[tuple[UUID, UUID]]] = {}
    for index, report in enumerate(reports):
        holder = holders.get(report.task_id)
        if holder is None:
            continue
        if report.released:
            releases.setdefault(holder.owner, []).append((report.task_id, report.lease_token))
        else:
            by_owner.setdefault(holder.owner, []).append(_outcome(report, holder.task, index))
    if owners := (by_owner.keys() | releases.keys()) - {claimer}:
        transaction.on_commit(lambda: _registrations.changed(owners))
    written: dict[UUID, tuple[str, datetime | None]] = {}
    if by_owner:
        outcomes_sql.prepare_outcome_transaction()
    for owner, outcomes in by_owner.items():
        written |= write_outcomes(owner, outcomes, None)
    retried = {
        holders[t].task.agent_name for t, (status, _) in written.items() if status == "pending"
    }
    if retried:
        # A retry is due after its backoff, with no notification of its own: a waiting
        # claim of the agent, woken now, reads when (``next_due_at``) and waits for it.
        notify_agents(sorted(retried))
    for owner, held in releases.items():
        written |= {
            task_id: (status, None) for task_id, status in release(owner, held, None).items()
        }
    return {
        r.task_id: Recorded(*written[r.task_id]) if r.task_id in written else Recorded(None)
        for r in reports
    }


def _outcome(report: Reported, task: leasing.ClaimedTask, index: int) -> Outcome:
    base_delay = _base_delay(task.agent_name)
    if report.error is not None:
        error = report.error
        return reported_failure(
            task,
            error["type"],
            error["message"],
            error.get("traceback"),
            retryable=report.retryable,
            base_delay=base_delay,
        )
    # The checks of a handler's result (task_queue.execution), refused here rather than
    # failing the task: the worker can still report something else.
    try:
        result = blobs.check_size(storable_json(report.result))
    except blobs.TooLarge as error:
        raise InvalidOutcome(index, "result", f"too large: {error}", too_large=True) from None
    except ValueError as error:
        raise InvalidOutcome(index, "result", str(error), too_large=False) from None
    summary = report.summary or default_summary(task.agent_name, task.task_type, report.result)
    return completion(
        task, result, diagnostic_text(summary, SUMMARY_MAX_CHARS), base_delay=base_delay
    )


def _base_delay(agent: str) -> float:
    """The agent's backoff base (an agent no longer registered: the default's)."""
    return (registry.get(agent) if agent in registry.names() else Agent).base_delay

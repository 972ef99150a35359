"""Leasing tasks to a worker and starting them (the heartbeat and the workers' rows:
``task_queue.sql.heartbeats``).

Fencing: every write a worker makes about a task names the task, the worker
(``owner``) and the lease token it was given, and only touches rows still held that
way. A worker whose lease expired finds its write affects no row, and learns it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from psycopg.types.numeric import Int4

from task_queue.claim_position import ClaimPosition
from task_queue.leases import Lease
from task_queue.sql import locks
from task_queue.sql.connections import settings_scope
from task_queue.sql.db import (
    NOW,
    fetch,
    fetch_bound,
    remake_plans_when_grown,
    require_transaction,
    set_up_session,
)

# Tasks are leased to a worker (lease_owner: its id) while leased or running;
# the reaper (task_queue.maintenance.reaper) recovers expired leases.
TASK_LEASE = Lease(
    table="tasks",
    token="lease_token",
    ends="lease_expires_at",
    owner="lease_owner",
    held=("leased", "running"),
    recovery_lock=locks.REAPER,
)
HELD = TASK_LEASE.held_rows
FENCED = TASK_LEASE.fenced_batch("t")


# The settings a claim runs under (why each: prepare_claim_transaction).
CLAIM_SETTINGS = {
    "synchronous_commit": "off",
    "enable_sort": "off",
    "enable_hashjoin": "off",
    "enable_mergejoin": "off",
    "plan_cache_mode": "force_generic_plan",
    "jit": "off",
}


def _set_claim_settings(is_local: bool, durable: bool = False) -> str:
    settings = {k: v for k, v in CLAIM_SETTINGS.items() if not durable or k != "synchronous_commit"}
    items = ", ".join(f"set_config('{k}', '{v}', {is_local})" for k, v in settings.items())
    return f"SELECT {items}"


# For as long as the connection lasts: a worker's fetch loop, whose connection is its
# own (not behind a pooler that shares server sessions between clients).
PREPARE_CLAIM_SESSION = _set_claim_settings(False)
# Until the transaction ends, never longer: a claim on a connection that others use
# after it (the web server's pool, for the worker protocol over HTTP; a pooler in
# transaction mode in front of the database). It also reads the transaction's clock
# (now(): its start), which every claim statement in it uses, so that the caller knows
# when the leases it grants end without asking again.
PREPARE_CLAIM_TRANSACTION = f"{_set_claim_settings(True)}, now()"
# The same for a transaction that also records outcomes: its commit waits for the WAL
# flush, as theirs must. It leaves synchronous_commit as the session has it: on, on
# the web server's pooled connections (only a worker's own claim session turns it
# off, and that session never records a remote worker's outcomes).
PREPARE_DURABLE_CLAIM_TRANSACTION = f"{_set_claim_settings(True, durable=True)}, now()"


def claiming() -> AbstractContextManager[None]:
    """Where a worker's claim runs (``connections.settings_scope``): on its connection
    set up for claiming (``prepare_claim_session``), in autocommit; or behind a pooler
    in transaction mode, in a transaction of its own (``prepare_claim_transaction``)."""
    return settings_scope(prepare_claim_session, prepare_claim_transaction)


def prepare_claim_session() -> None:
    """Set up this thread's connection for claiming: its settings once per
    connection (why each: ``prepare_claim_transaction``), its plans made again when
    stale (the fetch loop calls it before every claim). The worker's fetch loop runs
    claims and the due time (``next_due_at``) on it, and at the end, on the same
    thread, the release of unfinished tasks and the removal of its row: none of these
    sorts."""
    set_up_session(PREPARE_CLAIM_SESSION)
    remake_plans_when_grown("tasks")


def prepare_claim_transaction(durable: bool = False) -> datetime:
    """Set up the current transaction (call it inside one) for claiming: the claim's
    settings until it ends, and the connection's plans made again when stale; for a
    connection that others use after it (the web server's pool; any connection behind
    a pooler in transaction mode, where a session setting would go to the pooler's
    other clients: another application would commit without waiting for the WAL
    flush). Returns the transaction's clock: a lease granted in it for L seconds ends
    at this time plus L.

    ``synchronous_commit`` off: a claim commits without waiting for the WAL flush. If
    the database crashes and loses one, the task is pending or its lease runs out, the
    worker's fenced outcome write is refused, and the task runs again, as after any
    crash. A release lost that way leaves its tasks to the reaper when their leases
    run out. Outcomes (the outcome writer's) stay durable: ``durable`` keeps the
    commit waiting for a transaction that records outcomes too.

    ``plan_cache_mode``: the claim is a prepared statement (``fetch_bound``), and
    runs its one generic plan from the first run on, the plan tests/test_generic_plans.py
    checks. PostgreSQL would otherwise plan its first five runs for their values, with
    the statistics of the moment, which after a burst onto an emptied table say that
    there are no tasks.

    ``enable_hashjoin`` and ``enable_mergejoin`` off: a generic plan does not know the
    claim's limit, and guesses it takes a tenth of the pending tasks. Behind a backlog
    of 200,000 it then updated the claimed tasks through a hash join that read the
    whole table, at every claim (such a drain ran at 4,500 tasks/s). Nested loops find
    each claimed task by its id, whatever the guess; every other join of this session
    is as small.

    ``enable_sort`` off: each agent's due tasks must come from an ordered scan of
    tasks_pending_lease_idx that stops after the claim's room. Right after a burst of
    enqueues, the planner's statistics still say that few tasks are pending; it then
    chose the smaller tasks_pending_due_idx and sorted every pending task of the agent,
    on every claim (60,000 pending: 35 ms a claim, spilled to disk). With sorts
    disabled, a plan with fewer sorts wins whatever its estimated cost, so the ordered
    scan is taken; the claim's other sorts (at most its limit of rows) have no
    alternative and stay.

    ``jit`` off: before PostgreSQL 18 each disabled method added 10^10 to a plan's
    cost, far above ``jit_above_cost``, so a server with JIT (PostgreSQL 15's from
    Debian) compiled every claim: 0.47 s of a 0.73 s claim of 10 tasks, and a drain of
    500 tasks took 22 s instead of a tenth of a second.

    Stale plans: ``remake_plans_when_grown``.
    """
    require_transaction("prepare_claim_transaction")
    remake_plans_when_grown("tasks")
    statement = PREPARE_DURABLE_CLAIM_TRANSACTION if durable else PREPARE_CLAIM_TRANSACTION
    return fetch(statement, {})[0][-1]


@dataclass(frozen=True, slots=True)
class ClaimedTask:
    id: UUID
    agent_name: str
    task_type: str
    payload: dict[str, Any]
    attempts: int
    max_attempts: int
    workflow_id: UUID | None
    trace_id: str | None
    lease_token: UUID
    payload_ref: str | None  # the payload's blob, when it is too large for the row
    traceparent: str | None  # the span it was enqueued under (task_queue.tracing)
    priority: int = 0


# Each agent's due tasks come from an ordered scan of tasks_pending_lease_idx
# (agent_name, priority, created_at); the best `limit` of them across agents are
# claimed; with several agents, rows locked but not chosen are let go when the
# statement commits. Paused agents (paused_agents) are left out before any row is
# locked.
#
# Agents with limits (agent_limits) take at most their room: the SQL function
# agent_claim_allowance (migration queue 0018) takes each one's lock, in name order
# (so two claims never wait on each other in a cycle), and counts its held tasks and
# its starts in the rate window with a snapshot taken after the lock; the lock is held
# until this statement commits, and the starts of rate-limited agents are logged in
# agent_starts. An agent without limits has no row: no lock, no count.
#
# A worker claims only as many tasks as it has free slots, so a claimed task goes
# straight to running (its attempt starts now): one write per task, and one
# envelope (evt.task.claimed.v1, seed 000), written here rather than by a trigger
# because this statement is the only one that grants a task's lease.
#
# Only each agent's first task of the claim comes back with its created_at (where the
# worker's next claim may start: task_queue.claim_position). A timestamptz costs a
# worker about 6 µs to load (Django's loader for it is Python), and one per task
# added a seventh to the workers' CPU per drained task.
# How the claim picks its tasks: each agent's due tasks in order (AGENT_SCAN), or one
# named task if it is due (ONE_TASK). Everything around the pick (limits, the update
# that starts the tasks, their envelopes, the rate log) is one text for both:
# _claim_statement.
LIMITED = f"""
limited AS MATERIALIZED (
    SELECT agent_name, rate_count IS NOT NULL AS rate_limited,
           agent_claim_allowance(agent_name, {locks.AGENT_LIMITS}, {NOW}) AS room
    FROM (
        SELECT agent_name, rate_count FROM agent_limits
        WHERE agent_name = ANY(%(agents)s::text[])
        ORDER BY agent_name
        OFFSET 0
    ) AS l
)
"""
AGENT_SCAN = f"""
due AS (
    SELECT t.id, t.priority, t.created_at
    FROM (
        SELECT name, least(%(limit)s, (SELECT room FROM limited WHERE agent_name = a.name))
            AS room, start_priority, start_created_at
        FROM unnest(%(agents)s::text[], %(start_priorities)s::int[],
                    %(start_times)s::timestamptz[])
            AS a(name, start_priority, start_created_at)
        WHERE NOT EXISTS (SELECT FROM paused_agents p WHERE p.agent_name = a.name)
    ) AS agent
    CROSS JOIN LATERAL (
        SELECT id, priority, created_at
        FROM tasks
        WHERE status = 'pending' AND agent_name = agent.name AND available_at <= {NOW}
          AND (priority, created_at) >= (agent.start_priority, agent.start_created_at)
        ORDER BY priority, created_at
        LIMIT agent.room
        FOR UPDATE SKIP LOCKED
    ) AS t
)
"""
# A named task (%(task_id)s) of %(agents)s, if it is pending, due, its agent not paused
# and within its limits; a row another claim holds locked is skipped, as in the scan.
ONE_TASK = f"""
due AS (
    SELECT t.id, t.priority, t.created_at
    FROM tasks t
    WHERE t.id = %(task_id)s AND t.agent_name = ANY(%(agents)s::text[])
      AND t.status = 'pending' AND t.available_at <= {NOW}
      AND NOT EXISTS (SELECT FROM paused_agents p WHERE p.agent_name = t.agent_name)
      AND coalesce((SELECT room FROM limited WHERE agent_name = t.agent_name), 1) > 0
    FOR UPDATE OF t SKIP LOCKED
)
"""
CLAIMED = f"""
chosen AS (
    SELECT id FROM due ORDER BY priority, created_at LIMIT %(limit)s
),
claimed AS (
    UPDATE tasks t
    SET status = 'running',
        {TASK_LEASE.grant()}, lease_seconds = %(lease_seconds)s,
        progress = NULL, progress_message = NULL, progress_at = NULL,
        started_at = {NOW},
        updated_at = {NOW}
    FROM chosen
    WHERE t.id = chosen.id
    RETURNING t.id, t.agent_name, t.task_type, t.payload, t.attempts, t.max_attempts,
              t.workflow_id, t.trace_id, t.lease_token, t.payload_ref, t.traceparent,
              t.lease_owner, t.lease_expires_at, t.priority, t.created_at
),
envelopes AS (
    INSERT INTO event_outbox (kind, trace_id, causation_id, subject_id, emitted_at,
                              payload)
    SELECT 'evt.task.claimed.v1', trace_id, id::text, id::text, {NOW},
           jsonb_build_object('task_id', id, 'agent_type', agent_name,
                              'agent_id', lease_owner, 'attempt', attempts + 1,
                              'lease_until', lease_expires_at)
    FROM claimed
    ORDER BY id
),
starts AS (
    INSERT INTO agent_starts (agent_name, started_at)
    SELECT claimed.agent_name, {NOW}
    FROM claimed JOIN limited ON limited.agent_name = claimed.agent_name
    WHERE limited.rate_limited
)
SELECT id, agent_name, task_type, payload, attempts, max_attempts, workflow_id, trace_id,
       lease_token, payload_ref, traceparent, priority,
       CASE WHEN row_number() OVER (PARTITION BY agent_name ORDER BY priority, created_at) = 1
            THEN created_at END AS created_at
FROM claimed
"""


def _claim_statement(due: str) -> str:
    return f"WITH {LIMITED.strip()},\n{due.strip()},\n{CLAIMED.strip()}\n"


CLAIM_TASKS = _claim_statement(AGENT_SCAN)
CLAIM_TASK_BY_ID = _claim_statement(ONE_TASK)


# Where a claim from the head of the lease index starts: before every task. Sent as
# int4 and timestamptz whatever the values, so that psycopg prepares the claim once per
# connection (it picks a list's type from its values: a small int is an int2).
HEAD = (Int4(-(2**31)), datetime.min.replace(tzinfo=UTC))


def claim_tasks(
    *,
    owner: str,
    agents: Sequence[str],
    limit: int,
    lease_seconds: float,
    now: datetime | None,
    position: ClaimPosition | None = None,
) -> list[ClaimedTask]:
    """Lease up to ``limit`` due pending tasks of ``agents``, best priority first, and
    start them (status ``running``). With a ``position`` (a worker's), each agent's
    scan starts where it says, and the position is moved on (task_queue.claim_position);
    without, every claim reads from the head of the index."""
    starts = position.next_starts(agents) if position else [None] * len(agents)
    starts = [(Int4(start[0]), start[1]) if start else HEAD for start in starts]
    params = {
        "owner": owner,
        "agents": list(agents),
        "start_priorities": [priority for priority, _ in starts],
        "start_times": [created_at for _, created_at in starts],
        "limit": limit,
        "lease_seconds": lease_seconds,
        "now": now,
    }
    # Django's psycopg setup hands jsonb back as text; JSONField decodes it, raw SQL here.
    # Prepared: parsing and planning the claim as text cost more than the 50 tasks it
    # claims (an empty claim: about 680 µs of PostgreSQL's CPU as text, 85 µs
    # prepared). After its first runs PostgreSQL keeps one generic plan, which takes
    # each agent's tasks from the same ordered scan (tests/test_generic_plans.py).
    claimed, firsts = [], []
    for task_id, agent, task_type, payload, *rest, priority, created_at in fetch_bound(
        CLAIM_TASKS, params, prepared=True
    ):
        claimed.append(ClaimedTask(task_id, agent, task_type, json.loads(payload), *rest, priority))
        if created_at is not None:  # the agent's first task of the claim
            firsts.append((agent, priority, created_at))
    if position:
        position.claimed(firsts, filled=len(claimed) == limit)
    return claimed


def claim_task(
    *, owner: str, task_id: UUID, agent: str, lease_seconds: float, now: datetime | None
) -> ClaimedTask | None:
    """Lease and start the task ``task_id`` of ``agent`` if it can start now (pending,
    due, its agent not paused, within its limits, not locked by another claim); the
    claim of :func:`claim_tasks`, picking that one task."""
    params = {
        "owner": owner,
        "task_id": task_id,
        "agents": [agent],
        "limit": 1,
        "lease_seconds": lease_seconds,
        "now": now,
    }
    for task_id_, agent_, task_type, payload, *rest, priority, _created_at in fetch(
        CLAIM_TASK_BY_ID, params
    ):
        return ClaimedTask(task_id_, agent_, task_type, json.loads(payload), *rest, priority)
    return None


# Why a named task could not be claimed now (CLAIM_TASK_BY_ID took nothing): read
# after that claim, so a task another claim took meanwhile shows as held.
WHY_NOT_CLAIMABLE = f"""
SELECT t.status, t.available_at > {NOW} AS not_due,
       EXISTS (SELECT FROM paused_agents p WHERE p.agent_name = t.agent_name) AS paused
FROM tasks t WHERE t.id = %(task_id)s
"""


def why_not_claimable(task_id: UUID, now: datetime | None) -> tuple[str, bool, bool] | None:
    """(status, not yet due, agent paused) of the task, or None if there is none."""
    rows = fetch(WHY_NOT_CLAIMABLE, {"task_id": task_id, "now": now})
    return rows[0] if rows else None


# Per agent: when its earliest pending task falls due, or, at its rate limit, when the
# oldest start leaves the window if that is later. An agent at its concurrency limit
# is left out: the end of one of its held tasks wakes its workers (the trigger
# function notify_task_changes, migration queue 0018). Without limits (no agent_limits
# row) only the due time is read.
NEXT_DUE_AT = """
SELECT min(greatest(due.at, window_frees.at))
FROM unnest(%(agents)s::text[]) AS a(name)
CROSS JOIN LATERAL (
    SELECT min(available_at) AS at FROM tasks
    WHERE status = 'pending' AND agent_name = a.name
) AS due
LEFT JOIN agent_limits l ON l.agent_name = a.name
LEFT JOIN LATERAL (
    SELECT min(s.started_at) + make_interval(secs => l.rate_period_seconds) AS at
    FROM agent_starts s
    WHERE l.rate_count IS NOT NULL AND s.agent_name = a.name
      AND s.started_at > now() - make_interval(secs => l.rate_period_seconds)
    HAVING count(*) >= l.rate_count
) AS window_frees ON true
WHERE NOT EXISTS (SELECT FROM paused_agents p WHERE p.agent_name = a.name)
  AND NOT coalesce(
      l.concurrency_limit <= (
          SELECT sum(n) FROM task_counts c
          WHERE c.agent_name = a.name AND c.status IN ('leased', 'running')
      ),
      false
  )
"""


def next_due_at(agents: Sequence[str]) -> datetime | None:
    """When a pending task of ``agents`` can next start (it may be past): paused
    agents' tasks do not count, nor those of an agent at its concurrency limit, so a
    worker of such an agent sleeps until woken; at a rate limit, not before the window
    has room."""
    return fetch(NEXT_DUE_AT, {"agents": list(agents)})[0][0]

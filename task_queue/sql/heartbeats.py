"""A worker's heartbeat (one statement extends its leases, writes progress and its
row), the holders of leases, and the workers' rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple
from uuid import UUID

from task_queue.leases import held_params
from task_queue.sql.db import NOW, execute, fetch, fetch_bound
from task_queue.sql.leasing import TASK_LEASE, ClaimedTask

# The held tasks, each with the progress its handler reported since the last
# heartbeat: a NULL fraction means nothing new, and leaves its columns as they are.
HELD_WITH_PROGRESS = (
    "unnest(%(ids)s::uuid[], %(tokens)s::uuid[], %(fractions)s::float8[], %(messages)s::text[])"
    " AS held(id, lease_token, fraction, message)"
)
# A new report also moves updated_at, so the trigger notify_task_changes (queue 0006)
# tells the task's open pages; a lease extension alone changes neither.
WRITE_PROGRESS = f"""progress = COALESCE(held.fraction, t.progress),
    progress_message = CASE WHEN held.fraction IS NULL THEN t.progress_message
                            ELSE held.message END,
    progress_at = CASE WHEN held.fraction IS NULL THEN t.progress_at ELSE {NOW} END,
    updated_at = CASE WHEN held.fraction IS NULL THEN t.updated_at ELSE {NOW} END"""
EXTEND_AND_WRITE_PROGRESS = TASK_LEASE.extend_statement(
    "t",
    "t.id, t.cancel_requested_at IS NOT NULL, t.lease_expires_at",
    held_rows=HELD_WITH_PROGRESS,
    also_set=WRITE_PROGRESS,
)

# One statement per heartbeat, whatever the worker holds: extend its leases, write
# its handlers' progress (fenced like any write about a task: a worker that lost a
# lease writes nothing to that task), and upsert its row in the registry.
#
# The row's tasks are the leases it still holds. A worker that names every lease it
# holds (%(whole)s: runworker) gives them whole. The worker protocol over HTTP sees a
# remote worker's leases a few at a time (one task's heartbeat, the tasks one claim
# took: %(known)s): its row keeps those it had and adds these, less every task the
# worker no longer holds (each looked up by its id).
HEARTBEAT = f"""
WITH extended AS ({EXTEND_AND_WRITE_PROGRESS}),
registered AS (
    INSERT INTO workers (worker_id, kind, hostname, pid, agents, concurrency, in_flight,
                         memory_bytes, state, task_ids, started_at, last_heartbeat_at)
    SELECT %(owner)s, %(kind)s, %(hostname)s, %(pid)s, %(agents)s::text[], %(concurrency)s,
           cardinality(still_held.ids), %(memory_bytes)s, %(state)s, still_held.ids,
           {NOW}, {NOW}
    FROM (
        SELECT COALESCE(array_agg(id ORDER BY id), '{{}}') AS ids
        FROM (SELECT id FROM extended UNION SELECT unnest(%(known)s::uuid[])) AS held
    ) still_held
    ON CONFLICT (worker_id) DO UPDATE
    SET kind = EXCLUDED.kind, last_heartbeat_at = EXCLUDED.last_heartbeat_at,
        memory_bytes = EXCLUDED.memory_bytes,
        -- A remote worker's state follows from the tasks it still holds.
        (task_ids, in_flight, state) = (
            SELECT ids, cardinality(ids),
                   CASE WHEN %(whole)s THEN EXCLUDED.state
                        WHEN cardinality(ids) > 0 THEN 'busy' ELSE 'idle' END
            FROM (
                SELECT CASE WHEN %(whole)s THEN EXCLUDED.task_ids ELSE ARRAY(
                    SELECT h.id FROM tasks h
                    WHERE h.id = ANY(workers.task_ids || EXCLUDED.task_ids)
                      AND h.lease_owner = %(owner)s AND h.status IN ({TASK_LEASE.held_statuses})
                    ORDER BY h.id
                ) END AS ids
            ) AS merged
        )
),
-- The statement sees workers as it was before: the gap is since the last heartbeat.
gap AS (
    SELECT EXTRACT(EPOCH FROM {NOW} - last_heartbeat_at)::float8 AS seconds
    FROM workers WHERE worker_id = %(owner)s
),
counted AS (
    INSERT INTO worker_heartbeats AS w (worker_id, minute, agents, beats, max_gap_seconds)
    SELECT %(owner)s, date_bin('1 minute', {NOW}, 'epoch'), %(agents)s::text[], 1,
           (SELECT seconds FROM gap)
    ON CONFLICT (worker_id, minute) DO UPDATE
    SET beats = w.beats + 1,
        max_gap_seconds = greatest(w.max_gap_seconds, EXCLUDED.max_gap_seconds)
)
SELECT * FROM extended
"""


class HeldLease(NamedTuple):
    """A lease a heartbeat extended."""

    cancel_requested: bool
    expires_at: datetime


def heartbeat(
    *,
    owner: str,
    held: Sequence[tuple[UUID, UUID]],
    lease_seconds: float,
    hostname: str,
    pid: int,
    agents: Sequence[str],
    concurrency: int,
    now: datetime | None,
    memory_bytes: int | None = None,
    state: str = "idle",
    progress: Sequence[tuple[float, str] | None] = (),
    kind: str = "local",
    whole: bool = True,
    known: Sequence[UUID] = (),
) -> dict[UUID, HeldLease]:
    """Extend every lease in ``held`` (the worker's), write the progress reported for
    them (``progress``: one (fraction, message) or None per held task, in ``held``'s
    order; empty: none) and record that the worker is alive, in ``state``.

    ``whole``: ``held`` is every lease the worker holds. Otherwise (a remote worker)
    its row's tasks are those it had, ``held``'s and ``known``'s, less those it no
    longer holds.

    Returns the leases still held, by task id; a held task missing from the answer was
    lost (expired and reaped, or cancelled).
    """
    reports = list(progress) or [None] * len(held)
    params = held_params(owner, held, now) | {
        "fractions": [r[0] if r else None for r in reports],
        "messages": [r[1] if r else None for r in reports],
        "state": state,
        "lease_seconds": lease_seconds,
        "hostname": hostname,
        "pid": pid,
        "agents": list(agents),
        "concurrency": concurrency,
        "memory_bytes": memory_bytes,
        "kind": kind,
        "whole": whole,
        "known": list(known),
    }
    return {row[0]: HeldLease(row[1], row[2]) for row in fetch(HEARTBEAT, params)}


# Who holds each of these leases (id, lease token), and the length its claim granted:
# the worker protocol's writes name only the task and its lease token, and run
# the fenced statements as that holder. A lease not found is not held any more.
LEASE_HOLDERS = f"""
SELECT t.lease_owner, t.lease_seconds, t.id, t.agent_name, t.task_type, t.attempts,
       t.max_attempts, t.workflow_id, t.trace_id, t.lease_token, t.traceparent, t.priority
FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) AS held(id, lease_token)
JOIN tasks t ON t.id = held.id AND t.lease_token = held.lease_token
-- IS TRUE, as in the completion: a generic plan made while statistics said nothing
-- was held read the whole index of held leases (full of dead entries in a busy
-- drain) for every batch, instead of looking each task up by its id.
WHERE (t.status IN ({TASK_LEASE.held_statuses})) IS TRUE
"""


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    owner: str
    lease_seconds: float | None  # the length its claim granted
    task: ClaimedTask  # without its payload


def lease_holders(held: Sequence[tuple[UUID, UUID]]) -> dict[UUID, LeaseHolder]:
    """The holders of those of ``held`` (id, lease token) still held, by task id."""
    holders = {}
    # Prepared: every outcome batch of the worker protocol runs it (a plan that does not
    # depend on its values: a join on the primary key).
    rows = fetch_bound(LEASE_HOLDERS, held_params(None, held, None), prepared=True)
    for owner, lease_seconds, *columns in rows:
        (
            task_id,
            agent,
            task_type,
            attempts,
            max_attempts,
            workflow,
            trace,
            token,
            parent,
            priority,
        ) = columns
        # The payload is not read: a write about the task does not need it.
        task = ClaimedTask(
            task_id, agent, task_type, {}, attempts, max_attempts, workflow, trace, token,
            None, parent, priority,
        )  # fmt: skip
        holders[task_id] = LeaseHolder(owner, lease_seconds, task)
    return holders


# Remote workers waiting in a long poll are alive: one statement a tick for all of a
# server's waiting workers (automechanica.api.claim_wakeups), not a claim each.
TOUCH_WORKERS = f"""
UPDATE workers SET last_heartbeat_at = {NOW}
WHERE worker_id = ANY(%(owners)s::text[])
"""


def touch_workers(owners: Sequence[str], now: datetime | None = None) -> int:
    """Record that these workers are alive (their rows' heartbeat time); how many."""
    return execute(TOUCH_WORKERS, {"owners": list(owners), "now": now}) if owners else 0


AGENTS_OF = "SELECT id, agent_name FROM tasks WHERE id = ANY(%(ids)s::uuid[])"


def agents_of(ids: Sequence[UUID]) -> dict[UUID, str]:
    """The agent of each of these tasks that exists."""
    return dict(fetch(AGENTS_OF, {"ids": list(ids)})) if ids else {}


DELETE_WORKER = "DELETE FROM workers WHERE worker_id = %(owner)s"


def delete_worker(owner: str) -> None:
    execute(DELETE_WORKER, {"owner": owner})

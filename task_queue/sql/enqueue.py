"""Enqueueing tasks, idempotently, and waking the workers of their agents."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from task_queue.sql.channels import NOTIFY_CHANNEL
from task_queue.sql.db import NOW, fetch, fetch_bound_each
from task_queue.sql.reading import TASK_AS_API

# The columns of a chunk of tasks (enqueue_tasks), one array each, one element a
# task, in the batch's order; and their types.
INPUT_COLUMNS = {
    "id": "uuid", "workflow_id": "uuid", "agent_name": "text", "task_type": "text",
    "payload": "jsonb", "payload_ref": "text", "priority": "int", "max_attempts": "int",
    "available_at": "timestamptz", "delay_seconds": "float8", "idempotency_key": "text",
    "idempotency_fingerprint": "text", "trace_id": "text",
}  # fmt: skip
# Values sent as text and cast (the binary dumper wants one Python type a list).
_SENT_AS_TEXT = {"workflow_id", "payload", "available_at"}
_INPUT = (
    "WITH input AS (SELECT * FROM unnest({arrays}) WITH ORDINALITY AS input({names}, ord))".format(
        arrays=", ".join(
            f"%({name})s::{'text[]::' if name in _SENT_AS_TEXT else ''}{kind}[]"
            for name, kind in INPUT_COLUMNS.items()
        ),
        names=", ".join(INPUT_COLUMNS),
    )
)

# In input order, so created_at (the clock at each row) keeps the order of the batch.
# A task whose idempotency key exists already is skipped (enqueue_tasks finds it).
# Every task gets a trace id (docs/queue.md, "Trace ids"): the caller's; else its
# workflow's (the workflow's id, as hex, for a workflow written without one); else the
# request's (its traceparent header's, one for the batch); else a new trace rooted at
# the task, its own id as 32 hex digits (a W3C trace-id). The workflow is looked up
# only for a task with a workflow and no trace of its own. The batch's traceparent is
# the span that enqueued it (task_queue.tracing), or null.
_INSERT = f"""
INSERT INTO tasks (id, workflow_id, agent_name, task_type, payload, payload_ref, priority,
                   max_attempts, available_at, idempotency_key, idempotency_fingerprint,
                   trace_id, traceparent, created_at, updated_at)
SELECT id, workflow_id, agent_name, task_type, payload, payload_ref, priority, max_attempts,
       COALESCE(available_at, {NOW} + make_interval(secs => COALESCE(delay_seconds, 0))),
       idempotency_key, idempotency_fingerprint,
       COALESCE(
           trace_id,
           CASE WHEN workflow_id IS NOT NULL THEN (
               SELECT COALESCE(w.trace_id, replace(w.id::text, '-', ''))
               FROM workflows w WHERE w.id = input.workflow_id
           ) END,
           %(request_trace_id)s::text,
           replace(id::text, '-', '')
       ),
       %(traceparent)s::text, clock_timestamp(), {NOW}
FROM input
ORDER BY ord
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
"""
INSERT_TASKS = _INPUT + _INSERT

# The same, answering with the tasks it inserted as the API shows them: one JSON array,
# in the order of their ids, which is the order of the batch (time_ordered_ids). It
# saves a second statement that would find each task again by its id.
INSERT_TASKS_AS_API_JSON = f"""
{_INPUT}, t AS ({_INSERT} RETURNING *)
SELECT COALESCE(json_agg(shown ORDER BY t.id), '[]')::text
FROM t CROSS JOIN LATERAL ({TASK_AS_API}) AS shown
"""


FIND_TASKS_BY_IDEMPOTENCY_KEY = """
SELECT idempotency_key, id, idempotency_fingerprint FROM tasks
WHERE idempotency_key = ANY(%(keys)s::text[])
"""


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    id: UUID
    created: bool
    # The task existed already, made by a different request (its fingerprint differs;
    # one keyed before fingerprints were kept, None, matches any request).
    conflicting: bool


def input_columns(ids: Sequence[UUID], rows: Sequence[Mapping[str, Any]]) -> dict[str, list]:
    """A chunk for :func:`enqueue_tasks`: ``ids`` and ``rows`` (``INPUT_COLUMNS``
    after the id, the payload as JSON text) as one list a column."""
    columns: dict[str, list] = {"id": list(ids)}
    for name in INPUT_COLUMNS:
        if name != "id":
            columns[name] = [row[name] for row in rows]
    # One Python type a list (the binary dumper's rule): a delay given as an int is
    # a float8 all the same, and a Priority an int.
    columns["delay_seconds"] = [
        None if delay is None else float(delay) for delay in columns["delay_seconds"]
    ]
    columns["priority"] = [int(priority) for priority in columns["priority"]]
    return columns


def enqueue_tasks(
    chunks: Iterable[dict[str, list]],
    *,
    trace_id: str | None = None,
    traceparent: str | None = None,
    as_api_json: bool = False,
) -> tuple[list[EnqueueResult], str | None]:
    """Insert tasks, a chunk (:func:`input_columns`) a statement; one result per task,
    in order. ``trace_id``: the trace of those naming none (the request's);
    ``traceparent``: the span that enqueued them.

    The chunks are sent as they come (``fetch_bound_each``): a caller that makes them
    lazily makes the next while PostgreSQL inserts the one before.

    A task whose idempotency key exists already (from an earlier transaction, a
    concurrent one that committed first, or earlier in this batch) is not inserted:
    that row's id comes back with ``created`` false, and ``conflicting`` if that
    row's request was not this one (``idempotency_fingerprint``).

    With ``as_api_json``, also the tasks inserted (not those found by their keys) as
    one JSON array (``INSERT_TASKS_AS_API_JSON``); None without.
    """
    ids: list[UUID] = []
    keys: list[str | None] = []
    fingerprints: list[str | None] = []

    def sent() -> Iterator[dict[str, Any]]:
        for columns in chunks:
            ids.extend(columns["id"])
            keys.extend(columns["idempotency_key"])
            fingerprints.extend(columns["idempotency_fingerprint"])
            yield {**columns, "now": None, "request_trace_id": trace_id, "traceparent": traceparent}

    statement = INSERT_TASKS_AS_API_JSON if as_api_json else INSERT_TASKS
    # Prepared: parsing and planning it again for each chunk took about 2 ms of
    # PostgreSQL's 23 a 1,000-task request (docs/performance.md); its plan does not
    # depend on the values.
    answers = fetch_bound_each(statement, sent(), prepared=True)
    inserted = None
    if as_api_json:  # each chunk's array, joined into one
        parts = [rows[0][0][1:-1] for rows in answers if rows[0][0] != "[]"]
        inserted = f"[{','.join(parts)}]"
    keyed = [key for key in keys if key is not None]
    # Each statement sees what committed before it started (READ COMMITTED), so a key
    # the insert skipped for a concurrent transaction's row is found here.
    found = {
        key: (task_id, fingerprint)
        for key, task_id, fingerprint in (
            fetch(FIND_TASKS_BY_IDEMPOTENCY_KEY, {"keys": keyed}) if keyed else []
        )
    }
    results = []
    for id_, key, given in zip(ids, keys, fingerprints, strict=True):
        if key is None:
            results.append(EnqueueResult(id_, True, False))
            continue
        task_id, fingerprint = found[key]
        created = task_id == id_
        conflicting = not created and fingerprint is not None and fingerprint != given
        results.append(EnqueueResult(task_id, created, conflicting))
    return results, inserted


# Delivered when the enqueuing transaction commits, and not at all if it rolls back.
NOTIFY_AGENTS = f"""
SELECT pg_notify('{NOTIFY_CHANNEL}', agent) FROM unnest(%(agents)s::text[]) AS agent
"""


def notify_agents(agents: Sequence[str]) -> None:
    fetch(NOTIFY_AGENTS, {"agents": sorted(set(agents))})

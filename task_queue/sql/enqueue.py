"""Enqueueing tasks, idempotently, and waking the workers of their agents."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any
from uuid import UUID

from django.db import connection

from task_queue.sql.channels import NOTIFY_CHANNEL
from task_queue.sql.db import NOW, fetch
from task_queue.sql.reading import TASK_AS_API

# The tasks being enqueued, streamed in by COPY (no JSON to parse, no parameters to
# quote). One per session, created on its first enqueue; INSERT_STAGED_TASKS empties
# it again, and a commit or a rollback does too.
CREATE_ENQUEUE_INPUT = """
CREATE TEMP TABLE IF NOT EXISTS enqueue_input (
    ord bigint GENERATED ALWAYS AS IDENTITY, id uuid NOT NULL, workflow_id uuid,
    agent_name text NOT NULL, task_type text NOT NULL, payload jsonb NOT NULL,
    payload_ref text, priority int NOT NULL, max_attempts int NOT NULL,
    available_at timestamptz, delay_seconds float8, idempotency_key text,
    idempotency_fingerprint text, trace_id text
) ON COMMIT DELETE ROWS
"""

# The columns a COPY line gives, in order (ord is numbered as the lines arrive).
INPUT_COLUMNS = (
    "id", "workflow_id", "agent_name", "task_type", "payload", "payload_ref", "priority",
    "max_attempts", "available_at", "delay_seconds", "idempotency_key",
    "idempotency_fingerprint", "trace_id",
)  # fmt: skip
COPY_ENQUEUE_INPUT = f"COPY enqueue_input ({', '.join(INPUT_COLUMNS)}) FROM STDIN"

# In input order, so created_at (the clock at each row) keeps the order of the batch.
# A task whose idempotency key exists already is skipped (enqueue_tasks finds it).
# Every task gets a trace id (docs/queue.md, "Trace ids"): the caller's; else its
# workflow's (the workflow's id, as hex, for a workflow written without one); else the
# request's (its traceparent header's, one for the batch); else a new trace rooted at
# the task, its own id as 32 hex digits (a W3C trace-id). The workflow is looked up
# only for a task with a workflow and no trace of its own. The batch's traceparent is
# the span that enqueued it (task_queue.tracing), or null.
_STAGED_INPUT = "WITH input AS (DELETE FROM enqueue_input RETURNING *)"
_INSERT_STAGED = f"""
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
           %(trace_id)s::text,
           replace(id::text, '-', '')
       ),
       %(traceparent)s::text, clock_timestamp(), {NOW}
FROM input
ORDER BY ord
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
"""
INSERT_STAGED_TASKS = _STAGED_INPUT + _INSERT_STAGED

# The same, answering with the tasks it inserted as the API shows them: one JSON array,
# in the order of their ids, which is the order of the batch (time_ordered_ids). It
# saves a second statement that would find each task again by its id.
INSERT_STAGED_TASKS_AS_API_JSON = f"""
{_STAGED_INPUT}, t AS ({_INSERT_STAGED} RETURNING *)
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
    # For a task that existed already: the fingerprint of the request that created it.
    existing_fingerprint: str | None


# COPY's text format: these four characters are escaped, and \N is NULL.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})


_input_values = itemgetter(*INPUT_COLUMNS[1:])


def copy_line(row: Mapping[str, Any]) -> str:
    """A row for COPY (text format), without its line end: ``row``'s values of
    ``INPUT_COLUMNS`` after the id, as their ``str``, None as NULL."""
    # A list, not a generator: join makes one anyway, and a generator costs more.
    return "\t".join(
        [
            "\\N" if value is None else str(value).translate(_COPY_ESCAPES)
            for value in _input_values(row)
        ]
    )


def enqueue_tasks(
    ids: Sequence[UUID],
    lines: Sequence[str],
    keys: Sequence[str | None],
    *,
    trace_id: str | None = None,
    traceparent: str | None = None,
    as_api_json: bool = False,
) -> tuple[list[EnqueueResult], str | None]:
    """Insert tasks, one :func:`copy_line` each (``INPUT_COLUMNS`` after the id);
    one result per input, in order. ``trace_id``: the trace of those naming none (the
    request's); ``traceparent``: the span that enqueued them.

    ``keys`` are the tasks' idempotency keys. A task whose key exists already (from
    an earlier transaction, a concurrent one that committed first, or earlier in
    this batch) is not inserted: that row's id comes back with ``created`` false.

    With ``as_api_json``, also the tasks inserted (not those found by their keys) as
    one JSON array (``INSERT_STAGED_TASKS_AS_API_JSON``); None without.
    """
    with connection.cursor() as cursor:
        cursor.execute(CREATE_ENQUEUE_INPUT)
        with cursor.copy(COPY_ENQUEUE_INPUT) as copy:
            copy.write("".join(f"{id_}\t{line}\n" for id_, line in zip(ids, lines, strict=True)))
        params = {"now": None, "trace_id": trace_id, "traceparent": traceparent}
        if as_api_json:
            cursor.execute(INSERT_STAGED_TASKS_AS_API_JSON, params)
            inserted = cursor.fetchone()[0]
        else:
            cursor.execute(INSERT_STAGED_TASKS, params)
            inserted = None
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
    for id_, key in zip(ids, keys, strict=True):
        if key is None:
            results.append(EnqueueResult(id_, True, None))
            continue
        task_id, fingerprint = found[key]
        created = task_id == id_
        results.append(EnqueueResult(task_id, created, None if created else fingerprint))
    return results, inserted


# Delivered when the enqueuing transaction commits, and not at all if it rolls back.
NOTIFY_AGENTS = f"""
SELECT pg_notify('{NOTIFY_CHANNEL}', agent) FROM unnest(%(agents)s::text[]) AS agent
"""


def notify_agents(agents: Sequence[str]) -> None:
    fetch(NOTIFY_AGENTS, {"agents": sorted(set(agents))})

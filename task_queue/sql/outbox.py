"""The event stream: positions for committed envelopes, reading them, relay cursors
and locks, and retention of relayed envelopes.
"""

from __future__ import annotations

from datetime import datetime

from task_queue.sql import locks
from task_queue.sql.db import execute, fetch

# Positioned stream events emitted before the cutoff, once every relay has relayed
# them (a destination no longer used holds them until its cursor row is deleted).
# The newest positioned event always stays: positions continue from it
# (SEQUENCE_EVENTS). Unpositioned ones stay for the sequencer (the maintenance loop
# runs it before pruning).
PRUNE_STREAM_EVENTS = """
WITH doomed AS (
    SELECT seq FROM event_outbox
    WHERE emitted_at < %(cutoff)s
      AND position < (SELECT max(position) FROM event_outbox)
      AND position <= COALESCE((SELECT min(position) FROM event_relay_cursors), position)
    ORDER BY emitted_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM event_outbox e USING doomed WHERE e.seq = doomed.seq
"""


def prune_stream_events(*, cutoff: datetime, batch: int) -> int:
    return execute(PRUNE_STREAM_EVENTS, {"cutoff": cutoff, "batch": batch})


# Committed events without a position get the next ones, in seq order (an event
# that commits after a run gets a position after that run's, whatever its seq). The run
# must hold locks.EVENT_SEQUENCER and take its snapshot after it (a statement of its
# own before this one). Positions continue from the highest: retention always keeps
# the newest positioned event, so they never start again.
SEQUENCE_EVENTS = """
WITH head AS (
    SELECT COALESCE(max(position), 0) AS position FROM event_outbox
),
unpositioned AS (
    SELECT seq, row_number() OVER (ORDER BY seq) AS n
    FROM (
        SELECT seq FROM event_outbox WHERE position IS NULL ORDER BY seq LIMIT %(limit)s
    ) AS oldest
)
UPDATE event_outbox e
SET position = head.position + unpositioned.n
FROM head, unpositioned
WHERE e.seq = unpositioned.seq
"""


def sequence_events(*, limit: int) -> int:
    """Give up to ``limit`` committed events their stream position; how many got one."""
    locks.advisory_xact_lock(locks.EVENT_SEQUENCER)
    return execute(SEQUENCE_EVENTS, {"limit": limit})


# Each event with the envelope as the stream sends it (seed 000 §3, with its position)
# as JSON text that PostgreSQL writes: reading it as columns and writing it again in
# Python cost a reader about 12 µs an event (a timestamp loaded through Django's
# loader, then formatted again; the payload parsed, then dumped again).
READ_EVENTS = """
SELECT position, message_id, kind, subject_id, trace_id,
       json_build_object(
           'schema_version', schema_version, 'message_id', message_id,
           'trace_id', trace_id, 'causation_id', causation_id, 'kind', kind,
           'emitted_at', to_char(emitted_at AT TIME ZONE 'UTC',
                                 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
           'position', position, 'payload', payload
       )::text
FROM event_outbox
WHERE position > %(after)s
  AND (%(since_time)s::timestamptz IS NULL OR emitted_at >= %(since_time)s::timestamptz)
ORDER BY position
LIMIT %(limit)s
"""


def read_events(*, after: int, limit: int, since_time: datetime | None = None) -> list[tuple]:
    """Positioned events after ``after``, in order (and emitted at or after
    ``since_time``); rows as READ_EVENTS selects them, the envelope as JSON text."""
    return fetch(READ_EVENTS, {"after": after, "limit": limit, "since_time": since_time})


HEAD_POSITION = "SELECT COALESCE(max(position), 0) FROM event_outbox"


def head_position() -> int:
    """The highest position given so far (0 for an empty stream)."""
    return fetch(HEAD_POSITION, {})[0][0]


def try_relay_lock(destination: str) -> bool:
    """One relay per destination: a lock held by this database session until
    :func:`relay_unlock` or the session ends (a killed relay's ends with it)."""
    return locks.try_named_lock(f"relay:{destination}")


def relay_unlock(destination: str) -> None:
    locks.named_unlock(f"relay:{destination}")


RELAY_CURSOR = """
INSERT INTO event_relay_cursors (destination, position, relayed, updated_at)
VALUES (%(destination)s, 0, 0, now())
ON CONFLICT (destination) DO UPDATE SET destination = EXCLUDED.destination
RETURNING position
"""


def relay_cursor(destination: str) -> int:
    """Where relaying to ``destination`` stopped (created at 0 the first time)."""
    return fetch(RELAY_CURSOR, {"destination": destination})[0][0]


# An upsert: an operator may delete the cursor (admin) while its relay runs.
ADVANCE_RELAY_CURSOR = """
INSERT INTO event_relay_cursors (destination, position, relayed, updated_at)
VALUES (%(destination)s, %(position)s, %(relayed)s, now())
ON CONFLICT (destination) DO UPDATE
SET position = greatest(event_relay_cursors.position, EXCLUDED.position),
    relayed = event_relay_cursors.relayed + EXCLUDED.relayed, updated_at = now()
"""


def advance_relay_cursor(*, destination: str, position: int, relayed: int) -> None:
    """Record that the broker confirmed every event up to ``position``."""
    execute(
        ADVANCE_RELAY_CURSOR,
        {"destination": destination, "position": position, "relayed": relayed},
    )

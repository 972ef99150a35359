"""The event stream: one envelope (seed 000 §3) per task transition, message and
publication, read in order by position.

Triggers write the envelopes into ``event_outbox`` in the transaction of the change
(migrations queue 0008 and agents_app 0003). Readers (``relay_events``,
``export_events``) call :func:`next_batch`, which first gives newly committed events
their positions; ``OutboxEvent``'s docstring says why positions and not ``seq``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import transaction

from task_queue.sql import outbox

SEQUENCE_BATCH = 5000


@dataclass(frozen=True)
class Envelope:
    position: int
    schema_version: str
    message_id: UUID
    kind: str
    trace_id: str | None
    causation_id: str | None
    subject_id: str
    emitted_at: datetime
    payload: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """The envelope as seed 000 writes it, with the stream position added."""
        return {
            "schema_version": self.schema_version,
            "message_id": str(self.message_id),
            "trace_id": self.trace_id,
            "causation_id": self.causation_id,
            "kind": self.kind,
            "emitted_at": self.emitted_at.isoformat().replace("+00:00", "Z"),
            "position": self.position,
            "payload": self.payload,
        }

    def to_json(self) -> bytes:
        return json.dumps(self.as_dict(), separators=(",", ":")).encode()


def sequence() -> int:
    """Give every committed event without a position its position; how many."""
    total = 0
    while True:
        with transaction.atomic():
            done = outbox.sequence_events(limit=SEQUENCE_BATCH)
        total += done
        if done < SEQUENCE_BATCH:
            return total


def next_batch(after: int, *, limit: int, since_time: datetime | None = None) -> list[Envelope]:
    """Up to ``limit`` events after position ``after``, in order (only those emitted at
    or after ``since_time``, when given)."""
    sequence()
    rows = outbox.read_events(after=after, limit=limit, since_time=since_time)
    return [_envelope(*row) for row in rows]


def head() -> int:
    """The stream's last position, once every committed event has one: a reader that
    starts after it misses nothing committed before this call."""
    sequence()
    return outbox.head_position()


def _envelope(
    position: int,
    schema_version: str,
    message_id: UUID,
    kind: str,
    trace_id: str | None,
    causation_id: str | None,
    subject_id: str,
    emitted_at: datetime,
    payload: str,
) -> Envelope:
    return Envelope(
        position, schema_version, message_id, kind, trace_id, causation_id, subject_id,
        emitted_at, json.loads(payload),
    )  # fmt: skip

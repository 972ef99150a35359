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
from functools import cached_property
from typing import Any
from uuid import UUID

from django.db import transaction

from task_queue.sql import outbox

SEQUENCE_BATCH = 5000


@dataclass(frozen=True)
class Envelope:
    """One event as read: the columns a reader routes by, and the envelope itself as
    JSON text, written by PostgreSQL (``outbox.READ_EVENTS``). The rest of the envelope
    is parsed from that text only when asked for (a stream filter's payload fields)."""

    position: int
    message_id: UUID
    kind: str
    subject_id: str
    trace_id: str | None
    json_text: str

    # cached_property writes the instance's __dict__ directly, which a frozen dataclass
    # allows and one with slots would not have.
    @cached_property
    def _parsed(self) -> dict[str, Any]:
        return json.loads(self.json_text)

    @property
    def payload(self) -> dict[str, Any]:
        """The event's payload, parsed from the envelope at the first ask."""
        return self._parsed["payload"]

    @property
    def causation_id(self) -> str | None:
        """The id of what caused the event (seed 000 §3), from the envelope."""
        return self._parsed["causation_id"]

    def to_json(self) -> bytes:
        return self.json_text.encode()


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
    return [Envelope(*row) for row in rows]


def head() -> int:
    """The stream's last position, once every committed event has one: a reader that
    starts after it misses nothing committed before this call."""
    sequence()
    return outbox.head_position()

"""Filtering and keyset pagination for the API's lists.

Pages are ordered newest first by (created_at, id) and continue after the last row
of the previous page, so rows inserted meanwhile (which are newer) never shift a
page: no row is repeated or skipped, however many tasks are enqueued while a client
pages through. The cursor is opaque to clients.

Large JSON fields stay in the database: a list selects, per row and field, the value
only when it is at most ``LIST_INLINE_BYTES`` as JSON and not in a blob, and names
the field in ``omitted`` otherwise (:func:`lean`), so a page of 500 rows of 16 MiB
results costs the web process no more than one of small rows.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from django.db.models import (
    BooleanField,
    Case,
    F,
    Func,
    IntegerField,
    JSONField,
    Q,
    QuerySet,
    TextField,
    Value,
    When,
)
from django.db.models.functions import Cast
from django.db.models.lookups import GreaterThan

from task_queue.models import payload_contains

from .errors import ApiError
from .schemas import LIST_INLINE_BYTES, TaskFilters

NEWEST_FIRST = ("-created_at", "-id")
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


def filter_tasks(
    tasks: QuerySet,
    filters: TaskFilters,
    search: Callable[[QuerySet, str], QuerySet] = payload_contains,
) -> QuerySet:
    """``tasks`` narrowed by every filter given; ``q`` by ``search``. The dead letter's
    lists pass its compact table's entries (``DeadLetterEntry``, whose fields have
    the task's names) and ``dead_letter_payload_contains``."""
    conditions = Q()
    if filters.status:
        conditions &= Q(status__in=filters.status)
    for name in ("agent_name", "task_type", "workflow_id", "trace_id", "priority"):
        if (value := getattr(filters, name)) is not None:
            conditions &= Q(**{name: value})
    for name, lookup in (
        ("created_after", "created_at__gte"),
        ("created_before", "created_at__lt"),
        ("updated_after", "updated_at__gte"),
        ("updated_before", "updated_at__lt"),
    ):
        if (value := getattr(filters, name)) is not None:
            conditions &= Q(**{lookup: value})
    tasks = tasks.filter(conditions)
    if filters.q:
        tasks = search(tasks, filters.q)
    return tasks


def lean(rows: QuerySet, empty: dict[str, Any]) -> QuerySet:
    """``rows`` without the large JSON fields named in ``empty`` (field → what a list
    shows in its place): :func:`shown` puts each back when it is small.

    A field is large when its blob reference (``<field>_ref``) is set, or its stored
    size (``pg_column_size``, no decompression) or else its JSON text is over
    ``LIST_INLINE_BYTES``; CASE tests them in that order, so only values already
    small on disk are ever turned into text, and no large value leaves the database.
    """
    limit = Value(LIST_INLINE_BYTES)
    annotations = {}
    for field in empty:
        stored = Func(F(field), function="pg_column_size", output_field=IntegerField())
        text = Func(Cast(field, TextField()), function="octet_length", output_field=IntegerField())
        large = Case(
            When(Q(**{f"{field}_ref__isnull": False}), then=Value(True)),
            When(GreaterThan(stored, limit), then=Value(True)),
            When(GreaterThan(text, limit), then=Value(True)),
            default=Value(False),
            output_field=BooleanField(),
        )
        annotations[f"{field}_large"] = large
        annotations[f"{field}_small"] = Case(
            When(Q(**{f"{field}_large": False}), then=F(field)),
            default=Value(None),
            output_field=JSONField(),
        )
    return rows.defer(*empty).annotate(**annotations)


def shown(items: list[Any], empty: dict[str, Any]) -> list[Any]:
    """Rows of :func:`lean` with each small field back in place, ``empty``'s value for
    a large one, and ``omitted`` naming those."""
    for item in items:
        item.omitted = []
        for field, placeholder in empty.items():
            large = getattr(item, f"{field}_large")
            setattr(item, field, placeholder if large else getattr(item, f"{field}_small"))
            if large:
                item.omitted.append(field)
    return items


def encode_cursor(created_at: datetime, row_id: UUID) -> str:
    raw = json.dumps([created_at.isoformat(), str(row_id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    """The position a cursor stands for. Anything but a cursor this API made is a 422,
    whatever it decodes to (deeply nested JSON, other types, any time offset)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, row_id = json.loads(raw)
        when = datetime.fromisoformat(created_at)
        if when.tzinfo is None:
            raise ValueError("naive time")
        return when.astimezone(UTC), UUID(row_id)
    except Exception:  # every malformed cursor gets the same answer
        raise ApiError.invalid("cursor", "is not a cursor this API returned") from None


def page(
    rows: QuerySet,
    *,
    cursor: str | None,
    limit: int,
    read: Callable[[QuerySet], QuerySet] | None = None,
) -> tuple[list[Any], str | None]:
    """One page of ``rows`` (newest first) after ``cursor``, and the next page's cursor.

    With ``read``, ``rows`` only choose the page (the dead letter's compact entries):
    ``read`` is given the page's slice of them and returns the rows to show, which
    have the same ``created_at`` and ``id``; the page is read in one statement."""
    rows = rows.order_by(*NEWEST_FIRST)
    if cursor:
        created_at, row_id = decode_cursor(cursor)
        rows = rows.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, id__lt=row_id))
    rows = rows[: limit + 1]
    items = list(read(rows).order_by(*NEWEST_FIRST) if read else rows)
    if len(items) <= limit:
        return items, None
    last = items[limit - 1]
    return items[:limit], encode_cursor(last.created_at, last.id)

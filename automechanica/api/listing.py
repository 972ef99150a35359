"""Filtering and keyset pagination for the API's lists.

Pages are ordered newest first by (created_at, id) and continue after the last row
of the previous page, so rows inserted meanwhile (which are newer) never shift a
page: no row is repeated or skipped, however many tasks are enqueued while a client
pages through. The cursor is opaque to clients.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from django.db.models import Q, QuerySet

from task_queue.models import payload_contains

from .errors import ApiError
from .schemas import TaskFilters

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


def filter_tasks(tasks: QuerySet, filters: TaskFilters) -> QuerySet:
    """``tasks`` narrowed by every filter given."""
    conditions = Q()
    if filters.status:
        conditions &= Q(status__in=filters.status)
    for name in ("agent_name", "task_type", "workflow_id", "priority"):
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
        tasks = payload_contains(tasks, filters.q)
    return tasks


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


def page(rows: QuerySet, *, cursor: str | None, limit: int) -> tuple[list[Any], str | None]:
    """One page of ``rows`` (newest first) after ``cursor``, and the next page's cursor."""
    rows = rows.order_by("-created_at", "-id")
    if cursor:
        created_at, row_id = decode_cursor(cursor)
        rows = rows.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, id__lt=row_id))
    items = list(rows[: limit + 1])
    if len(items) <= limit:
        return items, None
    last = items[limit - 1]
    return items[:limit], encode_cursor(last.created_at, last.id)

"""LISTEN on a channel, on a connection of its own (the one way every part of the
product waits for a NOTIFY: workers, message and publication readers, dashboards).

Notifications are sent by ``pg_notify`` in the writer's transaction, so they arrive
only for committed changes. A LISTEN needs a connection in autocommit mode that is
not Django's (Django's is shared with the caller's transactions), opened with
Django's connection settings.

A connection listening on one of the channels whose notifications are sent only while
someone listens (the dashboard's and the event stream's, ``REGISTERED_CHANNELS``)
says so in ``channel_listeners`` first, and takes its row back when it stops.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
from asgiref.sync import sync_to_async
from django.db import connection

from task_queue.sql.channels import (
    REGISTER_LISTENER,
    REGISTERED_CHANNELS,
    SWEEP_LISTENERS,
    UNREGISTER_LISTENER,
)


def connection_params() -> dict[str, Any]:
    """Django's connection parameters, for a psycopg connection of one's own."""
    params = connection.get_connection_params()
    # Django's own, for its synchronous connections.
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return params


def _listen(channel: str) -> str:
    # Channel names are the code's own constants; they are checked rather than quoted
    # so that the statement reads as they are named (pg_stat_activity shows it).
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", channel):
        raise ValueError(f"not a channel name: {channel!r}")
    return f"LISTEN {channel}"


def _opening(channel: str) -> list[tuple[str, dict[str, str] | None]]:
    """The statements that start listening on ``channel``: on a registered channel,
    the sweep of stale rows and the registration first (task_queue.sql.channels)."""
    listen = (_listen(channel), None)
    if channel not in REGISTERED_CHANNELS:
        return [listen]
    return [(SWEEP_LISTENERS, None), (REGISTER_LISTENER, {"channel": channel}), listen]


def _closing(channel: str) -> list[tuple[str, dict[str, str]]]:
    """The statement that takes a registered listener's row back (none otherwise); a
    lost connection cannot run it, and its row is swept by the next listener."""
    return [(UNREGISTER_LISTENER, {"channel": channel})] if channel in REGISTERED_CHANNELS else []


@contextmanager
def listening(channel: str) -> Iterator[psycopg.Connection]:
    """A connection of its own, listening on ``channel``; read it with ``notifies()``."""
    with psycopg.connect(**connection_params(), autocommit=True) as conn:
        try:
            for statement, params in _opening(channel):
                conn.execute(statement, params)
            yield conn
        finally:
            with contextlib.suppress(psycopg.Error):
                for statement, params in _closing(channel):
                    conn.execute(statement, params)


@asynccontextmanager
async def listening_async(channel: str) -> AsyncIterator[psycopg.AsyncConnection]:
    """``listening`` for asyncio code (the dashboard's hub)."""
    params = await sync_to_async(connection_params)()
    async with await psycopg.AsyncConnection.connect(**params, autocommit=True) as conn:
        try:
            for statement, values in _opening(channel):
                await conn.execute(statement, values)
            yield conn
        finally:
            with contextlib.suppress(psycopg.Error):
                for statement, values in _closing(channel):
                    await conn.execute(statement, values)

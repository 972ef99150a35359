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


@contextmanager
def listening(channel: str) -> Iterator[psycopg.Connection]:
    """A connection of its own, listening on ``channel``; read it with ``notifies()``."""
    listen, registered = _listen(channel), channel in REGISTERED_CHANNELS
    with psycopg.connect(**connection_params(), autocommit=True) as conn:
        try:
            if registered:
                conn.execute(SWEEP_LISTENERS)
                conn.execute(REGISTER_LISTENER, {"channel": channel})
            conn.execute(listen)
            yield conn
        finally:
            if registered:
                with contextlib.suppress(psycopg.Error):  # a lost connection: swept later
                    conn.execute(UNREGISTER_LISTENER, {"channel": channel})


@asynccontextmanager
async def listening_async(channel: str) -> AsyncIterator[psycopg.AsyncConnection]:
    """``listening`` for asyncio code (the dashboard's hub)."""
    listen, registered = _listen(channel), channel in REGISTERED_CHANNELS
    params = await sync_to_async(connection_params)()
    async with await psycopg.AsyncConnection.connect(**params, autocommit=True) as conn:
        try:
            if registered:
                await conn.execute(SWEEP_LISTENERS)
                await conn.execute(REGISTER_LISTENER, {"channel": channel})
            await conn.execute(listen)
            yield conn
        finally:
            if registered:
                with contextlib.suppress(psycopg.Error):
                    await conn.execute(UNREGISTER_LISTENER, {"channel": channel})

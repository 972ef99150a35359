"""LISTEN on a channel, on a connection of its own (the one way every part of the
product waits for a NOTIFY: workers, message and publication readers, dashboards).

Notifications are sent by ``pg_notify`` in the writer's transaction, so they arrive
only for committed changes. A LISTEN needs a connection in autocommit mode that is
not Django's (Django's is shared with the caller's transactions), opened with
Django's connection settings.

``heard`` checks that a LISTEN is in effect: a notification sent from another
connection, as writers send theirs, must come back. Behind a pooler in transaction mode
LISTEN needs a connection of its own to the database (``DATABASE_LISTEN_URL``).

A connection listening on one of the channels whose notifications are sent only while
someone listens (the dashboard's and the event stream's, ``REGISTERED_CHANNELS``)
says so in ``channel_listeners`` first, and takes its row back when it stops.
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import psycopg
from asgiref.sync import sync_to_async
from django.conf import settings

from task_queue.sql.channels import (
    NOTIFY_PROBE,
    REGISTER_LISTENER,
    REGISTERED_CHANNELS,
    SWEEP_LISTENERS,
    UNREGISTER_LISTENER,
)
from task_queue.sql.connections import connection_params, listen_params, listen_sessions_shared

logger = logging.getLogger(__name__)


def _listen(channel: str, verb: str = "LISTEN") -> str:
    # Channel names are the code's own constants; they are checked rather than quoted
    # so that the statement reads as they are named (pg_stat_activity shows it).
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", channel):
        raise ValueError(f"not a channel name: {channel!r}")
    return f"{verb} {channel}"


def _opening(channel: str, shared: bool) -> list[tuple[str, dict[str, str] | None]]:
    """The statements that start listening on ``channel``: on a registered channel,
    the sweep of stale rows and the registration first (task_queue.sql.channels).
    None where server sessions are ``shared`` (a pooler in transaction mode): the
    LISTEN and the registration would stay on a server session that the pooler hands
    to other clients, and nothing would come back."""
    if shared:
        return []
    listen = (_listen(channel), None)
    if channel not in REGISTERED_CHANNELS:
        return [listen]
    return [(SWEEP_LISTENERS, None), (REGISTER_LISTENER, {"channel": channel}), listen]


def _closing(channel: str, shared: bool) -> list[tuple[str, dict[str, str]]]:
    """The statement that takes a registered listener's row back (none otherwise); a
    lost connection cannot run it, and its row is swept by the next listener."""
    registered = channel in REGISTERED_CHANNELS and not shared
    return [(UNREGISTER_LISTENER, {"channel": channel})] if registered else []


@contextmanager
def listening(channel: str) -> Iterator[psycopg.Connection]:
    """A connection of its own, listening on ``channel``; read it with ``notifies()``.
    Where its server session would be shared (a pooler in transaction mode, and no
    ``DATABASE_LISTEN_URL``) it does not listen, and ``heard`` says so at once."""
    shared = listen_sessions_shared()
    with psycopg.connect(**listen_params(), autocommit=True) as conn:
        try:
            for statement, params in _opening(channel, shared):
                conn.execute(statement, params)
            yield conn
        finally:
            with contextlib.suppress(psycopg.Error):
                for statement, params in _closing(channel, shared):
                    conn.execute(statement, params)


@asynccontextmanager
async def listening_async(channel: str) -> AsyncIterator[psycopg.AsyncConnection]:
    """``listening`` for asyncio code (the dashboard's hub)."""
    params = await sync_to_async(listen_params, thread_sensitive=False)()
    shared = await sync_to_async(listen_sessions_shared, thread_sensitive=False)()
    async with await psycopg.AsyncConnection.connect(**params, autocommit=True) as conn:
        try:
            for statement, values in _opening(channel, shared):
                await conn.execute(statement, values)
            yield conn
        finally:
            with contextlib.suppress(psycopg.Error):
                for statement, values in _closing(channel, shared):
                    await conn.execute(statement, values)


# A notification takes milliseconds; one that has not come in this long is not coming.
HEARD_WITHIN_SECONDS = 2.0


def heard(conn: psycopg.Connection, timeout: float) -> bool:
    """Whether a notification sent from another connection reaches ``conn`` within
    ``timeout`` seconds: whether its LISTEN is in effect.

    Behind a pooler in transaction mode (PgBouncer's) it is not: the LISTEN ran on a
    server session that the pooler handed on to other clients as soon as it had run,
    and no notification comes back. The LISTEN itself succeeds, so only a round trip
    tells. Notifications on ``conn``'s other channels that arrive meanwhile are
    consumed: the caller looks for work afterwards in any case.
    """
    if listen_sessions_shared():
        return False  # nothing listens (``_opening``)
    channel = _probe_channel()
    conn.execute(_listen(channel))
    try:
        with psycopg.connect(**connection_params(), autocommit=True) as other:
            other.execute(NOTIFY_PROBE, {"channel": channel})
        with contextlib.closing(conn.notifies(timeout=timeout)) as notes:
            return any(note.channel == channel for note in notes)
    finally:
        conn.execute(_listen(channel, "UNLISTEN"))


async def heard_async(conn: psycopg.AsyncConnection, timeout: float) -> bool:
    """``heard`` for asyncio code (the claims' wake-ups)."""
    if await sync_to_async(listen_sessions_shared, thread_sensitive=False)():
        return False  # nothing listens (``_opening``)
    channel = _probe_channel()
    await conn.execute(_listen(channel))
    try:
        params = await sync_to_async(connection_params, thread_sensitive=False)()
        async with await psycopg.AsyncConnection.connect(**params, autocommit=True) as other:
            await other.execute(NOTIFY_PROBE, {"channel": channel})
        async with contextlib.aclosing(conn.notifies(timeout=timeout)) as notes:
            async for note in notes:
                if note.channel == channel:
                    return True
        return False
    finally:
        await conn.execute(_listen(channel, "UNLISTEN"))


def _probe_channel() -> str:
    return f"listen_probe_{secrets.token_hex(8)}"


def warn_not_in_effect(shared: bool, instead: str) -> None:
    """Say in a WARNING that LISTEN is not in effect, why, and what is done ``instead``.
    ``shared``: because it would go through a pooler in transaction mode
    (``listen_sessions_shared``); otherwise ``heard`` found no notification coming."""
    if shared:
        why = (
            "DATABASE_URL reaches a pooler in transaction mode: set DATABASE_LISTEN_URL "
            "to the database itself"
        )
    elif settings.DATABASE_LISTEN_URL:
        why = (
            f"a notification did not arrive within {HEARD_WITHIN_SECONDS:.0f} s: "
            "DATABASE_LISTEN_URL must reach the database DATABASE_URL does"
        )
    else:
        why = f"a notification did not arrive within {HEARD_WITHIN_SECONDS:.0f} s"
    logger.warning("LISTEN is not in effect (%s); %s", why, instead)

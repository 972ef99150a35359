"""Connections beside Django's: their parameters, and whether this process may run
prepared statements, asked once of the server it reaches (``QUEUE_PREPARED_STATEMENTS``:
``auto``, the default, or on or off), and whether their server sessions are their own.

Behind a pooler that shares server sessions between its clients (PgBouncer in
transaction or statement mode), a prepared statement lives on whichever server
connection the client had at the time; the client's next transaction may run on
another one ("prepared statement does not exist"), and another client on that one
("already exists"). PgBouncer 1.21 and later can keep protocol-level prepared
statements apart per client (``max_prepared_statements``; from 1.22 it also takes
the ``DEALLOCATE ALL`` psycopg sends after a rollback); 1.18 (Debian 12's) never
does. A process finding such a pooler turns prepared statements off (set
``QUEUE_PREPARED_STATEMENTS=1`` behind a pooler known to keep them apart), sets a
worker's claim and outcome settings per transaction instead of per connection
(``leasing.claiming``), and does not LISTEN (``task_queue.listen``).

The check asks the server which backend serves each of two connections, turn about,
several times: a connection of its own keeps its one backend for as long as it is
open, and no other connection has it meanwhile. Behind a pooler in transaction mode a
client gets a backend per transaction: the second connection soon gets the first
one's (PgBouncer hands out the one released last), or, when other clients keep the
pool busy, either gets another. A direct connection can never look shared, so the
check cannot turn prepared statements off where they work. It can miss a pooler that
hands each of the two a server connection of its own every time (PgBouncer with
``server_round_robin`` and exactly two idle ones): set ``DATABASE_SESSIONS=shared``
there.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg.conninfo
from django.conf import settings
from django.db import connection, transaction

logger = logging.getLogger(__name__)


def connection_params() -> dict[str, Any]:
    """Django's connection parameters, for a psycopg connection of one's own."""
    params = connection.get_connection_params()
    # Django's own, for its synchronous connections.
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return params


def listen_params() -> dict[str, Any]:
    """The parameters of a LISTEN connection: ``DATABASE_LISTEN_URL`` where it is set
    (the database reached directly, beside a ``DATABASE_URL`` through a pooler),
    Django's otherwise."""
    url = settings.DATABASE_LISTEN_URL
    if not url:
        return connection_params()
    # As Django's connections, which wait at most this long for a server.
    return {"connect_timeout": 10} | psycopg.conninfo.conninfo_to_dict(url)


def listen_sessions_shared() -> bool:
    """Whether a LISTEN connection would share its server session with other clients:
    it goes where ``DATABASE_URL`` does, and that is a pooler in transaction mode."""
    return not settings.DATABASE_LISTEN_URL and sessions_shared()


_lock = threading.Lock()
_shared: bool | None = None  # this process's answer, once asked


def prepared_statements_allowed() -> bool:
    """Whether statements asked to be prepared are: ``QUEUE_PREPARED_STATEMENTS`` on
    or off, or with ``auto`` unless server sessions are shared (``sessions_shared``)."""
    setting = settings.QUEUE_PREPARED_STATEMENTS
    return bool(setting) if setting != "auto" else not sessions_shared()


def sessions_shared() -> bool:
    """Whether this process's connections (Django's, and those of ``connection_params``)
    share server sessions with other clients (a pooler in transaction or statement
    mode): ``DATABASE_SESSIONS``, or with ``auto`` asked of the server once per process
    (``probe_sessions_shared``), and said once in a WARNING when they are. Database
    errors are Django's, as a statement's would be."""
    global _shared
    if settings.DATABASE_SESSIONS != "auto":
        return settings.DATABASE_SESSIONS == "shared"
    if _shared is not None:
        return _shared
    with _lock:
        if _shared is None:
            with connection.wrap_database_errors:
                _shared = probe_sessions_shared()
            if _shared:
                logger.warning(
                    "the database is reached through a pooler that shares server sessions "
                    "between clients (PgBouncer in transaction mode?): each claim and "
                    "outcome batch sets its settings in a transaction of its own, "
                    "prepared statements are %s (QUEUE_PREPARED_STATEMENTS=%s), and "
                    "LISTEN %s",
                    "on" if prepared_statements_allowed() else "off",
                    settings.QUEUE_PREPARED_STATEMENTS,
                    "goes to DATABASE_LISTEN_URL"
                    if settings.DATABASE_LISTEN_URL
                    else "is not used (set DATABASE_LISTEN_URL to the database itself)",
                )
    return _shared


BACKEND = "SELECT pg_backend_pid()"
ROUNDS = 10  # turns each connection asks


def probe_sessions_shared() -> bool:
    """Whether two connections, asking in turn, do not each keep one backend of their
    own (the check this module's docstring describes)."""
    params = {"connect_timeout": 10} | connection_params()
    with (
        psycopg.connect(**params, autocommit=True) as first,
        psycopg.connect(**params, autocommit=True) as second,
    ):
        seen: tuple[set[int], set[int]] = (set(), set())
        for _ in range(ROUNDS):
            for conn, backends in zip((first, second), seen, strict=True):
                backends.add(conn.execute(BACKEND).fetchone()[0])
    return any(len(backends) > 1 for backends in seen) or bool(seen[0] & seen[1])


@contextmanager
def settings_scope(
    per_connection: Callable[[], object], per_transaction: Callable[[], object]
) -> Iterator[None]:
    """Run the block with a worker's session settings: set on its connection, a
    worker's own, once (``per_connection``), the block in autocommit; or, where server
    sessions are shared (``sessions_shared``), in a transaction of its own whose
    settings end with it (``per_transaction``), so that no other client of the pooler
    inherits them. The second costs three more round trips a block: for claims, in
    queue_bench, 2 to 7 µs of PostgreSQL's CPU and 7 to 9 µs of the worker's a task,
    and a tenth of the drain rate."""
    if sessions_shared():
        with transaction.atomic():
            per_transaction()
            yield
    else:
        per_connection()
        yield

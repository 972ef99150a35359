"""Running a named statement on Django's connection, and the clock statements share.

Each function of the ``sql`` modules runs one statement on Django's connection for
the calling thread, so it joins the caller's transaction when there is one (enqueue
inside ``transaction.atomic`` rolls back with it).

Time: statements that depend on the clock take ``now``; ``None`` means the
database's ``now()``. Tests pass a time to step through backoff without sleeping.
"""

from __future__ import annotations

import sys
import weakref
from datetime import datetime
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection
from psycopg.types.array import ListBinaryDumper

# The statement's time: inlined rather than joined from a CTE, so the planner can
# use it as an index bound.
NOW = "COALESCE(%(now)s::timestamptz, now())"


def fetch(sql: str, params: dict[str, Any]) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def fetch_bound(sql: str, params: dict[str, Any], *, prepared: bool = False) -> list[tuple]:
    """``fetch``, with the parameters sent apart from the statement (server-side
    binding) instead of quoted into its text, as Django's cursors do, and lists sent
    as binary arrays.

    For a worker's batch statements: quoting their arrays of ids, tokens and results
    took about a fifth of a worker's time during a drain (py-spy), and PostgreSQL then
    parsed them back out of the text. Bound as text, psycopg still wrote each list
    as an array literal in Python, escaping every element: 7 to 10 µs per task for a
    completion's five arrays, against under 1 µs in binary. Same connection,
    transaction and Django error classes as ``fetch``.

    ``prepared``: run it as a prepared statement (unless ``QUEUE_PREPARED_STATEMENTS``
    is off), parsed once per connection; after its first runs PostgreSQL may keep one
    generic plan for it, so write it for a plan that does not depend on its values.
    Otherwise, and by default, every run is parsed and planned for its own values.
    """
    connection.ensure_connection()
    connection.validate_no_broken_transaction()  # as Django's own cursors do
    prepared = prepared and settings.QUEUE_PREPARED_STATEMENTS
    if prepared:
        _allow_prepared_statements(connection.connection)
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        cursor.adapters.register_dumper(list, ListBinaryDumper)
        cursor.execute(sql, params, prepare=prepared)
        return cursor.fetchall()


# psycopg prepares a statement once it has run this many times on a connection, or
# at once when asked to (prepare=True): here, never unasked.
_ONLY_WHEN_ASKED = sys.maxsize


def _allow_prepared_statements(conn: psycopg.Connection) -> None:
    """Let ``conn`` prepare the statements it is asked to, and no other.

    Django opens connections with psycopg's prepared statements off, so that they work
    through a pooler that cannot keep them (PgBouncer in transaction mode); such a
    deployment turns ``QUEUE_PREPARED_STATEMENTS`` off.
    """
    if conn.prepare_threshold is None:
        conn.prepare_threshold = _ONLY_WHEN_ASKED


# The session statements each connection has run; a new connection (after the
# database restarted, say) runs them again.
_set_up: weakref.WeakKeyDictionary[psycopg.Connection, set[str]] = weakref.WeakKeyDictionary()


def set_up_session(statement: str) -> None:
    """Run ``statement`` (session settings, ``set_config(..., false)``, outside a
    transaction) on this thread's connection, once per connection."""
    connection.ensure_connection()
    done = _set_up.setdefault(connection.connection, set())
    if statement not in done:
        fetch(statement, {})
        done.add(statement)


DATABASE_CLOCK = "SELECT clock_timestamp()"


def database_clock() -> datetime:
    """The database server's time now: what task timestamps are written with."""
    return fetch(DATABASE_CLOCK, {})[0][0]


def execute(sql: str, params: dict[str, Any]) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


# SET LOCAL statement_timeout, with the time as a parameter: it ends with the
# caller's transaction.
LIMIT_STATEMENT_TIME = "SELECT set_config('statement_timeout', %(timeout)s, true)"


def limit_statement_time(seconds: float) -> None:
    """Bound each later statement of the caller's transaction to ``seconds``: past it
    PostgreSQL cancels the statement (``QueryCanceled``, a Django ``OperationalError``)."""
    fetch(LIMIT_STATEMENT_TIME, {"timeout": f"{max(1, round(seconds * 1000))}ms"})

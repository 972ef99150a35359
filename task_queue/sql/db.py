"""Running a named statement on Django's connection, and the clock statements share.

Each function of the ``sql`` modules runs one statement on Django's connection for
the calling thread, so it joins the caller's transaction when there is one (enqueue
inside ``transaction.atomic`` rolls back with it).

Time: statements that depend on the clock take ``now``; ``None`` means the
database's ``now()``. Tests pass a time to step through backoff without sleeping.
"""

from __future__ import annotations

import sys
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from django.db import connection
from psycopg.types.array import ListBinaryDumper

from .connections import prepared_statements_allowed

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
    prepared = _may_prepare(prepared)
    with connection.wrap_database_errors, _bound_cursor() as cursor:
        cursor.execute(sql, params, prepare=prepared)
        return cursor.fetchall()


def fetch_bound_each(
    sql: str, each_params: Iterable[dict[str, Any]], *, prepared: bool = False
) -> list[list[tuple]]:
    """``fetch_bound`` of ``sql`` with each of ``each_params`` in turn, in psycopg's
    pipeline mode: each run is sent as soon as its parameters are made, and the next
    are made (the iterable's own work, in Python) while PostgreSQL runs it, on the
    other core. Their rows, in order, once all have run. ``prepared`` as for
    ``fetch_bound``.

    An exception from ``each_params`` stops it there, and the caller's transaction
    (which this must run in: the runs before were sent) rolls back with it. If a run
    sent before had failed, psycopg logs that error and the exception is raised.
    """
    require_transaction("fetch_bound_each")  # outside one, ending the pipeline commits
    connection.ensure_connection()
    connection.validate_no_broken_transaction()
    prepared = _may_prepare(prepared)
    cursors: list[psycopg.Cursor] = []
    try:
        with connection.wrap_database_errors:
            with connection.connection.pipeline():
                for params in each_params:
                    cursors.append(_bound_cursor())
                    cursors[-1].execute(sql, params, prepare=prepared)
            # The pipeline has ended: every result is in (a statement with none: []).
            return [cursor.fetchall() if cursor.description else [] for cursor in cursors]
    finally:
        for cursor in cursors:
            cursor.close()


def _bound_cursor() -> psycopg.Cursor:
    """A server-side binding cursor on Django's connection, lists sent as binary arrays."""
    cursor = psycopg.Cursor(connection.connection)
    cursor.adapters.register_dumper(list, ListBinaryDumper)
    return cursor


# psycopg prepares a statement once it has run this many times on a connection, or
# at once when asked to (prepare=True): here, never unasked.
_ONLY_WHEN_ASKED = sys.maxsize


def _may_prepare(asked: bool) -> bool:
    """Whether a statement ``asked`` to be prepared is (``QUEUE_PREPARED_STATEMENTS``);
    if so, this thread's connection is let prepare the statements it is asked to, and
    no other.

    Django opens connections with psycopg's prepared statements off, so that they work
    through a pooler that cannot keep them (PgBouncer in transaction mode); behind
    one, these are off too (``task_queue.sql.connections``).
    """
    if not (asked and prepared_statements_allowed()):
        return False
    if connection.connection.prepare_threshold is None:
        connection.connection.prepare_threshold = _ONLY_WHEN_ASKED
    return True


@dataclass(slots=True)
class _PlanBasis:
    table_bytes: int  # the size plans were made for: the smallest read since then
    checked_at: float  # time.monotonic() of the last read


# What this module remembers of each connection; a new connection (after the
# database restarted, say) starts afresh.
@dataclass(slots=True)
class _Session:
    set_up: set[str] = field(default_factory=set)  # the session statements it has run
    plan_bases: dict[str, _PlanBasis] = field(default_factory=dict)  # by table


_sessions: weakref.WeakKeyDictionary[psycopg.Connection, _Session] = weakref.WeakKeyDictionary()


def _session() -> _Session:
    connection.ensure_connection()
    return _sessions.setdefault(connection.connection, _Session())


def set_up_session(statement: str) -> None:
    """Run ``statement`` (session settings, ``set_config(..., false)``, outside a
    transaction) on this thread's connection, once per connection."""
    done = _session().set_up
    if statement not in done:
        fetch(statement, {})
        done.add(statement)


def require_transaction(what: str) -> None:
    """Refuse to go on outside a transaction: ``set_config(..., true)`` there would
    last one statement."""
    if not connection.in_atomic_block:
        raise RuntimeError(f"{what} needs the caller's transaction")


TABLE_BYTES = "SELECT pg_relation_size(%(table)s::regclass)"
DISCARD_PLANS = "DISCARD PLANS"
PLANS_REMADE_AT_GROWTH = 2  # remade once the table is this many times as large
PLANS_REMADE_FROM_BYTES = 1 << 20  # a table under this size never has them remade
PLANS_CHECKED_EVERY_SECONDS = 0.1


def remake_plans_when_grown(table: str) -> None:
    """Discard this thread's connection's cached plans (its prepared statements' and
    PL/pgSQL's) once ``table`` has grown to twice the size it had when they were made,
    and to 1 MB at least, so that each is made again for the table as it is now. Reads
    the size at most every ``PLANS_CHECKED_EVERY_SECONDS``; the first read on a
    connection, and any smaller size read later, is taken as the size its plans were
    made for.

    Why: a worker's sessions run one generic plan per prepared statement
    (``force_generic_plan``), made at its first run, with the planner's picture of the
    table then. A worker that starts on an empty queue makes its claim's plan for an
    empty ``tasks``, where reading every task costs nothing; when a burst of 20,000
    arrived, that plan updated the claimed tasks by reading every task, 70-340 ms a
    claim, and the drain ran 2-4x slower. PostgreSQL makes plans again when the table
    is analysed (autovacuum, some 50 changes later on an empty table, within its
    ``autovacuum_naptime``) and after some catalog changes, such as any session's
    first temporary table: until 2026-11-26 the bulk enqueue made one, and so remade
    every plan by chance. This does it on purpose: one size read per tenth of a second
    of claims or outcomes, and each statement planned once more per doubling.

    A plan made again still sees the table through its last ``ANALYZE``: statistics
    taken while the table had pages but no rows (between a drain that deleted every
    task and its vacuum) say no rows whatever its size, until it is analysed again.
    """
    bases = _session().plan_bases
    now = time.monotonic()
    if table in bases and now - bases[table].checked_at < PLANS_CHECKED_EVERY_SECONDS:
        return
    ((size,),) = fetch(TABLE_BYTES, {"table": table})
    basis = min(bases[table].table_bytes, size) if table in bases else size
    if size >= max(PLANS_REMADE_FROM_BYTES, PLANS_REMADE_AT_GROWTH * basis):
        execute(DISCARD_PLANS, {})
        basis = size
    bases[table] = _PlanBasis(basis, now)


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

"""One lease, for every table whose rows are leased to a holder for a while: tasks
(``task_queue.sql.leasing``), embedding jobs (``agents_app.sql.memory``), agent
messages (``agents_app.sql.messages``) and publication deliveries
(``agents_app.sql.pubsub``).

- **Grant.** A claim gives the row a fresh token (and records its owner, where the
  table has one) and an end: the statement's clock plus the lease's seconds. The
  rows one statement grants share its token: a grant is told apart by row and token
  together, and every statement draws a new one.
- **Fence.** Every write the holder makes about the row names the row, the token
  and the owner, and touches the row only while that lease still holds it. A holder
  whose lease ran out and whose row was leased again finds its write refused.
- **Extend.** A heartbeat moves the end of every lease it still holds.
- **Expire and recover.** A lease whose end has passed no longer protects its row:
  recovery gives such rows back (to be leased again, or dead once their attempts are
  spent), one process per table at a time (an advisory lock in ``sql.locks``).
- **Back off.** A retried failure waits ``attempt² × base delay`` seconds.
- **Clock.** Every comparison uses ``COALESCE(%(now)s, <the table's clock>)``, so
  tests pass a time instead of sleeping.

Each table's statements are written with the fragments of its :class:`Lease`, so
the four tables share one definition of each step.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from django.db import transaction

from task_queue.sql import locks
from task_queue.sql.db import fetch

T = TypeVar("T")

# Rows a recovery gives back per pass, oldest lease end first; the rest wait for the
# next pass. Rows someone holds are skipped, so recovery never waits on a lock.
RECOVERY_BATCH = 1000


@dataclass(frozen=True)
class Lease:
    """How one table holds its leases: its columns, and the statuses of a held row."""

    table: str
    # The fencing token, fresh at every grant.
    token: str
    # When the lease ends.
    ends: str
    # The statuses in which a row is held.
    held: tuple[str, ...]
    # The advisory lock under which recovery runs (one process per table at a time).
    recovery_lock: int
    # The holder's name, where the table records it.
    owner: str | None = None
    # The id column's SQL type (for the arrays a batch passes).
    id_type: str = "uuid"
    # The database's clock when the caller passes none: now() (the transaction's
    # start) or clock_timestamp() (where a long transaction must see time move).
    clock: str = "now()"
    # Whether the end is cleared with the token when the lease is given up (messages
    # keep theirs: it is when the row is next visible).
    ends_cleared: bool = True

    @property
    def now(self) -> str:
        return f"COALESCE(%(now)s::timestamptz, {self.clock})"

    @property
    def held_statuses(self) -> str:
        return ", ".join(f"'{status}'" for status in self.held)

    def grant(self, seconds: str = "%(lease_seconds)s") -> str:
        """SET items that lease the row to ``%(owner)s`` for ``seconds``."""
        items = [
            # A subquery that refers to no row runs once per statement: one draw from
            # the kernel's random source instead of one per row (gen_random_uuid reads
            # it at every call, 2.6-3.5 µs on the embedded server).
            f"{self.token} = (SELECT gen_random_uuid())",
            f"{self.ends} = {self.now} + make_interval(secs => {seconds})",
        ]
        if self.owner:
            items.insert(0, f"{self.owner} = %(owner)s")
        return ", ".join(items)

    def clear(self) -> str:
        """SET items that give the lease up (the row is no longer held)."""
        items = [f"{self.token} = NULL"]
        if self.owner:
            items.insert(0, f"{self.owner} = NULL")
        if self.ends_cleared:
            items.append(f"{self.ends} = NULL")
        return ", ".join(items)

    def fenced(self, alias: str) -> str:
        """The row ``%(id)s`` is still held under ``%(token)s`` (and ``%(owner)s``)."""
        conditions = [f"{alias}.id = %(id)s", f"{alias}.{self.token} = %(token)s"]
        if self.owner:
            conditions.append(f"{alias}.{self.owner} = %(owner)s")
        return " AND ".join(conditions)

    @property
    def held_rows(self) -> str:
        """The (id, lease_token) pairs a batch passes as ``%(ids)s`` and ``%(tokens)s``."""
        return f"unnest(%(ids)s::{self.id_type}[], %(tokens)s::uuid[]) AS held(id, lease_token)"

    def fenced_batch(self, alias: str, held: str = "held", *, id_array: bool = True) -> str:
        """The row is one of ``held``'s and still held under its token (and
        ``%(owner)s``). ``alias.id = ANY(...)`` lets the primary key drive the lookup:
        without it the planner may walk an index of held leases, which fills with dead
        entries during a busy drain.

        ``id_array=False`` leaves that out, for a prepared statement: its generic plan,
        not knowing the array's length, walked the primary key for the array and
        compared every row found with every held one. Such a statement must keep the
        index of held leases out of its plan in some other way."""
        conditions = [
            *([f"{alias}.id = ANY(%(ids)s::{self.id_type}[])"] if id_array else []),
            f"{alias}.id = {held}.id",
            f"{alias}.{self.token} = {held}.lease_token",
        ]
        if self.owner:
            conditions.append(f"{alias}.{self.owner} = %(owner)s")
        return " AND ".join(conditions)

    def expired(self, alias: str) -> str:
        """The row is held, but its lease has ended."""
        return f"{alias}.status IN ({self.held_statuses}) AND {alias}.{self.ends} < {self.now}"

    def extend_statement(
        self,
        alias: str = "x",
        returning: str | None = None,
        *,
        held_rows: str | None = None,
        also_set: str = "",
    ) -> str:
        """Move the end of every lease in ``held_rows`` (default :attr:`held_rows`)
        that is still held, and set ``also_set``'s items, which may read further
        columns of a ``held_rows`` of the caller's; returns ``returning`` (default: the
        ids extended)."""
        extra = f",\n    {also_set}" if also_set else ""
        return f"""
UPDATE {self.table} {alias}
SET {self.ends} = {self.now} + make_interval(secs => %(lease_seconds)s){extra}
FROM {held_rows or self.held_rows}
WHERE {self.fenced_batch(alias)} AND {alias}.status IN ({self.held_statuses})
RETURNING {returning or f"{alias}.id"}
"""


def holder_id() -> str:
    """This process's name as a lease holder (and a worker's id): hostname and
    process id (spec 001 §6)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def held_params(
    owner: str | None, held: Sequence[tuple[Any, Any]], now: datetime | None
) -> dict[str, Any]:
    """The parameters of a batch of (id, token) pairs held by ``owner``."""
    return {
        "owner": owner,
        "ids": [row_id for row_id, _ in held],
        "tokens": [token for _, token in held],
        "now": now,
    }


def extend(
    lease: Lease,
    *,
    owner: str | None,
    held: Sequence[tuple[Any, Any]],
    lease_seconds: float,
    now: datetime | None = None,
) -> set[Any]:
    """Extend the leases ``owner`` holds; returns the ids still held (the others were
    lost: expired and recovered, or taken away)."""
    params = held_params(owner, held, now) | {"lease_seconds": lease_seconds}
    return {row[0] for row in fetch(lease.extend_statement(), params)}


def recover(lease: Lease, run: Callable[[], T]) -> T | None:
    """``run`` (the table's recovery) in a transaction under ``lease``'s advisory
    lock; what it returns, or None when another process is recovering that table."""
    with transaction.atomic():
        if not locks.try_advisory_xact_lock(lease.recovery_lock):
            return None
        return run()


def recover_expired(
    lease: Lease,
    statement: str,
    *,
    now: datetime | None = None,
    params: dict[str, Any] | None = None,
) -> int | None:
    """Run ``lease``'s recovery ``statement`` (one that gives back up to ``%(limit)s``
    expired rows and returns them, with ``params`` for its own placeholders) under the
    lock; how many it gave back, or None when another process is recovering that
    table."""
    params = {**(params or {}), "limit": RECOVERY_BATCH, "now": now}
    recovered = recover(lease, lambda: fetch(statement, params))
    return None if recovered is None else len(recovered)


def backoff(attempt: str, base_delay: str) -> str:
    """SQL: the interval a retried failure waits, ``attempt² × base_delay`` seconds
    (spec 001 §5: 5 s, 20 s, 45 s, … with a 5 s base)."""
    return f"make_interval(secs => ({attempt}) ^ 2 * {base_delay})"

"""``manage.py seed_tasks --count 1000000``: a large synthetic history, for measuring
the dashboard at scale (``dashboard_bench``). Its tasks have the task type
``seed:<agent>``, which no worker handles, so seeded pending tasks stay pending.

It writes ``--count`` rows into ``tasks`` (and, through the event stream's trigger,
one ``evt.task.created.v1`` row each into ``event_outbox``) of the database the
settings point at, and says so before it starts; it refuses a database whose tables
were never made (``manage.py migrate``).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, transaction

from task_queue import registry
from task_queue.bench import sql as bench_sql
from task_queue.models import Task

BATCH = 100_000


class Command(BaseCommand):
    help = "Insert synthetic tasks (mostly completed; some pending, dead, failed, cancelled)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--count", type=int, default=1_000_000, help="tasks (1000000)")
        parser.add_argument("--days", type=int, default=7, help="spread over this many days")
        parser.add_argument("--pending", type=float, default=0.02, help="share pending (0.02)")
        parser.add_argument("--dead", type=float, default=0.01, help="share dead (0.01)")
        parser.add_argument("--failed", type=float, default=0.01, help="share failed (0.01)")
        parser.add_argument("--cancelled", type=float, default=0.01, help="share (0.01)")

    def handle(self, *args: Any, **options: Any) -> None:
        shares = {name: options[name] for name in ("pending", "dead", "failed", "cancelled")}
        if options["count"] < 1 or options["days"] < 1:
            raise CommandError("--count and --days must be at least 1")
        if any(not 0 <= share <= 1 for share in shares.values()) or sum(shares.values()) > 1:
            raise CommandError("each share must be from 0 to 1, and together at most 1")
        if Task._meta.db_table not in connection.introspection.table_names():
            raise CommandError(
                f"{database()} has no {Task._meta.db_table} table: run `manage.py migrate` first"
            )
        self.stdout.write(
            f"inserting {options['count']} synthetic tasks into {database()} (table tasks, "
            "and one evt.task.created.v1 event each in event_outbox)"
        )
        batch = uuid.uuid4().hex[:8]
        started = time.monotonic()
        done = 0
        while done < options["count"]:
            size = min(BATCH, options["count"] - done)
            with transaction.atomic():
                bench_sql.seed_tasks(
                    start=done, count=size, agents=registry.names(), shares=shares,
                    days=options["days"], batch=batch,
                )  # fmt: skip
            done += size
            self.stdout.write(f"{done} tasks inserted ({time.monotonic() - started:.0f} s)")
        bench_sql.analyze_tasks()
        elapsed = time.monotonic() - started
        self.stdout.write(f"seeded {done} tasks (batch {batch}) in {elapsed:.0f} s")


def database() -> str:
    """The database these settings point at, as "database 'NAME' at HOST:PORT"."""
    connection.ensure_connection()
    info = connection.connection.info
    return f"database {info.dbname!r} at {info.host}:{info.port}"

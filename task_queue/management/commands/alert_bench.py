"""``manage.py alert_bench``: how long one evaluation of the alert rules takes on this
database (issue 35's target: under 50 ms at 10 M tasks; ``seed_tasks`` makes them).

It adds one rule of each kind for every agent (no channels: nothing is sent),
evaluates ``--runs`` times, prints the median, p95 and longest evaluation, and deletes
its rules with their states and notifications. Rules already there are evaluated too.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from task_queue.alerts import evaluation
from task_queue.models import AlertKind, AlertRule
from task_queue.sql import db

PREFIX = "alert_bench:"
THRESHOLDS = {
    AlertKind.DEAD_LETTER: 1,
    AlertKind.FAILURE_RATE: 0.1,
    AlertKind.BACKLOG_AGE: 60,
    AlertKind.NO_WORKERS: 1,
    AlertKind.LEASE_EXPIRATIONS: 1,
    AlertKind.SCHEDULE_MISSED: 60,
    AlertKind.WORKFLOW_ESCALATED: 1,
}
ESTIMATED_TASKS = "SELECT reltuples::bigint FROM pg_class WHERE oid = 'tasks'::regclass"


class Command(BaseCommand):
    help = "Time evaluations of the alert rules (one rule of each kind, every agent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--runs", type=int, default=50, help="evaluations (50)")

    def handle(self, *args: Any, **options: Any) -> None:
        runs = options["runs"]
        if not 1 <= runs <= 10_000:
            raise CommandError("--runs must be from 1 to 10000")
        AlertRule.objects.filter(name__startswith=PREFIX).delete()
        AlertRule.objects.bulk_create(
            AlertRule(name=PREFIX + kind, kind=kind, threshold=threshold)
            for kind, threshold in THRESHOLDS.items()
        )
        try:
            took = []
            for _ in range(runs):
                began = time.perf_counter()
                if evaluation.evaluate() is None:
                    raise CommandError("another process is evaluating: stop runmaintenance")
                took.append((time.perf_counter() - began) * 1000)
        finally:
            AlertRule.objects.filter(name__startswith=PREFIX).delete()
        ((tasks,),) = db.fetch(ESTIMATED_TASKS, {})
        # PostgreSQL estimates -1 for a table it has not analysed yet.
        size = f"about {tasks:,}" if tasks >= 0 else "a number not yet estimated of"
        cut = statistics.quantiles(took, n=20)[-1] if runs > 1 else took[0]
        self.stdout.write(
            f"{runs} evaluations of {len(THRESHOLDS)} rules over {size} tasks: "
            f"median {statistics.median(took):.2f} ms, p95 {cut:.2f} ms, max {max(took):.2f} ms"
        )

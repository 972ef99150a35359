"""``manage.py runmaintenance``: the registered maintenance jobs, on a timer, until SIGTERM.

Each pass runs every job apps registered with ``task_queue.maintenance``: the queue's
own (``task_queue.maintenance.jobs``: the lease reaper, metric rollups, the event
stream's positions and retention) and those of the apps above it, such as the
AnalyticsAgent's daily report (``agents_app``). Each job runs in one process at a
time across the cluster, by advisory lock.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, close_old_connections

from task_queue import maintenance
from task_queue.management.checks import ChecksWithoutUrls
from task_queue.stop_signals import StopSignals

logger = logging.getLogger(__name__)


class Command(ChecksWithoutUrls, BaseCommand):
    help = (
        "Run the queue's maintenance (lease reaper, stale workers, metric rollups, "
        "retention, and the jobs apps register) every few seconds."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--every",
            type=float,
            default=settings.QUEUE_REAPER_SECONDS,
            help="seconds between passes (QUEUE_REAPER_SECONDS)",
        )
        parser.add_argument("--once", action="store_true", help="one pass, then exit")

    def handle(self, *args: Any, **options: Any) -> None:
        with StopSignals() as stop:
            self._loop(stop, options)

    def _loop(self, stop: StopSignals, options: dict[str, Any]) -> None:
        jobs = ", ".join(job.name for job in maintenance.registered())
        if options["once"]:
            self.stdout.write(f"one maintenance pass: {jobs}")
        else:
            self.stdout.write(f"maintenance every {options['every']} s: {jobs}")
        schedule = maintenance.Schedule()
        while True:
            try:
                for line in schedule.run_due_jobs():
                    self.stdout.write(line)
            except DatabaseError as error:
                logger.warning("maintenance pass failed (%s); trying again", error)
                close_old_connections()
            except ImproperlyConfigured as error:  # a declaration in settings
                raise CommandError(str(error)) from None
            if options["once"] or stop.wait(options["every"]):
                return

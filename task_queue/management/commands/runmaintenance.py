"""``manage.py runmaintenance``: the queue's housekeeping, on a timer, until SIGTERM.

Each pass gives back tasks whose lease expired and forgets workers that stopped
heartbeating (the reaper, which workers run too, so it keeps going when no
maintenance process is up), computes the metric rollups of the buckets that
closed (``task_queue.metrics``), asks the AnalyticsAgent for yesterday's report once
that day is rolled up (``agents_app.analytics``), and, once a minute, gives the event
stream's new events their positions and prunes what is past its retention
(``task_queue.retention``). Each job runs in one process at a time across the
cluster, by advisory lock.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError, close_old_connections

from agents_app import analytics
from task_queue import event_stream, metrics, reaper, retention

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = (
        "Run the queue's maintenance (lease reaper, stale workers, metric rollups, "
        "retention) every few seconds."
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
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        self.stdout.write(f"maintenance every {options['every']} s")
        pruned_at = -math.inf
        while True:
            try:
                reaped = reaper.reap_expired_leases()
                if reaped:
                    self.stdout.write(f"reaper: recovered {len(reaped)} task(s)")
                rolled_up = metrics.roll_up()
                if rolled_up:
                    logger.info("metric rollups written: %s", rolled_up)
                if analytics.schedule_daily_report():
                    self.stdout.write("asked the AnalyticsAgent for yesterday's report")
                if time.monotonic() - pruned_at >= retention.EVERY_SECONDS:
                    # Positions for the stream, even with no reader running, so that
                    # retention only ever keeps back events committed a moment ago.
                    event_stream.sequence()
                    retention.prune()
                    pruned_at = time.monotonic()
            except DatabaseError as error:
                logger.warning("maintenance pass failed (%s); trying again", error)
                close_old_connections()
            if options["once"] or stop.wait(options["every"]):
                return

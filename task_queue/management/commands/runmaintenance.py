"""``manage.py runmaintenance``: the queue's housekeeping, on a timer, until SIGTERM.

Each pass gives back tasks whose lease expired and forgets workers that stopped
heartbeating (the reaper; one process at a time across the cluster, by advisory
lock). Workers run the same pass themselves; this loop keeps it going when no
worker is up, and is where periodic jobs such as metric rollups belong.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError, close_old_connections

from task_queue import reaper

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Run the queue's maintenance (lease reaper, stale workers) every few seconds."

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
        while True:
            try:
                reaped = reaper.reap_expired_leases()
                if reaped:
                    self.stdout.write(f"reaper: recovered {len(reaped)} task(s)")
            except DatabaseError as error:
                logger.warning("maintenance pass failed (%s); trying again", error)
                close_old_connections()
            if options["once"] or stop.wait(options["every"]):
                return

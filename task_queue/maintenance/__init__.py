"""The periodic jobs the maintenance loop (``manage.py runmaintenance``) runs.

Apps register their jobs here when Django starts (in ``AppConfig.ready()``), so the
loop in the queue runs work that lives in higher layers, such as the AnalyticsAgent's
daily report, without importing it. Each pass runs every job that is due, by
``order`` (then in the order they were registered); a job that must run in one
process at a time across the cluster takes its own advisory lock
(``task_queue.sql.locks``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError

logger = logging.getLogger(__name__)

# Orders of the jobs the product registers: leases first, then the rollups the daily
# report reads, the report, and retention last (it may take longest).
LEASES, ROLLUPS, REPORTS, RETENTION = 10, 20, 30, 90


@dataclass(frozen=True)
class MaintenanceJob:
    name: str
    # Does the work; returns a line for the operator's console, or None to say nothing.
    run: Callable[[], str | None]
    # 0: on every pass; otherwise at most this often.
    every_seconds: float = 0.0
    order: int = 50


_jobs: dict[str, MaintenanceJob] = {}


def register(
    name: str,
    run: Callable[[], str | None],
    *,
    every_seconds: float = 0.0,
    order: int = 50,
) -> None:
    """Add a job to every maintenance pass (again under the same name: replace it)."""
    _jobs[name] = MaintenanceJob(name, run, every_seconds, order)


class SyncedFirst:
    """A job whose declarations in settings (``sync``) are synced at the loop's first
    pass, then ``run`` at every pass: schedules and alert rules."""

    def __init__(self, sync: Callable[[], None], run: Callable[[], str | None]) -> None:
        self.sync, self.run = sync, run
        self.synced = False

    def __call__(self) -> str | None:
        if not self.synced:
            self.sync()
            self.synced = True
        return self.run()


def registered() -> list[MaintenanceJob]:
    return sorted(_jobs.values(), key=lambda job: job.order)  # stable: registration order


@dataclass
class Schedule:
    """When each job last ran, on this loop's monotonic clock (one per loop)."""

    last_run: dict[str, float] = field(default_factory=dict)

    def run_due_jobs(self) -> list[str]:
        """One pass: every due job, by order; the lines they reported. A job that fails
        is due again at the next pass. A database error ends the pass (the loop
        reconnects; the jobs after it wait for the next pass); a bad declaration in
        settings (``ImproperlyConfigured``) ends the loop; any other error is logged
        and the pass goes on, so one job's bug never stops the others."""
        said = []
        for job in registered():
            now = time.monotonic()
            if now - self.last_run.get(job.name, -math.inf) < job.every_seconds:
                continue
            try:
                line = job.run()
            except (DatabaseError, ImproperlyConfigured):
                raise
            except Exception:
                logger.exception("maintenance job %r failed; it runs again next pass", job.name)
                continue
            self.last_run[job.name] = now
            if line:
                said.append(line)
        return said

"""The periodic jobs the maintenance loop (``manage.py runmaintenance``) runs.

Apps register their jobs here when Django starts (in ``AppConfig.ready()``), so the
loop in the queue runs work that lives in higher layers, such as the AnalyticsAgent's
daily report, without importing it. Each pass runs every job that is due, in the
order they were registered; a job that must run in one process at a time across the
cluster takes its own advisory lock (``task_queue.locks``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class MaintenanceJob:
    name: str
    # Does the work; returns a line for the operator's console, or None to say nothing.
    run: Callable[[], str | None]
    # 0: on every pass; otherwise at most this often (the loop's monotonic clock).
    every_seconds: float = 0.0
    last_run: float = field(default=-math.inf, compare=False)

    def due(self, now: float) -> bool:
        return now - self.last_run >= self.every_seconds


_jobs: dict[str, MaintenanceJob] = {}


def register(name: str, run: Callable[[], str | None], *, every_seconds: float = 0.0) -> None:
    """Add a job to every maintenance pass (again under the same name: replace it)."""
    _jobs[name] = MaintenanceJob(name, run, every_seconds)


def registered() -> list[MaintenanceJob]:
    return list(_jobs.values())


def run_due_jobs() -> list[str]:
    """One pass: every due job, in registration order; the lines they reported."""
    said = []
    for job in registered():
        now = time.monotonic()
        if not job.due(now):
            continue
        line = job.run()
        job.last_run = now
        if line:
            said.append(line)
    return said

"""What the overview shows, read in one snapshot.

At scale the tasks table is mostly finished tasks, so nothing here reads all of
them: the counts by status are the running totals the writes keep
(``task_queue.stats``), and so are throughput and the charts (the finish counters of
the last hour, ``task_queue.sql.counts``); the latency percentiles read at most a few
thousand of the latest finished tasks (``task_queue.sql.reading.recent_activity``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from task_queue import limits, operations, registry, stats
from task_queue.maintenance import retention
from task_queue.models import AlertState, PausedAgent, RetentionRun, TaskStatus, Worker
from task_queue.sql import counts, reading

CHART_MINUTES = 60


@dataclass
class AgentLine:
    name: str
    counts: dict[str, int]
    completed: tuple[int, int, int] = (0, 0, 0)  # last 1, 5, 15 minutes
    failed: tuple[int, int, int] = (0, 0, 0)
    queue_wait: tuple[float, float] | None = None  # p50, p95 (15 minutes)
    run_time: tuple[float, float] | None = None
    oldest_pending_seconds: float | None = None
    paused: PausedAgent | None = None
    limits: limits.LimitUsage | None = None  # with a limit: it and how much is in use

    @property
    def error_rate(self) -> float | None:
        """Failed or dead among the tasks that finished in the last 15 minutes."""
        finished = self.completed[2] + self.failed[2]
        return self.failed[2] / finished if finished else None

    @property
    def dead_letter(self) -> int:
        return self.counts[TaskStatus.DEAD] + self.counts[TaskStatus.FAILED]


@dataclass
class WorkerLine:
    worker: Worker
    heartbeat_age: float
    stale: bool


@dataclass
class Snapshot:
    taken_at: datetime
    agents: list[AgentLine]
    workers: list[WorkerLine]
    minutes: list[tuple[datetime, int, int]]  # (minute, completed, failed), oldest first
    totals: dict[str, int] = field(default_factory=dict)
    pruned: dict[str, int] = field(default_factory=dict)  # by retention, last 24 hours
    alerts_firing: int = 0  # (rule, agent or workflow) pairs firing now: the banner


def take_snapshot() -> Snapshot:
    """Everything the overview shows: a handful of statements, each index-driven."""
    names = sorted(registry.names())
    zero = dict.fromkeys(TaskStatus.values, 0)
    counts: dict[str, dict[str, int]] = {name: dict(zero) for name in names}
    for agent, status, n in stats.task_counts():
        counts.setdefault(agent, dict(zero))[status] = n
    lines = {name: AgentLine(name, c) for name, c in sorted(counts.items())}
    for activity in reading.recent_activity():
        line = lines.setdefault(activity.agent_name, AgentLine(activity.agent_name, dict(zero)))
        line.completed, line.failed = activity.completed, activity.failed
        line.queue_wait = activity.queue_wait_seconds and activity.queue_wait_seconds[:2]
        line.run_time = activity.run_seconds and activity.run_seconds[:2]
    for name, age in reading.oldest_pending_age_by_agent(list(lines)).items():
        lines[name].oldest_pending_seconds = age
    for name, paused in operations.paused_agents().items():
        if name in lines:
            lines[name].paused = paused
    for name, usage in limits.limits_in_use().items():
        if name in lines:
            lines[name].limits = usage
    now = timezone.now()
    totals = dict(zero)
    for line in lines.values():
        for status, n in line.counts.items():
            totals[status] += n
    return Snapshot(
        taken_at=now,
        agents=list(lines.values()),
        workers=worker_lines(now),
        minutes=_minutes(now),
        totals=totals,
        pruned=RetentionRun.objects.filter(ran_at__gte=now - timedelta(days=1)).aggregate(
            **{kind: Coalesce(Sum(kind), 0) for kind in retention.KINDS}
        ),
        alerts_firing=AlertState.objects.filter(
            firing_since__isnull=False, rule__enabled=True
        ).count(),
    )


def worker_lines(now: datetime) -> list[WorkerLine]:
    """Live workers; stale ones have not heartbeaten for a lease's length."""
    lines = []
    for worker in Worker.objects.order_by("hostname", "pid"):
        age = (now - worker.last_heartbeat_at).total_seconds()
        lines.append(WorkerLine(worker, age, age > settings.QUEUE_LEASE_SECONDS))
    return lines


def _minutes(now: datetime) -> list[tuple[datetime, int, int]]:
    """The last hour minute by minute, with the minutes that had nothing filled in."""
    found = {minute: (done, failed) for minute, done, failed in counts.finished_per_minute()}
    last = now.replace(second=0, microsecond=0)
    minutes = [last - timedelta(minutes=m) for m in range(CHART_MINUTES - 1, -1, -1)]
    return [(m, *found.get(m, (0, 0))) for m in minutes]

"""The queue in the Prometheus text format, computed at each scrape (served as
``GET /metrics`` by ``automechanica.metrics_view``).

- ``automechanica_tasks{agent,status}``: tasks by status (the running totals, exact);
- ``automechanica_tasks_{created,completed,failed,dead,retried,cancelled}_total{agent}``:
  counters, kept by the writes (``task_totals``, migration ``queue 0029``), so they
  survive restarts and never reset (a TRUNCATE of tasks aside); and
  ``automechanica_tasks_lease_expired_total{agent}``, leases the reaper expired (each
  also counted as retried, dead or cancelled);
- ``automechanica_task_queue_wait_seconds`` and ``automechanica_task_run_seconds``
  histograms per agent, likewise;
- ``automechanica_workers_alive{agent}`` and ``automechanica_oldest_pending_age_seconds{agent}``;
- ``automechanica_oldest_horizon_transaction_age_seconds``: the oldest open transaction
  that keeps PostgreSQL from removing dead row versions (``reading``), which makes
  claims slower the longer it stays open;
- for agents with limits (``task_queue.limits``): ``automechanica_agent_concurrency_limit``
  and ``..._concurrency_in_use`` (tasks leased or running), ``..._rate_limit`` (starts
  per window), ``..._rate_limit_period_seconds`` and ``..._rate_in_use`` (starts in
  the current window), each ``{agent}``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from django.conf import settings
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from task_queue.sql import counts, reading

from . import limits, registry, stats
from .models import HISTOGRAM_BOUNDS, TaskStatus, Worker

COUNTERS = ("created", "completed", "failed", "dead", "retried", "cancelled", "lease_expired")
HISTOGRAMS = {
    "queue_wait": ("automechanica_task_queue_wait_seconds", "From due to started."),
    "run_time": ("automechanica_task_run_seconds", "From started to the attempt's end."),
}

# (name, documentation, value of an agent's LimitUsage; None: no sample)
LIMIT_GAUGES: list[tuple[str, str, Callable[[limits.LimitUsage], int | None]]] = [
    ("concurrency_limit", "Most tasks of the agent leased or running at once.",
     lambda u: u.concurrency_limit),
    ("concurrency_in_use", "Tasks of the agent leased or running, under a concurrency limit.",
     lambda u: u.held if u.concurrency_limit else None),
    ("rate_limit", "Most task starts of the agent in any window of the period.",
     lambda u: u.rate_count),
    ("rate_limit_period_seconds", "The rate limit's window.", lambda u: u.rate_period_seconds),
    ("rate_in_use", "Task starts of the agent in the rate limit's current window.",
     lambda u: u.recent_starts),
]  # fmt: skip


class QueueCollector:
    """Reads the database at each scrape (prometheus_client's custom collector)."""

    def collect(self) -> Iterator[Metric]:
        agents = sorted(registry.names())
        yield from self._task_counts(agents)
        yield from self._totals(agents)
        yield from self._workers_and_backlog(agents)
        yield from self._limits()

    def _task_counts(self, agents: list[str]) -> Iterator[Metric]:
        by_status = {(agent, status): n for agent, status, n in stats.task_counts()}
        gauge = GaugeMetricFamily(
            "automechanica_tasks", "Tasks by agent and status.", labels=["agent", "status"]
        )
        for agent in sorted(set(agents) | {agent for agent, _ in by_status}):
            for status in TaskStatus.values:
                gauge.add_metric([agent, status], by_status.get((agent, status), 0))
        yield gauge

    def _totals(self, agents: list[str]) -> Iterator[Metric]:
        """Every registered agent has its series, at zero until it has counted."""
        totals = cumulative_totals()
        for agent in agents:
            totals.setdefault(agent, _no_totals())
        for name in COUNTERS:
            counter = CounterMetricFamily(
                f"automechanica_tasks_{name}", f"Tasks {name}, by agent.", labels=["agent"]
            )
            for agent, figures in sorted(totals.items()):
                counter.add_metric([agent], figures[f"tasks_{name}"])
            yield counter
        for key, (metric_name, documentation) in HISTOGRAMS.items():
            histogram = HistogramMetricFamily(metric_name, documentation, labels=["agent"])
            for agent, figures in sorted(totals.items()):
                histogram.add_metric(
                    [agent],
                    buckets=_cumulative(figures[f"{key}_histogram"]),
                    sum_value=figures[f"{key}_sum"],
                )
            yield histogram

    def _workers_and_backlog(self, agents: list[str]) -> Iterator[Metric]:
        now = timezone.now()
        alive: dict[str, int] = dict.fromkeys(agents, 0)
        for served, last_beat in Worker.objects.values_list("agents", "last_heartbeat_at"):
            if (now - last_beat).total_seconds() <= settings.QUEUE_LEASE_SECONDS:
                for agent in served:
                    alive[agent] = alive.get(agent, 0) + 1
        workers = GaugeMetricFamily(
            "automechanica_workers_alive",
            "Workers that heartbeat within a lease's length, by agent served.",
            labels=["agent"],
        )
        for agent, n in sorted(alive.items()):
            workers.add_metric([agent], n)
        yield workers
        oldest = GaugeMetricFamily(
            "automechanica_oldest_pending_age_seconds",
            "How long the longest-waiting due task has waited (0: none waits).",
            labels=["agent"],
        )
        for agent, age in sorted(reading.oldest_pending_age_by_agent(agents).items()):
            oldest.add_metric([agent], age or 0.0)
        yield oldest
        yield GaugeMetricFamily(
            "automechanica_oldest_horizon_transaction_age_seconds",
            "How long the oldest open transaction that holds back dead-row cleanup has "
            "been open (0: none); while it is old, every claim costs more.",
            value=reading.oldest_horizon_transaction_age(),
        )

    def _limits(self) -> Iterator[Metric]:
        """Agents with limits only: an agent without one has no series."""
        usage = sorted(limits.limits_in_use().items())
        for name, documentation, value_of in LIMIT_GAUGES:
            gauge = GaugeMetricFamily(
                f"automechanica_agent_{name}", documentation, labels=["agent"]
            )
            for agent, agent_usage in usage:
                value = value_of(agent_usage)
                if value is not None:
                    gauge.add_metric([agent], value)
            yield gauge


def cumulative_totals() -> dict[str, dict[str, Any]]:
    """Per agent, the counters and histograms (``task_totals``, kept by the writes:
    they never drop, and a scrape costs the same at any size and speed)."""
    totals: dict[str, dict[str, Any]] = defaultdict(_no_totals)
    # One row per (agent, measure, slot), the sum the measure's whole: set, not added.
    for agent, measure, slot, n, measure_sum in counts.task_totals():
        figures = totals[agent]
        if measure in HISTOGRAMS:
            figures[f"{measure}_histogram"][slot] = n
            figures[f"{measure}_sum"] = measure_sum
        else:
            figures[f"tasks_{measure}"] = n
    return dict(totals)


def _no_totals() -> dict[str, Any]:
    return {
        **{f"tasks_{name}": 0 for name in COUNTERS},
        **{f"{key}_histogram": [0] * (len(HISTOGRAM_BOUNDS) + 1) for key in HISTOGRAMS},
        **{f"{key}_sum": 0.0 for key in HISTOGRAMS},
    }


def _cumulative(slot_counts: list[int]) -> list[tuple[str, int]]:
    """Prometheus buckets (upper bound, count at or below it) from per-slot counts."""
    buckets, running = [], 0
    for bound, n in zip(HISTOGRAM_BOUNDS, slot_counts, strict=False):
        running += n
        buckets.append((floatToGoString(bound), running))
    buckets.append(("+Inf", sum(slot_counts)))
    return buckets


def exposition() -> bytes:
    """The queue's metrics in the Prometheus text format (``CONTENT_TYPE_LATEST``)."""
    collectors = CollectorRegistry(auto_describe=False)
    collectors.register(QueueCollector())
    return generate_latest(collectors)

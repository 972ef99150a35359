"""``/api/v1/agents``, ``/api/v1/workers`` and ``/api/v1/metrics``."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest
from django.utils import timezone
from ninja import Router

from task_queue import registry
from task_queue.models import TaskStatus, Worker
from task_queue.sql import reading
from task_queue.stats import queue_stats

from ..auth import READ
from ..errors import ERROR_RESPONSES
from ..schemas import AgentOut, MetricsOut, WorkerOut

router = Router(tags=["agents, workers and metrics"])


@router.get("/agents", auth=READ, response={200: list[AgentOut], **ERROR_RESPONSES})
def list_agents(request: HttpRequest):
    """Every registered agent with its settings and its tasks by status."""
    by_agent = queue_stats()["by_agent"]
    return [
        {**agent.settings(), "counts": by_agent.get(agent.name) or _zero_counts()}
        for agent in registry.all_agents()
    ]


@router.get("/workers", auth=READ, response={200: list[WorkerOut], **ERROR_RESPONSES})
def list_workers(request: HttpRequest):
    """Worker processes that heartbeat; ``stale`` ones have missed a lease's worth."""
    now = timezone.now()
    out = []
    for worker in Worker.objects.all():
        age = (now - worker.last_heartbeat_at).total_seconds()
        out.append(
            {
                **{f.name: getattr(worker, f.name) for f in Worker._meta.fields},
                "heartbeat_age_seconds": round(age, 3),
                "stale": age > settings.QUEUE_LEASE_SECONDS,
            }
        )
    return out


@router.get("/metrics", auth=READ, response={200: MetricsOut, **ERROR_RESPONSES})
def metrics(request: HttpRequest):
    """Counts by agent × status, throughput over the last 1/5/15 minutes, and queue
    wait and run time percentiles of the tasks that finished in the last 15 minutes."""
    stats = queue_stats()
    recent = {a.agent_name: a for a in reading.recent_activity()}
    agents = {}
    for name in sorted(set(stats["by_agent"]) | set(recent) | set(registry.names())):
        activity = recent.get(name)
        agents[name] = {
            "counts": stats["by_agent"].get(name) or _zero_counts(),
            "completed": _windows(activity.completed if activity else (0, 0, 0)),
            "failed": _windows(activity.failed if activity else (0, 0, 0)),
            "queue_wait_seconds": _percentiles(activity and activity.queue_wait_seconds),
            "run_seconds": _percentiles(activity and activity.run_seconds),
        }
    return {
        "generated_at": timezone.now(),
        "totals": stats["totals"],
        "oldest_pending_age_seconds": stats["oldest_pending_age_seconds"],
        "agents": agents,
    }


def _zero_counts() -> dict[str, int]:
    return dict.fromkeys(TaskStatus.values, 0)


def _windows(counts: tuple[int, int, int]) -> dict[str, int]:
    return dict(zip(("1m", "5m", "15m"), counts, strict=True))


def _percentiles(values: tuple[float, float, float] | None) -> dict[str, float] | None:
    if not values:
        return None
    return {name: round(v, 6) for name, v in zip(("p50", "p95", "p99"), values, strict=True)}

"""``/api/v1/agents`` (and an agent's limits), ``/api/v1/workers`` and ``/api/v1/metrics``."""

from __future__ import annotations

from typing import Annotated, Any

from django.conf import settings
from django.http import HttpRequest
from django.utils import timezone
from ninja import Path, Router

from task_queue import limits, registry
from task_queue.agent import Agent
from task_queue.models import TaskStatus, Worker
from task_queue.sql import reading
from task_queue.stats import queue_stats
from task_queue.task_specs import MAX_KEY_LENGTH

from ..agents import token_agents
from ..auth import ADMIN, READ
from ..errors import ERROR_RESPONSES, ApiError
from ..schemas import AgentLimitsUpdate, AgentOut, MetricsOut, WorkerOut

router = Router(tags=["agents, workers and metrics"])


@router.get("/agents", auth=READ, response={200: list[AgentOut], **ERROR_RESPONSES})
def list_agents(request: HttpRequest):
    """Every registered agent with its settings, its tasks by status, and its limits
    with how much of each is in use."""
    by_agent = queue_stats()["by_agent"]
    in_use = limits.limits_in_use()
    return [_agent(agent, by_agent, in_use) for agent in registry.all_agents()]


@router.patch("/agents/{name}", auth=ADMIN, response={200: AgentOut, **ERROR_RESPONSES})
def update_agent(
    request: HttpRequest,
    name: Annotated[str, Path(max_length=MAX_KEY_LENGTH)],
    body: AgentLimitsUpdate,
):
    """Set an agent's cluster-wide limits: ``concurrency_limit`` and ``rate_limit``
    (``{"count", "period_seconds"}``); null clears one, a field left out stays."""
    changes = body.model_dump(exclude_unset=True)
    if not changes:
        raise ApiError.invalid("body", "give concurrency_limit or rate_limit (null clears it)")
    if changes.get("rate_limit") is not None:
        changes["rate_limit"] = limits.RateLimit(**changes["rate_limit"])
    try:
        limits.set_limits(name, actor=request.auth.actor, source="api", **changes)
    except KeyError:
        raise ApiError.not_found("agent") from None
    except limits.InvalidLimit as error:
        raise ApiError.invalid(error.field, error.message) from None
    return _agent(registry.get(name), queue_stats()["by_agent"], limits.limits_in_use())


def _agent(
    agent: type[Agent], by_agent: dict[str, dict[str, int]], in_use: dict[str, limits.LimitUsage]
) -> dict[str, Any]:
    counts = by_agent.get(agent.name) or _zero_counts()
    usage = in_use.get(agent.name)
    rate = (
        usage
        and usage.rate_count
        and {
            "count": usage.rate_count,
            "period_seconds": usage.rate_period_seconds,
        }
    )
    return {
        **agent.settings(),
        "counts": counts,
        "concurrency_limit": usage and usage.concurrency_limit,
        "concurrency_in_use": usage.held if usage else counts["leased"] + counts["running"],
        "rate_limit": rate or None,
        "rate_in_use": usage.recent_starts if usage else None,
    }


@router.get("/workers", auth=READ, response={200: list[WorkerOut], **ERROR_RESPONSES})
def list_workers(request: HttpRequest):
    """Workers that heartbeat, local (runworker) and remote (agents over the worker
    protocol); ``stale`` ones have missed a lease's worth. A token bound to agents sees
    the workers of its agents only."""
    now = timezone.now()
    out = []
    workers = Worker.objects.all()
    if agents := token_agents(request):
        workers = workers.filter(agents__overlap=agents)
    for worker in workers:
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
    """Counts by agent × status, throughput over the last 1/5/15 minutes (to the 10
    seconds), and queue wait and run time percentiles of the latest 5,000 tasks that
    finished in the last 15 minutes (all of them, if fewer finished)."""
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

"""Tokens bound to agents: what a token made with ``create_api_token NAME --agent A
--agent B`` may see and do. An agent elsewhere may run code no one reviewed, so its
token is confined to its agents everywhere:

- messaging (seed 002 §8.2): it sends and publishes only as A or B, reads and
  acknowledges only their messages and deliveries, and revives only theirs;
- tasks: it reads (the lists, one task, the dead letter, similar events), edits,
  cancels and revives only their tasks (another's is 404, as if it did not exist),
  enqueues only for them (spec 001 §10: other work is asked for with a message), and
  claims, heartbeats and reports only theirs (the worker protocol: 403);
- workflows: it sees those with tasks of its agents, counting only those tasks, and
  changes or cancels only those whose every task is one of its agents';
- the live stream: envelopes of its agents only.

A token bound to no agent may act on any (the orchestrator's, unchanged).
"""

from __future__ import annotations

from typing import TypeVar

from django.db.models import Model, QuerySet
from django.http import HttpRequest

from .errors import ApiError
from .models import ApiToken

M = TypeVar("M", bound=Model)


def require_agent(
    request: HttpRequest, field: str, agent: str, why: str = "is not one of this token's agents"
) -> None:
    """Refuse (403 ``agent_not_allowed``, naming ``field``) a token bound to agents
    other than ``agent``."""
    token: ApiToken = request.auth
    if token.agents and agent not in token.agents:
        raise ApiError(
            403,
            "agent_not_allowed",
            f"{field}: {why} (token {token.name!r} acts only as {', '.join(token.agents)})",
            field_errors=[(field, why)],
            details={"agent": agent, "token_agents": list(token.agents)},
        )


def own(request: HttpRequest, rows: QuerySet[M], agent_field: str) -> QuerySet[M]:
    """``rows`` narrowed to the token's agents (by ``agent_field``), if it is bound."""
    token: ApiToken = request.auth
    return rows.filter(**{f"{agent_field}__in": token.agents}) if token.agents else rows


def token_agents(request: HttpRequest) -> list[str] | None:
    """The agents the request's token is bound to, or None for an unbound token."""
    token: ApiToken = request.auth
    return list(token.agents) or None


def visible(request: HttpRequest, agent: str) -> bool:
    """Whether the token may see a task (or an event) of ``agent``."""
    agents = token_agents(request)
    return agents is None or agent in agents

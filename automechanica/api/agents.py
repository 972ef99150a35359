"""Tokens bound to agents: which agents' messages a token may send, read and settle.

A token made with ``create_api_token NAME --agent A --agent B`` acts in agent messaging
only as A or B (seed 002 §8.2: agents read only their own messages): it sends and
publishes only as them, reads and acknowledges only their mailboxes' messages and
their subscriptions' deliveries, and revives only theirs. A token bound to no agent
may act as any (the rights every token had before binding). Other routes (tasks,
workflows) are not affected.
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

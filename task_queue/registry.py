"""The agents a process knows, by name.

Agents register with :func:`register` when their module is imported. The modules are
listed in ``settings.AGENT_MODULES`` (the built-in agents, plus any named in the
``AUTOMECHANICA_AGENT_MODULES`` environment variable) and imported when Django starts.
"""

from __future__ import annotations

import importlib

from django.conf import settings

from .agent import Agent

_agents: dict[str, type[Agent]] = {}


def register(agent: type[Agent]) -> type[Agent]:
    """Class decorator: make ``agent`` available to workers and enqueuers by its name."""
    existing = _agents.get(agent.name)
    if existing is not None and existing is not agent:
        raise ValueError(f"two agents are named {agent.name!r}: {existing} and {agent}")
    if not agent.task_types:
        raise ValueError(f"agent {agent.name!r} declares no task types")
    _agents[agent.name] = agent
    return agent


def load_agent_modules() -> None:
    for module in settings.AGENT_MODULES:
        importlib.import_module(module)


def get(name: str) -> type[Agent]:
    """The agent class named ``name``; ``KeyError`` if there is none."""
    return _agents[name]


def names() -> list[str]:
    return sorted(_agents)


def all_agents() -> list[type[Agent]]:
    return [_agents[name] for name in names()]

"""What a client of the live stream (``/api/v1/stream``) asks for: the query
parameters, checked, and the test an envelope must pass to be sent to it."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qs
from uuid import UUID

from task_queue.event_stream import Envelope

# The payload fields that name an agent, by kind of event: a task's agent, a
# message's sender and recipient, a publication's publisher.
AGENT_FIELDS = ("agent_type", "from_agent", "to_agent", "publisher_agent")
MAX_TEXT = 200
REPEATABLE = frozenset({"task_id", "kind"})
KNOWN = frozenset({"trace_id", "workflow_id", "task_id", "agent", "kind", "after"})


class InvalidFilter(ValueError):
    """A query parameter the stream cannot follow; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class StreamFilter:
    trace_id: str | None = None
    workflow_id: str | None = None
    task_ids: frozenset[str] = frozenset()
    agent: str | None = None
    kinds: tuple[str, ...] = ()
    # Resume after this position; None: from the events committed after connecting.
    after: int | None = None
    # The agents the client's token is bound to (automechanica.api.agents): then
    # message and publication events only of these agents (sent, received or
    # published), as the messaging routes would show it; task events are not bound.
    token_agents: frozenset[str] = frozenset()

    @classmethod
    def from_query(cls, query_string: bytes) -> StreamFilter:
        try:
            query = parse_qs(query_string.decode(), strict_parsing=False, max_num_fields=200)
        except (UnicodeDecodeError, ValueError) as error:
            raise InvalidFilter("query", f"the query string cannot be read: {error}") from None
        for name, values in query.items():
            if name not in KNOWN:
                raise InvalidFilter(name, f"unknown filter {name!r}; known: {sorted(KNOWN)}")
            if len(values) > 1 and name not in REPEATABLE:
                raise InvalidFilter(name, f"{name} may be given once")
            for value in values:
                if not value or len(value) > MAX_TEXT or "\x00" in value:
                    raise InvalidFilter(name, f"{name} must be 1 to {MAX_TEXT} characters")

        def one(name: str) -> str | None:
            return query.get(name, [None])[0]

        return cls(
            trace_id=one("trace_id"),
            workflow_id=_uuid("workflow_id", one("workflow_id")),
            task_ids=frozenset(_uuid("task_id", value) for value in query.get("task_id", [])),
            agent=one("agent"),
            kinds=tuple(query.get("kind", [])),
            after=_position(one("after")),
        )

    def matches(self, event: Envelope, workflows: Mapping[str, str]) -> bool:
        """Whether ``event`` passes every filter given; ``workflows`` maps the task ids
        of its batch to their workflows (needed only with ``workflow_id``)."""
        if self.trace_id is not None and event.trace_id != self.trace_id:
            return False
        if self.kinds and not any(fnmatch.fnmatchcase(event.kind, k) for k in self.kinds):
            return False
        # The rest looks into the payload: a stream filtered by none of it never parses it.
        if not (self.workflow_id or self.task_ids or self.agent or self.token_agents):
            return True
        task_id = task_of(event)
        # A workflow's own events (evt.workflow.*) name it; a task's, through its task.
        workflow = event.payload.get("workflow_id") or workflows.get(task_id or "")
        if self.workflow_id is not None and workflow != self.workflow_id:
            return False
        if self.task_ids and task_id not in self.task_ids:
            return False
        agents = {event.payload.get(f) for f in AGENT_FIELDS}
        if self.agent is not None and self.agent not in agents:
            return False
        # A bound token's stream carries its agents' envelopes only (task, message and
        # publication events all name their agents).
        return not (self.token_agents and not self.token_agents & agents)


def task_of(event: Envelope) -> str | None:
    """The task an event is about (task events only)."""
    task_id = event.payload.get("task_id")
    return str(task_id) if task_id is not None else None


def _uuid(field: str, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return str(UUID(value))
    except ValueError:
        raise InvalidFilter(field, f"{field} must be a UUID, not {value!r}") from None


def _position(value: str | None) -> int | None:
    if value is None:
        return None
    if not value.isdigit() or len(value) > 18:
        raise InvalidFilter("after", f"after must be a stream position (0 or more), not {value!r}")
    return int(value)

"""What an agent is: a named handler of task types, with its retry policy.

An agent subclasses :class:`Agent`, declares its settings as class attributes and
implements :meth:`Agent.handle`. The worker decides from :meth:`Agent.is_retryable`
whether a raised error is retried with backoff or fails the task for good.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar
from uuid import UUID


class PermanentError(Exception):
    """An error that retrying cannot fix: the task goes to ``failed`` at once."""


class InvalidPayload(PermanentError):
    """The payload is unusable; ``field`` names the offending key."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"payload.{field}: {message}")
        self.field = field


class TaskCancelled(Exception):
    """Raised inside a handler once the task is cancelled, timed out or its lease lost."""


@dataclass
class TaskContext:
    """What a handler sees of its task, and its cooperative cancellation flag."""

    id: UUID
    agent_name: str
    task_type: str
    payload: dict[str, Any]
    attempt: int  # attempts already counted: 0 on the first run
    max_attempts: int
    workflow_id: UUID | None = None
    trace_id: str | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)

    def check_cancelled(self) -> None:
        """Raise :class:`TaskCancelled` if the worker asked this handler to stop."""
        if self.cancelled.is_set():
            raise TaskCancelled(str(self.id))

    def sleep(self, seconds: float) -> None:
        """Sleep, waking early with :class:`TaskCancelled` if the task is cancelled."""
        if self.cancelled.wait(seconds):
            raise TaskCancelled(str(self.id))


class Agent:
    """Base class of every agent. Subclasses set ``name`` and ``task_types``."""

    name: ClassVar[str]
    task_types: ClassVar[tuple[str, ...]]
    description: ClassVar[str] = ""
    # Retry n waits n² × base_delay seconds (spec 001 §5): 5 s, 20 s, 45 s, …
    base_delay: ClassVar[float] = 5.0
    max_attempts: ClassVar[int] = 3
    # Seconds a handler may run before the attempt fails as a retryable timeout.
    timeout: ClassVar[float] = 300.0
    # Errors worth retrying. PermanentError (and so InvalidPayload) never is.
    retryable_errors: ClassVar[tuple[type[BaseException], ...]] = (Exception,)

    def handle(self, task: TaskContext) -> dict[str, Any]:
        """Do the work. Return a JSON-serialisable result; raise to fail the attempt."""
        raise NotImplementedError

    def describe(self, task: TaskContext, result: dict[str, Any]) -> str:
        """The text of the AgentEvent written on completion, embedded into agent memory."""
        return f"{self.name} completed {task.task_type}: {result}"

    def is_retryable(self, error: BaseException) -> bool:
        return not isinstance(error, PermanentError) and isinstance(error, self.retryable_errors)

    @classmethod
    def settings(cls) -> dict[str, Any]:
        return {
            "name": cls.name,
            "task_types": list(cls.task_types),
            "description": cls.description,
            "base_delay": cls.base_delay,
            "max_attempts": cls.max_attempts,
            "timeout": cls.timeout,
            "retryable_errors": [e.__name__ for e in cls.retryable_errors],
        }


def require(payload: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    """``payload[key]``, checked for presence and type; :class:`InvalidPayload` otherwise."""
    if key not in payload:
        raise InvalidPayload(key, "is required")
    value = payload[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int in Python; a JSON true is never a valid number here.
    if isinstance(value, bool) and bool not in kinds:
        raise InvalidPayload(key, f"must be {_kind_names(kinds)}")
    if not isinstance(value, kinds):
        raise InvalidPayload(key, f"must be {_kind_names(kinds)}")
    return value


def _kind_names(kinds: tuple[type, ...]) -> str:
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        list: "a list",
        dict: "an object",
    }
    return " or ".join(names.get(k, k.__name__) for k in kinds)

"""What an agent is: a named handler of task types, with its retry policy.

An agent subclasses :class:`Agent`, declares its settings as class attributes and
implements :meth:`Agent.handle`. The worker decides from :meth:`Agent.is_retryable`
whether a raised error is retried with backoff or fails the task for good.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar
from uuid import UUID

from .storable import diagnostic_text

# A progress message longer than this is cut (it is a status line, not a log).
PROGRESS_MESSAGE_MAX_CHARS = 200


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
    # The last (fraction, message) reported, which the worker's heartbeat writes.
    reported_progress: tuple[float, str] | None = field(default=None, init=False, repr=False)

    def progress(self, fraction: float, message: str = "") -> None:
        """Report how far the task has got: ``fraction`` in [0, 1] and a short
        ``message`` (cut at ``PROGRESS_MESSAGE_MAX_CHARS``).

        Only the latest report is kept, in memory; the worker's next heartbeat writes
        it with the lease extension (every third of the lease), so calling this often
        costs no database write. ``ValueError`` for a fraction that is not a finite
        number in [0, 1], ``TypeError`` for a message that is not a string.
        """
        # One new tuple per report: the worker tells a new report by its identity.
        self.reported_progress = progress_report(fraction, message)

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
        return default_summary(self.name, task.task_type, result)

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


def progress_report(fraction: float, message: str) -> tuple[float, str]:
    """A progress report as the heartbeat writes it (``TaskContext.progress``, and a
    remote worker's): ``ValueError`` for a fraction that is not a finite number in
    [0, 1], ``TypeError`` for a message that is not a string."""
    if (
        isinstance(fraction, bool)
        or not isinstance(fraction, int | float)
        or not math.isfinite(fraction)
        or not 0 <= fraction <= 1
    ):
        raise ValueError(f"progress must be a finite number from 0 to 1, not {fraction!r}")
    if not isinstance(message, str):
        raise TypeError(f"a progress message must be a string, not {type(message).__name__}")
    # What PostgreSQL cannot store (NUL, unpaired surrogates) is replaced, so a
    # message never makes the heartbeat fail.
    # A status line's start says the most ("3 of 10 items: …"): it keeps its head.
    text = diagnostic_text(message[:PROGRESS_MESSAGE_MAX_CHARS], PROGRESS_MESSAGE_MAX_CHARS)
    return (float(fraction), text)


def default_summary(agent: str, task_type: str, result: Any) -> str:
    """The AgentEvent's text of a completion whose agent says nothing more."""
    return f"{agent} completed {task_type}: {result}"


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

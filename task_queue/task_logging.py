"""The task a log line is about, as the line's fields: ``task_id``, ``trace_id``,
``agent``, ``worker`` and ``attempt``.

One mechanism for every process: code working on a task runs inside
:func:`about_task` (a context variable, so that the agent's own log lines in its
handler carry the task too), and :class:`TaskFields`, a filter on the log handler
(``settings.LOGGING``), copies it onto each record the handler emits. With
``LOG_FORMAT=json`` they are keys of the line's object (docs/operations.md).

The context holds the task object itself and the fields are read from it only by the
filter, which runs only for lines that are emitted: below the log level, a task
costs a context variable's set and reset (:func:`enter`/:func:`leave`, which the
worker calls around each handler) and nothing more.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import Any, NamedTuple
from uuid import UUID

FIELDS = ("task_id", "trace_id", "agent", "worker", "attempt")


class TaskRef(NamedTuple):
    """A task known by its fields, in a process that runs no attempt of it (the relay,
    the embedder, the orchestrator): its lines' ``attempt`` is null unless the
    attempts already counted are known (an event names its attempt)."""

    id: UUID | str
    trace_id: str | None
    agent_name: str | None
    attempts: int | None = None


# (the task: a ClaimedTask, a TaskRef or anything with their fields; the worker)
_current: ContextVar[tuple[Any, str | None] | None] = ContextVar("task_log", default=None)


def enter(task: Any, worker: str | None = None) -> Token:
    """Lines on this thread from now on are about ``task``, until :func:`leave`.

    ``task`` has ``id``, ``trace_id`` and ``agent_name``; ``attempts`` (the attempts
    already counted, as a ``ClaimedTask`` has) makes the line's ``attempt`` count
    from 1, as the event stream's ``attempt`` does. None: lines about no task.
    """
    return _current.set(None if task is None else (task, worker))


def leave(token: Token) -> None:
    _current.reset(token)


def current_trace_id() -> str | None:
    """The trace of the task this thread works on (inside :func:`enter`), if any: what
    an agent sends while it runs a task carries it (``agents_app.messaging``)."""
    context = _current.get()
    return None if context is None else context[0].trace_id


@contextmanager
def about_task(task: Any, worker: str | None = None) -> Iterator[None]:
    """:func:`enter` and :func:`leave` around a block."""
    token = enter(task, worker)
    try:
        yield
    finally:
        leave(token)


class TaskFields(logging.Filter):
    """Adds the current task's fields to a record; never drops one. (A record that has
    them already, having passed another handler with this filter, keeps them.)"""

    def filter(self, record: logging.LogRecord) -> bool:
        context = _current.get()
        if context is not None and not hasattr(record, "task_id"):
            task, record.worker = context
            record.task_id = str(task.id)
            record.trace_id = task.trace_id
            record.agent = task.agent_name
            attempts = getattr(task, "attempts", None)
            record.attempt = None if attempts is None else attempts + 1
        return True

"""The task a log line is about, as the line's fields: ``task_id``, ``trace_id``,
``agent``, ``worker`` and ``attempt``.

One mechanism for every process: code working on a task runs inside
:class:`about_task` (a context variable, so that the agent's own log lines in its
handler carry the task too), and :class:`TaskFields`, a filter on the log handler
(``settings.LOGGING``), copies it onto each record the handler emits. With
``LOG_FORMAT=json`` they are keys of the line's object (docs/operations.md).

The filter runs only for lines that are emitted: below the log level, a task costs a
context variable's set and reset and nothing more. Fields a process does not know
(the relay runs no task: no worker, no attempt) are null.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar, Token
from typing import Any
from uuid import UUID

FIELDS = ("task_id", "trace_id", "agent", "worker", "attempt")

# (task id, trace id, agent, worker, attempt), as given: formatted only when emitted.
_Context = tuple[UUID | str, str | None, str | None, str | None, int | None]
_current: ContextVar[_Context | None] = ContextVar("task_log_context", default=None)


class about_task:
    """Log lines written inside this block (on this thread) are about this task.

    ``attempt`` counts from 1, as the event stream's ``attempt`` does.
    """

    __slots__ = ("_context", "_token")

    def __init__(
        self,
        task_id: UUID | str,
        *,
        trace_id: str | None,
        agent: str | None,
        worker: str | None = None,
        attempt: int | None = None,
    ) -> None:
        self._context: _Context = (task_id, trace_id, agent, worker, attempt)
        self._token: Token | None = None

    def __enter__(self) -> None:
        self._token = _current.set(self._context)

    def __exit__(self, *exc_info: Any) -> None:
        _current.reset(self._token)


def about_claimed(task: Any, worker: str) -> about_task:
    """:class:`about_task` for a task a worker holds (a ``ClaimedTask``)."""
    return about_task(
        task.id,
        trace_id=task.trace_id,
        agent=task.agent_name,
        worker=worker,
        attempt=task.attempts + 1,
    )


class TaskFields(logging.Filter):
    """Adds the current task's fields to a record; never drops one. (A record that has
    them already, having passed another handler with this filter, keeps them.)"""

    def filter(self, record: logging.LogRecord) -> bool:
        context = _current.get()
        if context is not None and not hasattr(record, "task_id"):
            record.task_id = str(context[0])
            _, record.trace_id, record.agent, record.worker, record.attempt = context
        return True

"""The task page's "In this trace" section: what else carries the task's trace.

A trace is what one request set going (docs/queue.md, "Trace ids"): a task enqueued
on its own starts one, a workflow's tasks share the workflow's, and the messages and
publications an agent sends while running a task carry its task's. The section
lists the trace's workflows, its tasks (the first ``TRACE_TASKS_SHOWN``, in the order
they were enqueued) and its messages and publications, each read by an index on
its trace (the partial ones need the ``has_key`` condition in the query).
"""

from __future__ import annotations

from typing import Any

from agents_app.models import AgentMessage, Publication
from task_queue.models import Task, Workflow

TRACE_TASKS_SHOWN = 50
TRACE_MESSAGES_SHOWN = 20


def trace_context(task: Task) -> dict[str, Any]:
    trace_id = task.trace_id
    if trace_id is None:  # a task enqueued before every task had a trace
        return {"trace_id": None}
    tasks = Task.objects.filter(trace_id=trace_id)
    traced = {"metadata__has_key": "trace_id", "metadata__trace_id": trace_id}
    messages = AgentMessage.objects.filter(**traced).order_by("created_at")
    publications = Publication.objects.filter(**traced).order_by("created_at")
    return {
        "trace_id": trace_id,
        "trace_tasks": tasks.order_by("created_at", "id").only(
            "id", "agent_name", "task_type", "status", "created_at"
        )[:TRACE_TASKS_SHOWN],
        "trace_task_count": tasks.count(),
        "trace_workflows": Workflow.objects.filter(trace_id=trace_id).only("id", "name")[:10],
        "trace_messages": messages.only(
            "id", "from_agent", "to_agent", "message_type", "status", "created_at"
        )[:TRACE_MESSAGES_SHOWN],
        "trace_publications": publications.only(
            "id", "publisher_agent", "event_name", "created_at"
        )[:TRACE_MESSAGES_SHOWN],
    }

"""``/api/v1/memory/similar`` and ``/api/v1/tasks/{id}/similar``: agent memory."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from django.http import HttpRequest
from ninja import Query, Router
from pydantic import Field

from agents_app.memory import similar_events, task_text
from task_queue.models import Task

from ..agents import own, token_agents
from ..auth import READ
from ..errors import ERROR_RESPONSES, ApiError
from ..schemas import SimilarEventOut, Text

router = Router(tags=["agent memory"])

K = Annotated[int, Field(ge=1, le=50, description="How many neighbours (1–50).")]


@router.get("/memory/similar", auth=READ, response={200: list[SimilarEventOut], **ERROR_RESPONSES})
def similar(
    request: HttpRequest,
    text: Annotated[str, Query(min_length=1, max_length=1000)],
    agent: Text | None = None,
    k: K = 5,
):
    """The embedded agent events nearest to ``text`` (cosine distance), nearest first,
    optionally of one agent."""
    return list(similar_events(text, agent=agent, k=k, among=token_agents(request)))


@router.get(
    "/tasks/{task_id}/similar", auth=READ, response={200: list[SimilarEventOut], **ERROR_RESPONSES}
)
def similar_to_task(request: HttpRequest, task_id: UUID, k: K = 5):
    """Past events of the task's agent nearest to what the task is about (its event's
    text once completed, else its type, payload and error); its own are left out."""
    task = own(request, Task.objects.filter(id=task_id), "agent_name").first()
    if task is None:
        raise ApiError.not_found("task")
    return list(similar_events(task_text(task), agent=task.agent_name, k=k, exclude_task=task.id))

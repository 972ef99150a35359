"""Agent memory: the embedding worker that fills ``agent_events.embedding``, and the
nearest-neighbour search agents and pages ask (``similar_events``).

The worker (``manage.py runembedder``) leases ``embedding_jobs`` with the same
``FOR UPDATE SKIP LOCKED`` claim as tasks, so any number of them share the work and
no job is embedded by two at once. A lease covers one batch (embedding a batch takes
milliseconds with the default embedder, so there is no heartbeat); a job whose
embedder died is given back when its lease runs out, and one that keeps failing is
retried with backoff, then marked dead. A lost database connection (a restart) is
waited out with backoff: the process carries on once the server is back.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.db import connection
from django.db.models import QuerySet
from pgvector.django import CosineDistance

from agents_app.sql import memory as memory_sql
from task_queue import leases
from task_queue.models import Task
from task_queue.retry import CONNECTION_ERRORS, Backoff
from task_queue.stop_signals import Stop
from task_queue.task_logging import TaskRef, about_task

from .embeddings import embed
from .models import AgentEvent

logger = logging.getLogger(__name__)

LEASE_SECONDS = 60.0
BASE_DELAY = 5.0


@dataclass
class EmbedderStats:
    embedded: int = 0
    failed: int = 0
    refused: int = 0  # completions whose lease had been lost


def embed_batch(
    owner: str, *, limit: int = 32, lease_seconds: float = LEASE_SECONDS
) -> EmbedderStats:
    """Claim up to ``limit`` jobs for ``lease_seconds``, embed their events and record
    the outcome."""
    stats = EmbedderStats()
    done: list[tuple[int, UUID, Sequence[float]]] = []
    for job in memory_sql.claim_embedding_jobs(
        owner=owner, limit=limit, lease_seconds=lease_seconds
    ):
        try:
            done.append((job.id, job.lease_token, embed(job.text)))
        except Exception as error:  # any embedder failure is this job's, not the worker's
            error_info = {
                "type": type(error).__name__,
                "message": str(error),
                "traceback": traceback.format_exc(),
            }
            status = memory_sql.fail_embedding_job(
                job.id, job.lease_token, error_info, BASE_DELAY, owner=owner
            )
            _log_failure(job, owner, error, status)
            stats.failed += 1
    if done:
        kept = memory_sql.complete_embedding_jobs(done, owner=owner)
        stats.embedded += len(kept)
        stats.refused += len(done) - len(kept)
    return stats


def _log_failure(
    job: memory_sql.ClaimedEmbeddingJob, owner: str, error: Exception, status: str | None
) -> None:
    """A warning about the failed job, with its task's fields when its event has a task
    (the trace is read only when the line is emitted; ``attempt`` is null: the event
    belongs to the task, not to one of its attempts)."""
    if not logger.isEnabledFor(logging.WARNING):
        return
    outcome = {"pending": "retrying", "dead": "given up"}.get(status or "", "lease lost")
    if job.task_id is None:
        logger.warning("embedding event %s failed (%s): %r", job.agent_event_id, outcome, error)
        return
    trace_id = Task.objects.filter(id=job.task_id).values_list("trace_id", flat=True).first()
    with about_task(TaskRef(job.task_id, trace_id, job.agent_name), owner):
        logger.warning(
            "embedding the event of task %s failed (%s): %r", job.task_id, outcome, error
        )


def run_embedder(
    stop: Stop, *, batch: int, poll: float, once: bool, lease_seconds: float = LEASE_SECONDS
) -> EmbedderStats:
    """Embed until ``stop`` is set (or, with ``once``, until nothing is due)."""
    owner = leases.holder_id()
    total = EmbedderStats()
    backoff = Backoff()
    while not stop.is_set():
        try:
            memory_sql.recover_embedding_jobs()
            stats = embed_batch(owner, limit=batch, lease_seconds=lease_seconds)
        except CONNECTION_ERRORS as error:
            # Jobs claimed before the loss are given back when their lease ends.
            delay = backoff.next()
            logger.warning("embedding failed (%s); retrying in %.1f s", error, delay)
            connection.close()
            stop.wait(delay)
            continue
        backoff.reset()
        total.embedded += stats.embedded
        total.failed += stats.failed
        total.refused += stats.refused
        busy = stats.embedded + stats.failed + stats.refused == batch
        if not busy and (once or stop.wait(poll)):
            break
    return total


def similar_events(
    text: str,
    *,
    agent: str | None = None,
    k: int = 5,
    exclude_task: UUID | None = None,
    among: Sequence[str] | None = None,
) -> QuerySet[AgentEvent]:
    """The ``k`` embedded agent events nearest to ``text`` (cosine distance, through the
    HNSW index), optionally of one agent, and only of the agents ``among`` names if
    given (a token bound to them), each with ``distance``."""
    events = AgentEvent.objects.exclude(embedding=None)
    if agent:
        events = events.filter(agent_name=agent)
    if among is not None:
        events = events.filter(agent_name__in=list(among))
    if exclude_task:
        events = events.exclude(task_id=exclude_task)
    return events.annotate(distance=CosineDistance("embedding", embed(text))).order_by("distance")[
        :k
    ]


def task_text(task: Any) -> str:
    """What a task is about, for finding similar ones: its AgentEvent's text once it
    completed, else its agent, type, payload and error."""
    event = AgentEvent.objects.filter(task_id=task.id).order_by("-created_at").first()
    if event:
        return event.content
    error = (task.error_info or {}).get("message", "")
    return f"{task.agent_name} {task.task_type} {task.payload} {error}"

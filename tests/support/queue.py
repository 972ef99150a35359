"""Moving tasks through their lifecycle in-process, as a worker would, for API tests."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from task_queue import operations
from task_queue.models import Task
from task_queue.sql import leasing
from task_queue.sql import outcomes as outcomes_sql

OWNER = "test-host:1"


def claimed_and_started(agent: str) -> list[leasing.ClaimedTask]:
    """Every due pending task of ``agent``, leased by ``OWNER`` and running."""
    return leasing.claim_tasks(owner=OWNER, agents=[agent], limit=1000, lease_seconds=30, now=None)


def claim_and_start(agent: str) -> list[tuple[UUID, UUID]]:
    """(id, lease token) of every due pending task of ``agent``, now running."""
    return [(t.id, t.lease_token) for t in claimed_and_started(agent)]


def complete_pending(agent: str, result: Any = None) -> list[UUID]:
    """Run every due pending task of ``agent`` to completed with ``result``."""
    held = claim_and_start(agent)
    done = [(i, token, json.dumps(result or {"ok": True}), None, "done") for i, token in held]
    return sorted(outcomes_sql.complete_tasks(owner=OWNER, done=done, now=None))


def fail_pending(agent: str, *, retryable: bool) -> list[tuple[UUID, str, int, Any]]:
    """Fail the current attempt of every due pending task of ``agent``.

    Retryable: back to pending (or dead once out of attempts); not: failed.
    """
    error = {
        "type": "Boom",
        "message": "boom",
        "traceback": "Traceback (most recent call last):\n  ...\nBoom: boom\n",
        "retryable": retryable,
    }
    failures = [
        (i, token, retryable, 0.0, json.dumps(error)) for i, token in claim_and_start(agent)
    ]
    return outcomes_sql.fail_tasks(owner=OWNER, failures=failures, now=None)


def status_of(task_id: UUID) -> str:
    return Task.objects.get(id=task_id).status


def make_failed(payloads: list[dict]) -> list[UUID]:
    """EchoAgent tasks with these payloads, failed for good (no worker runs while they
    are made; every other due EchoAgent task fails too)."""
    ids = [operations.enqueue("EchoAgent", "echo", payload).id for payload in payloads]
    fail_pending("EchoAgent", retryable=False)
    return ids

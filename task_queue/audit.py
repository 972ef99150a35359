"""The operator audit log: who did what to which tasks, and what they changed.

``record`` is called by the operations in ``task_queue.operations`` inside the
transaction that makes the change; nothing else writes ``operator_actions``.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from .models import OperatorAction


def user_actor(user: Any) -> str:
    """How a logged-in operator is named in the log and in task history."""
    return f"user:{user.get_username()}"


def record(
    *,
    actor: str,
    action: str,
    source: str,
    task_ids: Sequence[UUID] = (),
    agent_name: str | None = None,
    matched_filter: dict[str, Any] | None = None,
    changes: dict[str, Any] | None = None,
) -> OperatorAction:
    return OperatorAction.objects.create(
        actor=actor,
        action=action,
        source=source,
        task_ids=list(task_ids),
        agent_name=agent_name,
        matched_filter=matched_filter,
        changes=changes or {},
    )


def payload_diff(before: dict[str, Any], after: dict[str, Any]) -> str:
    """A unified diff of two payloads as indented, key-sorted JSON ('' when equal)."""

    def lines(payload: dict[str, Any]) -> list[str]:
        return json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False).splitlines()

    return "\n".join(
        difflib.unified_diff(
            lines(before), lines(after), "payload before", "payload after", lineterm=""
        )
    )

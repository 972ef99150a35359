"""System checks (``manage.py check``, and every command's start) for queue settings."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error

from task_queue.networks import network_problems


def metrics_allowed_networks(**kwargs: Any) -> list[Error]:
    return _networks("METRICS_ALLOWED_NETWORKS", "queue.E001")


def alert_webhook_allowed_networks(**kwargs: Any) -> list[Error]:
    return _networks("ALERT_WEBHOOK_ALLOWED_NETWORKS", "queue.E003")


def _networks(name: str, check_id: str) -> list[Error]:
    """A setting that lists networks: each entry a network (a bad one allows nothing)."""
    return [
        Error(
            f"{name}: {entry!r} is not a network ({problem})",
            hint='Comma-separated CIDRs, e.g. "127.0.0.1/32,10.0.0.0/8".',
            id=check_id,
        )
        for entry, problem in network_problems(getattr(settings, name))
    ]


def message_max_deliveries(**kwargs: Any) -> list[Error]:
    """Below 1, no message would ever be delivered (nor fail: it would just expire)."""
    value = settings.MESSAGE_MAX_DELIVERIES
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return []
    return [
        Error(
            f"MESSAGE_MAX_DELIVERIES: {value!r} is not a whole number of at least 1",
            hint="How often a message may be delivered unacknowledged before it fails.",
            id="queue.E002",
        )
    ]

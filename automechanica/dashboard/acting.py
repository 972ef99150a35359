"""Who acts from the dashboard, and whether they may: each state-changing page view
needs its permission, and its actions are recorded as the user's, from the dashboard."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

from task_queue.audit import user_actor


def require(request: HttpRequest, perm: str, what: str) -> None:
    """403 (``what`` needs ``perm``) unless the user has the permission."""
    if not request.user.has_perm(perm):
        raise PermissionDenied(f"{what} needs the {perm} permission")


def who(request: HttpRequest) -> dict[str, str]:
    """The actor and source an operation records for this request."""
    return {"actor": user_actor(request.user), "source": "dashboard"}

"""Calling the API in tests: in-process through Django's ASGI handler, or over HTTP
against a real daphne server."""

from __future__ import annotations

import json
from typing import Any

from asgiref.sync import async_to_sync
from django.test import AsyncClient

from automechanica.api.models import Scope
from automechanica.api.tokens import create_token

# The smallest valid task body.
ECHO = {"agent_name": "EchoAgent", "task_type": "echo"}


class Api:
    """The API through Django's ASGI request handler, in the test's own transaction.

    ``async_to_sync`` runs the (sync) views back on this thread, so they see the
    rows the test wrote without committing them.
    """

    def __init__(self, token: str | None) -> None:
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = AsyncClient()

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ):
        send = getattr(self.client, method.lower())
        headers = {**self.headers, **(headers or {})}
        if method.upper() in ("GET", "DELETE"):
            return async_to_sync(send)(path, headers=headers)
        data = raw if raw is not None else json.dumps(body) if body is not None else b""
        return async_to_sync(send)(
            path, data=data, content_type="application/json", headers=headers
        )

    def get(self, path: str):
        return self.call("GET", path)

    def post(self, path: str, body: Any = None, **kwargs: Any):
        return self.call("POST", path, body, **kwargs)

    def patch(self, path: str, body: Any = None):
        return self.call("PATCH", path, body)

    def delete(self, path: str):
        return self.call("DELETE", path)


def token(scope: Scope | str, name: str | None = None, agents: tuple[str, ...] = ()) -> str:
    """A new token; bound to ``agents`` if any (it then acts only as them in messaging)."""
    return create_token(name or f"test-{scope}", str(scope), agents)[1]


def field_names(response) -> list[str]:
    return [error["field"] for error in response.json()["field_errors"]]

"""The worker protocol's HTTP calls (docs/remote-agents.md), with retries while the
server is down or restarting."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import httpx

logger = logging.getLogger(__name__)

# Answers that mean "the server cannot answer right now" (a 500 is a database that is
# down or restarting as often as anything): retried with backoff. Retrying a write is
# safe: a second completion of the same lease is refused as lease_lost, never counted.
UNAVAILABLE = frozenset({500, 502, 503, 504})
MAX_BACKOFF_SECONDS = 10.0


class ApiError(Exception):
    """The API refused a request (a 4xx other than a lost lease, or a 5xx)."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body


class LeaseLost(Exception):
    """409 ``lease_lost``: the task is not this worker's any more; stop it."""


class Api:
    def __init__(self, url: str, token: str, *, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._client = httpx.Client(
            headers={"Authorization": f"Bearer {token}"}, timeout=httpx.Timeout(timeout)
        )
        self._closed = threading.Event()

    def close(self) -> None:
        self._closed.set()
        self._client.close()

    def post(
        self, path: str, body: dict[str, Any], *, retry: bool = True, read_timeout: float = 30.0
    ) -> dict[str, Any]:
        """POST ``body``; retried with backoff while the server is unreachable or
        answers 500 or 502-504 (``retry``); :class:`LeaseLost` or :class:`ApiError`
        otherwise."""
        delay = 0.2
        while True:
            try:
                response = self._client.post(
                    self.url + path, json=body, timeout=httpx.Timeout(10.0, read=read_timeout)
                )
            except httpx.TransportError as error:
                if not retry or self._closed.is_set():
                    raise
                logger.warning("%s: %s; retrying in %.1f s", path, error, delay)
            except RuntimeError:  # httpx: the client has been closed
                raise httpx.TransportError("the client was closed") from None
            else:
                if response.status_code not in UNAVAILABLE or not retry:
                    return _answer(response)
                logger.warning("%s: %d; retrying in %.1f s", path, response.status_code, delay)
            if self._closed.wait(delay):
                raise httpx.TransportError("the client was closed")
            delay = min(delay * 2, MAX_BACKOFF_SECONDS) * random.uniform(0.8, 1.2)

    def claim(
        self,
        agent: str,
        worker: str,
        limit: int,
        lease_seconds: float,
        wait_seconds: float,
        outcomes: Sequence[dict[str, Any]] = (),
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Claim up to ``limit`` tasks, recording ``outcomes`` first: the tasks, and the
        answer to each outcome in order."""
        body: dict[str, Any] = {
            "worker": worker,
            "limit": limit,
            "lease_seconds": lease_seconds,
            "wait_seconds": wait_seconds,
        }
        if outcomes:
            body["outcomes"] = list(outcomes)
        path = f"/api/v1/agents/{quote(agent, safe='')}/claim"
        answer = self.post(path, body, read_timeout=wait_seconds + 30)
        return answer["tasks"], answer.get("results", [])

    def claim_task(self, task_id: str, worker: str, lease_seconds: float) -> dict[str, Any]:
        """Claim the named task (a dispatch command's): the task, or :class:`ApiError`
        409 with the reason (``body["code"]``)."""
        body = {"worker": worker, "lease_seconds": lease_seconds}
        return self.post(f"/api/v1/tasks/{quote(task_id, safe='')}/claim", body)

    def heartbeat(
        self, task_id: str, lease_token: str, progress: tuple[float, str] | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"lease_token": lease_token}
        if progress is not None:
            body["progress"] = {"fraction": progress[0], "message": progress[1]}
        # Not retried: the next heartbeat is the retry, and a late one is worth nothing.
        return self.post(f"/api/v1/tasks/{task_id}/heartbeat", body, retry=False)

    def outcomes(self, outcomes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return self.post("/api/v1/outcomes", {"outcomes": outcomes})["results"]


def _answer(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = response.text
    if response.status_code == 409 and isinstance(body, dict) and body.get("code") == "lease_lost":
        raise LeaseLost(body.get("message", "lease lost"))
    if response.status_code >= 400:
        raise ApiError(response.status_code, body)
    return body

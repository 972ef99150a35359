"""A small JSON client for the AutoMechanica HTTP API (standard library only)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

from task_queue.stop_signals import Stop

# Where the orchestrator finds its token when --token is not given.
TOKEN_VARIABLE = "AUTOMECHANICA_API_TOKEN"


class ApiError(Exception):
    """The API answered with an error status; ``body`` is its error body."""

    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{method} {path}: {status} {message}")
        self.status = status
        self.body = body


class ApiClient:
    """Calls ``base_url`` with a bearer token. Connection failures (the server
    restarting) are retried with backoff for up to ``retry_seconds``, unless ``stop``
    is set: a shutdown must not wait out the retries."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        retry_seconds: float = 60,
        stop: Stop | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.retry_seconds = retry_seconds
        self.stop = stop or threading.Event()

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
        )
        deadline = time.monotonic() + self.retry_seconds
        delay = 0.2
        while True:
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return response.status, json.loads(response.read() or b"null")
            except urllib.error.HTTPError as error:
                raw = error.read()
                try:
                    content = json.loads(raw)
                except ValueError:
                    content = raw.decode(errors="replace")
                raise ApiError(method, path, error.code, content) from None
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() + delay > deadline or self.stop.wait(delay):
                    raise
                delay = min(delay * 2, 5)

    def get(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        return self.request("GET", f"{path}?{query}" if query else path)[1]

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body)[1]

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body)[1]

    def pages(self, path: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Every item of a paginated list, following ``next_cursor``."""
        cursor = None
        while True:
            page = self.get(path, **params, limit=500, cursor=cursor)
            yield from page["items"]
            cursor = page["next_cursor"]
            if cursor is None:
                return

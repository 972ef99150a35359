"""Following the API's live stream (``ws://HOST/api/v1/stream``, docs/api.md) for
the task events that move a workflow on, instead of polling.

The stream sends only the kinds in ``KINDS``. A reconnect resumes after the last
position seen (``?after=``), so no event is missed or seen twice; before the first
event there is no position to resume from, and the caller makes one polling pass
after each connect (``connected`` says when) to cover that gap.
"""

from __future__ import annotations

import json
import logging
import urllib.parse
from contextlib import ExitStack
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import ClientConnection, connect

from .driver import WORKFLOW_KINDS

log = logging.getLogger(__name__)

# A step can go on (completed), can never go on (cancelled), is stuck (failed, dead),
# or is stuck no more (revived); a workflow is held back (escalated) or not (resumed).
KINDS = (
    *(f"evt.task.{event}.v1" for event in ("completed", "failed", "dead", "cancelled", "revived")),
    *WORKFLOW_KINDS,
)
OPEN_TIMEOUT = 10.0
# What a failed connect or a dropped stream raises: the caller polls meanwhile.
UNAVAILABLE = (OSError, TimeoutError, InvalidHandshake, InvalidURI, ConnectionClosed)


class EventStream:
    def __init__(self, base_url: str, token: str) -> None:
        self.url = base_url.rstrip("/").replace("http", "ws", 1) + "/api/v1/stream"
        self.token = token
        self.position: int | None = None  # the last event's, to resume after
        self.socket: ClientConnection | None = None
        self._open = ExitStack()  # the socket, as a context (what websockets asks)

    def connect(self) -> bool:
        """Open the stream (resuming after ``position`` if known); False when
        ``connect`` had no position to resume from (events may have been missed)."""
        query = [("kind", kind) for kind in KINDS]
        if self.position is not None:
            query.append(("after", str(self.position)))
        self.socket = self._open.enter_context(
            connect(
                f"{self.url}?{urllib.parse.urlencode(query)}",
                additional_headers={"Authorization": f"Bearer {self.token}"},
                open_timeout=OPEN_TIMEOUT,
            )
        )
        return self.position is not None

    def receive(self, timeout: float) -> list[dict[str, Any]]:
        """The events that arrive within ``timeout`` seconds (waiting for the first,
        then taking the ones already there); raises one of ``UNAVAILABLE``."""
        if self.socket is None:
            raise ConnectionError("the stream is not open")
        events = []
        try:
            message = self.socket.recv(timeout=timeout)
            while True:
                event = json.loads(message)
                if "position" not in event:  # an error message: the socket closes
                    raise ConnectionError(f"the stream refused: {event}")
                events.append(event)
                self.position = event["position"]
                message = self.socket.recv(timeout=0)
        except TimeoutError:
            return events
        except UNAVAILABLE:
            self.close()
            if events:
                return events
            raise

    def close(self) -> None:
        self._open.close()
        self.socket = None

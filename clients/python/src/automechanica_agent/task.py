"""What a handler is given: one claimed task, its progress and its stop signal."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any


class Cancelled(Exception):
    """Raised by :meth:`Task.check_cancelled` and :meth:`Task.sleep` once the task must
    stop: a cancel was requested, the lease was lost, or the runner is shutting down."""


class PermanentError(Exception):
    """Raise it (or a subclass) from a handler for a failure not worth retrying."""


@dataclass
class Task:
    id: str
    agent_name: str
    task_type: str
    payload: Any
    attempt: int
    max_attempts: int
    trace_id: str | None
    workflow_id: str | None
    lease_token: str
    priority: int = 0
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    # Why the task must stop: "cancel requested", "lease lost", "shutdown".
    stop_reason: str | None = None
    _progress: tuple[float, str] | None = field(default=None, repr=False)

    @classmethod
    def from_claim(cls, claimed: dict[str, Any]) -> Task:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in claimed.items() if k in names and not k.startswith("_")})

    def progress(self, fraction: float, message: str = "") -> None:
        """How far the task has got (0 to 1); the next heartbeat sends the latest."""
        if isinstance(fraction, bool) or not 0 <= fraction <= 1 or not math.isfinite(fraction):
            raise ValueError(f"progress must be a number from 0 to 1, not {fraction!r}")
        self._progress = (float(fraction), str(message))

    def check_cancelled(self) -> None:
        if self.cancelled.is_set():
            raise Cancelled(self.stop_reason or "stopped")

    def sleep(self, seconds: float) -> None:
        """Sleep, but raise :class:`Cancelled` as soon as the task must stop."""
        if self.cancelled.wait(seconds):
            raise Cancelled(self.stop_reason or "stopped")

    def stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        self.cancelled.set()

"""Outcomes waiting to be sent, taken by whichever request goes first.

A busy worker's next claim carries them (``POST /api/v1/agents/{name}/claim`` with
``outcomes``): one request reports what finished and takes more, instead of two. The
sender sends them on their own when no claim is coming soon: at once while the
claimer waits (a long poll on an idle queue, or for the answers to its outcomes),
and otherwise once a claim has not taken them within ``carry_seconds``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

Outcome = dict[str, Any]


class Outbox:
    def __init__(self, carry_seconds: float) -> None:
        self.carry_seconds = carry_seconds
        self._changed = threading.Condition()
        self._pending: list[Outcome] = []
        self._since = 0.0  # time.monotonic() when the oldest pending outcome came
        self._claim_coming = False
        self._closed = False

    def put(self, outcomes: list[Outcome], *, first: bool = False) -> None:
        """Outcomes to send; ``first``: ahead of the others (ones a request took and
        could not send after all)."""
        with self._changed:
            if not self._pending:
                self._since = time.monotonic()
            where = 0 if first else len(self._pending)
            self._pending[where:where] = outcomes
            self._changed.notify_all()

    def take(self, limit: int) -> list[Outcome]:
        """Up to ``limit`` pending outcomes, oldest first, for a claim to carry."""
        with self._changed:
            taken = self._pending[:limit]
            del self._pending[:limit]
            self._since = time.monotonic()
            return taken

    def claim_coming(self, coming: bool) -> None:
        """The claimer says whether its next claim goes out at once (its last one got
        tasks), or it waits (for tasks, or for its outcomes' answers)."""
        with self._changed:
            self._claim_coming = coming
            self._changed.notify_all()

    def close(self) -> None:
        """No claim will carry anything any more: the sender sends the rest and ends."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def next_batch(self, limit: int) -> list[Outcome] | None:
        """For the sender: the next outcomes to send on their own, once no claim is
        coming for them; None once closed with none left."""
        with self._changed:
            while True:
                if self._pending:
                    if self._closed or not self._claim_coming:
                        return self.take(limit)
                    left = self._since + self.carry_seconds - time.monotonic()
                    if left <= 0:
                        return self.take(limit)
                    self._changed.wait(left)
                elif self._closed:
                    return None
                else:
                    self._changed.wait()

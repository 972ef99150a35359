"""Which database errors a long-running process waits out, which it does not, and how
long it waits between tries."""

from __future__ import annotations

from django.db import InterfaceError, OperationalError

# The connection was lost or refused (a restart, a network blip): the same statement
# can succeed later. Any other DatabaseError is about the statement or its data, and
# retrying it unchanged would fail forever.
CONNECTION_ERRORS = (OperationalError, InterfaceError)


class Backoff:
    """Delays between tries while the database is unreachable: ``first`` seconds,
    doubling up to ``most``; :meth:`reset` once a try succeeded."""

    def __init__(self, first: float = 0.1, most: float = 5.0) -> None:
        self.first = first
        self.most = most
        self._next = first

    def next(self) -> float:
        """The delay before the next try (each call doubles the one after)."""
        delay = self._next
        self._next = min(delay * 2, self.most)
        return delay

    def reset(self) -> None:
        self._next = self.first

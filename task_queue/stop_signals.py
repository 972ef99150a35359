"""SIGINT and SIGTERM as a stop request that a command's loop waits on.

A signal handler may only do async-signal-safe work: a second signal can arrive while
the first handler runs, and a handler that takes a lock (``threading.Event.set`` does)
then waits forever for the lock the interrupted handler holds. So the handler here
only writes a byte to a pipe, and the loop waits on the pipe's read end (``select``
wakes when a byte arrives). The long-running commands share this one mechanism
(``runworker`` writes the signal's number to a pipe of its own, to tell a first
signal from a second).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from types import FrameType, TracebackType
from typing import Protocol


class Stop(Protocol):
    """What a loop needs of a stop request: a ``threading.Event`` or :class:`StopSignals`."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class StopSignals:
    """A stop request made by SIGINT/SIGTERM (or :meth:`set`), usable where a
    ``threading.Event`` is waited on: ``is_set()`` and ``wait(timeout)``. Use it in a
    ``with`` block in the main thread; leaving the block puts the previous handlers
    back (a signal after that is the process's default: it is leaving anyway)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self._read = self._write = -1
        self._previous: dict[int, object] = {}
        self._stopped = False

    def __enter__(self) -> StopSignals:
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        try:
            self._previous = {
                signum: signal.signal(signum, self._on_signal) for signum in self.SIGNALS
            }
        except ValueError:  # not the main thread
            self._close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stopped = self.is_set()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._close()

    def _close(self) -> None:
        for fd in (self._read, self._write):
            if fd >= 0:
                os.close(fd)
        self._read = self._write = -1

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.set()

    def set(self) -> None:
        if self._write < 0:
            self._stopped = True
            return
        with contextlib.suppress(BlockingIOError):  # the pipe is full of requests already
            os.write(self._write, b"\0")

    def is_set(self) -> bool:
        return self.wait(0)

    def wait(self, timeout: float | None = None) -> bool:
        """True once a stop was requested, waiting up to ``timeout`` seconds for one.
        The byte stays in the pipe, so every later call answers True at once."""
        if self._read < 0:  # outside the block: what was known when it ended
            return self._stopped
        poller = select.poll()
        poller.register(self._read, select.POLLIN)
        return bool(poller.poll(None if timeout is None else max(timeout, 0) * 1000))

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
    ``threading.Event`` is waited on: ``is_set()`` and ``wait(timeout)``."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        self._previous = {signum: signal.signal(signum, self._on_signal) for signum in self.SIGNALS}
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.is_set():
            # Stopping on a signal: a second one, which often comes right behind the
            # first (a wrapper and its child both get it), must not kill the process
            # on its way out, so the handler stays until the process ends.
            return
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        os.close(self._write)
        os.close(self._read)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.set()

    def set(self) -> None:
        with contextlib.suppress(BlockingIOError):  # the pipe is full of requests already
            os.write(self._write, b"\0")

    def is_set(self) -> bool:
        return self.wait(0)

    def wait(self, timeout: float | None = None) -> bool:
        """True once a stop was requested, waiting up to ``timeout`` seconds for one.
        The byte stays in the pipe, so every later call answers True at once."""
        readable, _, _ = select.select([self._read], [], [], timeout)
        return bool(readable)

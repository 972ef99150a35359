"""Waiting for a state instead of sleeping a guessed time."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], object], *, timeout: float = 30, what: str = "condition"):
    """Poll ``condition`` (a database query, a process state) until it is truthy, and
    return its value.

    Tests synchronise on state this way rather than sleeping a guessed time; the
    timeout only bounds a failure.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)

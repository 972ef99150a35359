"""Waiting for a state instead of sleeping a guessed time."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(
    condition: Callable[[], object],
    *,
    timeout: float = 30,
    what: str = "condition",
    describe: Callable[[], object] | None = None,
):
    """Poll ``condition`` (a database query, a process state) until it is truthy, and
    return its value.

    Tests synchronise on state this way rather than sleeping a guessed time; the
    timeout only bounds a failure, whose message ends with what ``describe`` returns
    then (the rows that were not there yet, say).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            state = f": {_described(describe)}" if describe else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{state}")
        time.sleep(0.02)


def _described(describe: Callable[[], object]) -> object:
    """What ``describe`` returns, or why it could not say (a database just restarted)."""
    try:
        return describe()
    except Exception as error:  # the timeout is the failure to report, not this
        return f"(could not describe: {error!r})"

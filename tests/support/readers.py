"""Processes that wait on a notification channel, so one commit releases them together
(the messaging tests' readers, the daily report's schedulers)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from django.db import connection

from tests.support.processes import start_python
from tests.support.waiting import wait_for


def start_waiting_readers(script: str, count: int, channel: str) -> list[subprocess.Popen]:
    """``count`` processes running ``script``, returned once each LISTENs on
    ``channel`` (so one commit wakes them all at once)."""
    readers = [start_python(script) for _ in range(count)]
    wait_for(lambda: _listening(channel) == count, timeout=60, what=f"{count} waiting readers")
    return readers


def outputs(readers: list[subprocess.Popen]) -> list[Any]:
    """What each reader printed, as JSON; every one must have exited cleanly."""
    results = [reader.communicate(timeout=120) for reader in readers]
    assert all(reader.returncode == 0 for reader in readers), [err for _, err in results]
    return [json.loads(out) for out, _ in results]


def _listening(channel: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query = %s",
            [f"LISTEN {channel}"],
        )
        return cursor.fetchone()[0]

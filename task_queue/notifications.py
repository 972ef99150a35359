"""LISTEN for newly due tasks and wake the worker's fetch loop.

Enqueuers call ``pg_notify`` inside their transaction, so a notification arrives
only for committed tasks. A dedicated connection in autocommit mode listens; it
reconnects after an error, and the worker's poll timer covers what it missed. It
first checks that notifications reach it (``heard``), and warns where they do not.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

import psycopg

from task_queue.listen import HEARD_WITHIN_SECONDS, heard, listening, warn_not_in_effect
from task_queue.retry import CONNECTION_ERRORS
from task_queue.sql.channels import NOTIFY_CHANNEL
from task_queue.sql.connections import listen_sessions_shared

logger = logging.getLogger(__name__)


class Listener:
    def __init__(self, agents: Iterable[str], wake: threading.Event, poll_seconds: float) -> None:
        self.agents = set(agents)
        self.wake = wake
        self.poll_seconds = poll_seconds
        # How long the check that LISTEN is in effect waits for its notification: a
        # warning comes within one poll interval.
        self.check_seconds = min(HEARD_WITHIN_SECONDS, poll_seconds)
        self.checked = threading.Event()  # set once it is known whether LISTEN works
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        instead = f"polling for new tasks every {self.poll_seconds:.1f} s instead"
        while not self._stop.is_set():
            try:
                if listen_sessions_shared():  # no LISTEN would be in effect: none is made
                    warn_not_in_effect(True, instead)
                    self.checked.set()
                    return
                with listening(NOTIFY_CHANNEL) as conn:
                    if not heard(conn, self.check_seconds):
                        warn_not_in_effect(False, instead)
                    self.checked.set()
                    self.wake.set()  # anything enqueued while not listening
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            if note.payload in self.agents:
                                self.wake.set()
            except (psycopg.OperationalError, *CONNECTION_ERRORS) as error:
                logger.warning("listener connection failed (%s); reconnecting", error)
                self._stop.wait(1.0)

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

from task_queue.listen import HEARD_WITHIN_SECONDS, heard, listening
from task_queue.sql.channels import NOTIFY_CHANNEL

logger = logging.getLogger(__name__)


class Listener:
    def __init__(self, agents: Iterable[str], wake: threading.Event, poll_seconds: float) -> None:
        self.agents = set(agents)
        self.wake = wake
        self.poll_seconds = poll_seconds
        # How long the check that LISTEN is in effect waits for its notification: a
        # warning comes within one poll interval.
        self.check_seconds = min(HEARD_WITHIN_SECONDS, poll_seconds)
        self.ready = threading.Event()  # set once LISTEN is seen to be in effect
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with listening(NOTIFY_CHANNEL) as conn:
                    if heard(conn, self.check_seconds):
                        self.ready.set()
                    else:
                        logger.warning(
                            "LISTEN is not in effect: a notification did not arrive within "
                            "%.1f s (behind a pooler in transaction mode, set "
                            "DATABASE_LISTEN_URL); polling for new tasks every %.1f s instead",
                            self.check_seconds,
                            self.poll_seconds,
                        )
                    self.wake.set()  # anything enqueued while not listening
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            if note.payload in self.agents:
                                self.wake.set()
            except psycopg.OperationalError as error:
                logger.warning("listener connection failed (%s); reconnecting", error)
                self._stop.wait(1.0)

"""Where a worker's next claim starts reading each agent's pending tasks.

A claim reads each agent's due tasks in order from tasks_pending_lease_idx (agent,
priority, created_at). Every task claimed leaves its entry there, at the head where
the next claim starts, until a vacuum removes it; autovacuum comes at most every
``autovacuum_naptime`` (10 s on the embedded server), so behind a backlog each claim
walked past up to a hundred thousand such entries, hundreds of index pages, for its
50 tasks: the cost per task grew with the backlog (issue 15, target 4).

Behind a backlog (the last claim got all it asked for), the next claim of each agent
starts where this worker's last claim of it began, at the first task it got: the
entries before it are of tasks already claimed, or locked by another claim. Tasks
can become pending before that point later: a retry, a revived or released task, a
task of higher priority, or one whose enqueue committed after later-made tasks had
been claimed (``created_at`` is when its row was written). None is lost; they are claimed,
in order, by the next claim from the head of the index: one every
``FULL_SCAN_EVERY_SECONDS``, and every claim after one that did not fill its room
(a short queue). So behind a backlog the order is by priority, then age, within that
interval.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime

# At most this long between claims that read each agent's tasks from the head.
FULL_SCAN_EVERY_SECONDS = 0.1

Start = tuple[int, datetime]  # (priority, created_at) in the lease index's order


class ClaimPosition:
    """One worker's claim starts, per agent; not shared between threads."""

    def __init__(
        self,
        *,
        full_scan_every: float = FULL_SCAN_EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.full_scan_every = full_scan_every
        self.clock = clock
        self._starts: dict[str, Start] = {}
        self._full_scan_due = clock()

    def starts(self, agents: Sequence[str]) -> list[Start | None]:
        """Where the next claim starts, per agent; None: at the head of the index."""
        if self.clock() >= self._full_scan_due:
            self._starts.clear()
            self._full_scan_due = self.clock() + self.full_scan_every
        return [self._starts.get(agent) for agent in agents]

    def claimed(self, tasks: Iterable[tuple[str, int, datetime]], *, filled: bool) -> None:
        """After a claim: ``tasks`` are the (agent, priority, created_at) it got;
        ``filled`` whether it got as many as it asked for."""
        self._starts.clear()
        if not filled:
            return  # a short queue: claims read from the head, as without a position
        for agent, priority, created_at in tasks:
            start = (priority, created_at)
            if agent not in self._starts or start < self._starts[agent]:
                self._starts[agent] = start

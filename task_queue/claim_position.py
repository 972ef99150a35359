"""Where a worker's next claim starts reading each agent's pending tasks.

A claim reads each agent's due tasks in order from tasks_pending_lease_idx (agent,
priority, created_at). Every task claimed leaves its entry there, at the head where
the next claim starts, until a vacuum removes it; autovacuum comes at most every
``autovacuum_naptime`` (10 s on the embedded server), so behind a backlog each claim
walked past up to a hundred thousand such entries, hundreds of index pages, for its
50 tasks: the cost per task grew with the backlog.

Behind a backlog (the last claim got all it asked for), the next claim of each agent
starts where this worker's last claim of it began, at the first task it got: the
entries before it were claimed, locked by other claims, or not due then. Tasks
can become due before that point later: a task of higher priority, a retry, a
revived, released or reaped task, a delayed task whose time came, a row another claim
locked and let go, or a task whose enqueue committed after later-made tasks had been
claimed (``created_at`` is when its row was written). None is lost: the worker's next
claim from the head of the index takes them, in order; one comes at least every
``HEAD_SCAN_EVERY_SECONDS`` and after every claim that got fewer tasks than it asked
for (a short queue). Until then this worker's claims go on behind them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime

# At most this long between a worker's claims that read from the head of the index.
HEAD_SCAN_EVERY_SECONDS = 0.1

Start = tuple[int, datetime]  # (priority, created_at) in the lease index's order


class ClaimPosition:
    """One worker's claim starts, per agent; not shared between threads."""

    def __init__(
        self,
        *,
        from_head_every: float = HEAD_SCAN_EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.from_head_every = from_head_every
        self.clock = clock
        self._starts: dict[str, Start] = {}
        self._from_head_due = clock()

    def next_starts(self, agents: Sequence[str]) -> list[Start | None]:
        """Where the claim about to run starts, per agent (None: at the head of the
        index); once ``from_head_every`` has passed, the head for every agent."""
        if self.clock() >= self._from_head_due:
            self._starts.clear()
            self._from_head_due = self.clock() + self.from_head_every
        return [self._starts.get(agent) for agent in agents]

    def claimed(self, tasks: Iterable[tuple[str, int, datetime]], *, filled: bool) -> None:
        """After a claim: ``tasks`` are the (agent, priority, created_at) of the tasks
        it got, at least of each agent's first; ``filled`` whether it got as many as it
        asked for."""
        self._starts.clear()
        if not filled:
            return  # a short queue: claims read from the head, as without a position
        for agent, priority, created_at in tasks:
            start = (priority, created_at)
            if agent not in self._starts or start < self._starts[agent]:
                self._starts[agent] = start

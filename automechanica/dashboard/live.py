"""The live hub: one per server process, feeding every open dashboard of that process,
from the first socket until the last one closes.

It does two things, whatever the number of open pages:

- once a second, while someone watches the overview, it takes one snapshot
  (``overview.take_snapshot``), renders the fragment once per permission variant
  and sends it to the ``overview`` group (the schedules page likewise); it renders
  once, for all their watchers, the workers page and each watched workflow page;
- it LISTENs on ``TASK_CHANGES_CHANNEL``, where a trigger on ``tasks`` reports every
  change a page shows, and tells the dead-letter pages which rows left the dead
  letter and how many arrived, and each task page that its task changed.

Groups live in the process's in-memory channel layer: every server process runs its
own hub against PostgreSQL, so no Redis (or other shared layer) is needed, with one
process or many.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from task_queue.listen import (
    HEARD_WITHIN_SECONDS,
    heard_async,
    listening_async,
    warn_not_in_effect,
)
from task_queue.models import REVIVABLE_STATUSES
from task_queue.sql.channels import TASK_CHANGES_CHANNEL
from task_queue.sql.connections import listen_sessions_shared

from . import fragments, schedules
from .overview import take_snapshot

logger = logging.getLogger(__name__)

OVERVIEW, WORKERS, DEAD_LETTER, WORKFLOWS = "overview", "workers", "dead_letter", "workflows"
SCHEDULES = "schedules"
TICK_SECONDS = 1.0
# What the dashboard does without LISTEN.
NOT_LIVE = f"the dashboard's task lists are not updated live, its counts every {TICK_SECONDS:.0f} s"


def html_message(html: str) -> str:
    """A socket message of fragments the page swaps in by element id (live.js)."""
    return json.dumps({"type": "html", "html": html})


def changes_message(**changes: Any) -> str:
    """A socket message of changes the page applies itself (live.js)."""
    return json.dumps({"type": "changes", **changes})


def task_group(task_id: str) -> str:
    return f"task.{task_id}"


def workflow_group(workflow_id: str) -> str:
    return f"workflow.{workflow_id}"


class Hub:
    def __init__(self) -> None:
        self.watchers: Counter[str] = Counter()  # group → open sockets in this process
        self.snapshots_taken = 0
        self.listening = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def join(self, group: str) -> None:
        self.watchers[group] += 1
        loop = asyncio.get_running_loop()
        if self._loop is not loop or not self._tasks:  # first socket, or a new loop (tests)
            self._stop()
            self._loop = loop
            self.listening = asyncio.Event()
            self._tasks = [loop.create_task(self._tick()), loop.create_task(self._listen())]

    def leave(self, group: str) -> None:
        self.watchers[group] -= 1
        if self.watchers[group] <= 0:
            del self.watchers[group]
        if not self.watchers:
            # No page of this process is open: stop listening, so that the trigger on
            # tasks stops notifying (channel_listeners); the next page starts again.
            self._stop()

    def _stop(self) -> None:
        for task in self._tasks:
            with contextlib.suppress(RuntimeError):  # its loop is closed already
                task.cancel()
        self._tasks = []

    # ------------------------------------------------------------ once a second

    async def _tick(self) -> None:
        layer = get_channel_layer()
        while True:
            await asyncio.sleep(TICK_SECONDS - time.time() % TICK_SECONDS)
            try:
                if self.watchers[OVERVIEW]:
                    variants = await database_sync_to_async(self._render_overview)()
                    await layer.group_send(OVERVIEW, {"type": "overview.push", **variants})
                if self.watchers[SCHEDULES]:
                    variants = await database_sync_to_async(_render_schedules)()
                    await layer.group_send(SCHEDULES, {"type": "schedules.push", **variants})
                for group, render in self._rendered_each_tick():
                    html = await database_sync_to_async(render)()
                    if html:
                        message = html_message(html)
                        await layer.group_send(group, {"type": "html.push", "message": message})
                for group, workflow_id in self._watched_workflows():
                    variants = await database_sync_to_async(_render_workflow)(workflow_id)
                    if variants:
                        await layer.group_send(group, {"type": "workflow.push", **variants})
            except Exception:
                logger.exception("live update failed; trying again in a second")

    def _rendered_each_tick(self) -> list[tuple[str, Callable[[], str | None]]]:
        """The watched pages that are re-rendered every tick (no notification says
        when a worker's heartbeat or a workflow's progress changed)."""
        every_tick = {WORKERS: fragments.render_workers, WORKFLOWS: fragments.render_workflows}
        return [(group, every_tick[group]) for group in list(self.watchers) if group in every_tick]

    def _watched_workflows(self) -> list[tuple[str, str]]:
        """(group, workflow id) of each watched workflow page (re-rendered every tick,
        in the variants of its Resume button)."""
        prefix = workflow_group("")
        return [(g, g.removeprefix(prefix)) for g in list(self.watchers) if g.startswith(prefix)]

    def _render_overview(self) -> dict[str, Any]:
        snapshot = take_snapshot()
        self.snapshots_taken += 1
        return {
            fragments.overview_variant(**rights): html_message(
                fragments.render_overview(snapshot, **rights)
            )
            for can_pause in (True, False)
            for can_limit in (True, False)
            if (rights := {"can_pause": can_pause, "can_limit": can_limit})
        }

    # ------------------------------------------------------------ task changes

    async def _listen(self) -> None:
        lost = False  # LISTEN was lost: what changed meanwhile was notified to no one
        while True:
            try:
                if await sync_to_async(listen_sessions_shared, thread_sensitive=False)():
                    warn_not_in_effect(True, NOT_LIVE)
                    self.listening.set()  # (started: pages wait for it)
                    return
                async with listening_async(TASK_CHANGES_CHANNEL) as conn:
                    if not await heard_async(conn, HEARD_WITHIN_SECONDS):
                        warn_not_in_effect(False, NOT_LIVE)
                    self.listening.set()
                    if lost:  # every open page looks again, as for a change it cannot name
                        await self._dispatch(CHANGED_UNKNOWN)
                        lost = False
                    async for note in conn.notifies():
                        await self._dispatch(json.loads(note.payload))
            except Exception as error:  # the hub must outlive any one failure
                self.listening.clear()
                lost = True
                logger.warning("listening for task changes failed (%r); reconnecting", error)
                await asyncio.sleep(1.0)

    async def _dispatch(self, change: dict[str, Any]) -> None:
        layer = get_channel_layer()
        tasks, beyond_sample = change["tasks"], change["more"]
        if self.watchers[DEAD_LETTER] and (change["left"] or change["arrived"]):
            left = [i for i, old, new in tasks if _dead(old) and not _dead(new)]
            event = {
                "left": left,
                "arrived": change["arrived"],
                "unknown": change["left"] - len(left),  # left, but beyond the sample
            }
            await layer.group_send(DEAD_LETTER, {"type": "dead_letter.changed", **event})
        if beyond_sample:  # which tasks is not known: every open task page looks again
            changed_pages = [g for g in self.watchers if g.startswith("task.")]
        else:
            changed_pages = [task_group(task_id) for task_id, _, _ in tasks]
        for group in changed_pages:
            if self.watchers[group]:
                await layer.group_send(group, {"type": "task.changed"})


# A change notification that names no task: the dead-letter pages fetch their results
# again, and every task page its task.
CHANGED_UNKNOWN = {"tasks": [], "more": True, "left": 1, "arrived": 0}


def _render_workflow(workflow_id: str) -> dict[str, str] | None:
    variants = fragments.render_workflow_variants(workflow_id)
    return variants and {name: html_message(html) for name, html in variants.items()}


def _render_schedules() -> dict[str, str]:
    """The schedules table in each variant of the buttons it shows (by permission)."""
    return {name: html_message(html) for name, html in schedules.render_variants().items()}


def _dead(status: str) -> bool:
    return status in REVIVABLE_STATUSES


hub = Hub()

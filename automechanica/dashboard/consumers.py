"""The dashboard's WebSocket: one consumer, one group per kind of page.

Only a logged-in staff user gets a socket (others are refused at the handshake,
which the browser sees as a failed connection); ``asgi.py`` checks the Origin
header before this runs. Every message is JSON that names its type (``live.py``
makes them): ``html``, fragments the htmx ws extension swaps in by element id, or,
on the dead-letter page, ``changes`` that ``live.js`` applies (so a page never
receives HTML for rows it does not show).

A socket outlives the request that opened it, so before sending anything the
consumer looks at the session again (at most every ``RECHECK_SECONDS``): a user who
logged out, lost staff status or was deactivated gets the socket closed with code
``SIGNED_OUT``, and a changed permission changes what the next push shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from importlib import import_module
from types import SimpleNamespace
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib import auth

from . import fragments, schedules
from .limits import LIMIT_PERMISSION
from .live import changes_message, html_message, hub, task_group, workflow_group

# How long a new page's socket waits for its process's hub to listen before it opens.
HUB_START_SECONDS = 5.0

RECHECK_SECONDS = 5.0
SIGNED_OUT = 4403  # an application close code; live.js tells the operator to log in


class LiveConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        self.user = self.scope.get("user")
        if not _may_watch(self.user):
            await self.close()  # before accept(): the handshake is answered 403
            return
        page = self.scope["url_route"]["kwargs"]["page"]
        groups = {"task": task_group, "workflow": workflow_group}
        object_id = self.scope["url_route"]["kwargs"].get("object_id")
        self.group = groups[page](str(object_id)) if page in groups else page
        self.task_id = object_id if page == "task" else None
        self.checked_at, self.signed_out = time.monotonic(), False
        await self._read_permissions()
        await self.channel_layer.group_add(self.group, self.channel_name)
        hub.join(self.group)
        # The hub hears changes once it listens (it starts with the first page of the
        # process). The socket opens after that, so a page that shows itself live (its
        # badge) hears every change from then on, and a catch-up misses none.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(hub.listening.wait(), HUB_START_SECONDS)
        await self.accept()
        if page == "task":  # catch up with what changed while not connected
            await self.task_changed({})

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            hub.leave(self.group)
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The pages only listen; anything they send is ignored."""

    async def overview_push(self, event: dict[str, Any]) -> None:
        if await self._still_allowed():
            variant = fragments.overview_variant(can_pause=self.can_pause, can_limit=self.can_limit)
            await self.send(text_data=event[variant])

    async def schedules_push(self, event: dict[str, Any]) -> None:
        if await self._still_allowed():
            await self.send(text_data=event[self.schedules_variant])

    async def workflow_push(self, event: dict[str, Any]) -> None:
        if await self._still_allowed():
            await self.send(text_data=event[fragments.workflow_variant(self.can_resume)])

    async def html_push(self, event: dict[str, Any]) -> None:
        if await self._still_allowed():
            await self.send(text_data=event["message"])

    async def dead_letter_changed(self, event: dict[str, Any]) -> None:
        """Rows that left (removed if shown), how many arrived, and how many changes
        the notification could not list (the page then reloads its results)."""
        if await self._still_allowed():
            change = {key: event[key] for key in ("left", "arrived", "unknown")}
            await self.send(text_data=changes_message(dead_letter=change))

    async def task_changed(self, event: dict[str, Any]) -> None:
        if await self._still_allowed():
            html = await database_sync_to_async(self._render_task)()
            if html:
                await self.send(text_data=html_message(html))

    def _render_task(self) -> str | None:
        task = fragments.load_task(self.task_id)
        return fragments.render_task(task, self.user) if task else None

    async def _still_allowed(self) -> bool:
        if self.signed_out:
            return False
        if time.monotonic() - self.checked_at < RECHECK_SECONDS:
            return True
        self.checked_at = time.monotonic()
        self.user = await database_sync_to_async(self._user_now)()
        if not _may_watch(self.user):
            self.signed_out = True  # nothing more is sent while the socket closes
            await self.close(code=SIGNED_OUT)
            return False
        await self._read_permissions()
        return True

    async def _read_permissions(self) -> None:
        """The permissions that change what a push shows (its variant)."""
        has_perm = database_sync_to_async(self.user.has_perm)
        self.can_pause = await has_perm("queue.pause_agent")
        self.can_limit = await has_perm(LIMIT_PERMISSION)
        self.can_resume = await has_perm(fragments.RESUME_PERMISSION)
        self.schedules_variant = await database_sync_to_async(schedules.user_variant)(self.user)

    def _user_now(self) -> Any:
        """The session's user as it is now: the session is read afresh from the
        session store (the scope's copy is cached), so a logout or a password change
        (which invalidates the session hash) shows."""
        session_key = self.scope["session"].session_key
        store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
        return auth.get_user(SimpleNamespace(session=store))


def _may_watch(user: Any) -> bool:
    return user is not None and user.is_authenticated and user.is_active and user.is_staff

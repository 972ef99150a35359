"""The dashboard's WebSocket: one consumer, one group per kind of page.

Only a logged-in staff user gets a socket (others are refused at the handshake,
which the browser sees as a failed connection); ``asgi.py`` checks the Origin
header before this runs. What arrives is HTML that the htmx ws extension swaps in
by element id.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.utils.html import format_html_join

from . import fragments
from .live import hub, task_group, workflow_group


class LiveConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_staff:
            await self.close()  # before accept(): the handshake is answered 403
            return
        page = self.scope["url_route"]["kwargs"]["page"]
        groups = {"task": task_group, "workflow": workflow_group}
        object_id = self.scope["url_route"]["kwargs"].get("object_id")
        self.group = groups[page](str(object_id)) if page in groups else page
        self.task_id = object_id if page == "task" else None
        self.can_pause = await database_sync_to_async(user.has_perm)("queue.pause_agent")
        await self.channel_layer.group_add(self.group, self.channel_name)
        hub.join(self.group)
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
        await self.send(text_data=event["with_pause" if self.can_pause else "without_pause"])

    async def html_push(self, event: dict[str, Any]) -> None:
        await self.send(text_data=event["html"])

    async def rows_left(self, event: dict[str, Any]) -> None:
        rows = format_html_join(
            "", '<tr id="dl-{}" hx-swap-oob="delete"></tr>', ((i,) for i in event["ids"])
        )
        await self.send(text_data=rows)  # htmx parses table rows at the top level

    async def task_changed(self, event: dict[str, Any]) -> None:
        html = await database_sync_to_async(self._render_task)()
        if html:
            await self.send(text_data=html)

    def _render_task(self) -> str | None:
        task = fragments.load_task(self.task_id)
        return fragments.render_task(task, self.scope["user"]) if task else None

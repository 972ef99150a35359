"""``ws://HOST/api/v1/stream``: the event stream, live, for API clients.

The client sends ``Authorization: Bearer TOKEN`` (any scope: each includes
``read``); without a valid token the handshake is refused (HTTP 403) and nothing is
sent. A token bound to agents gets message and publication events only of its
agents. Each message is one envelope exactly as ``export_events`` writes a line
(``Envelope.json_text``, with its ``position``), in position order, filtered by the
query parameters (``stream_filter``). With ``?after=POSITION`` the client first gets
the events after that position from the database, then the live ones, each once: a
client that reconnects with the last position it saw misses nothing and sees
nothing twice. Without it, the stream starts with the events committed after the
client joined.

Bad parameters: the socket is accepted, sent one ``{"error": …, "field": …}``
message, and closed with ``BAD_FILTER`` (daphne drops close reasons). The hub
(``stream_hub``) closes a socket whose token is revoked (``REVOKED``) or that fell
too far behind (``FELL_BEHIND``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import replace

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from task_queue import event_stream

from .auth import token_of_header
from .models import Scope
from .stream_filter import InvalidFilter, StreamFilter
from .stream_hub import BATCH, Subscriber, hub, workflows_needed

BAD_FILTER = 4400


class StreamConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        headers = dict(self.scope.get("headers", ()))
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        token = await database_sync_to_async(token_of_header)(authorization, Scope.READ)
        if token is None:
            await self.close()  # before accept(): the handshake is answered 403
            return
        try:
            stream_filter = StreamFilter.from_query(self.scope.get("query_string", b""))
        except InvalidFilter as error:
            await self.accept()
            message = {"error": "invalid_filter", "field": error.field, "message": error.message}
            await self.send(text_data=json.dumps(message))
            await self.close(code=BAD_FILTER)
            return
        stream_filter = replace(stream_filter, token_agents=frozenset(token.agents))
        self.subscriber = Subscriber(stream_filter, token.pk)
        await hub.join(self.subscriber)
        await self.accept()
        self.sender = asyncio.ensure_future(self._send_events())

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "subscriber"):
            hub.leave(self.subscriber)
            self.sender.cancel()
            # Cancelled, or failed on sending to a client already gone.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.sender

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Clients only listen; anything they send is ignored."""

    async def _send_events(self) -> None:
        subscriber = self.subscriber
        after = subscriber.filter.after
        if after is None:
            after = subscriber.start
        else:
            after = await self._catch_up(after)
        closing = subscriber.closing
        while True:
            waiting = asyncio.ensure_future(subscriber.queue.get())
            try:
                await asyncio.wait([waiting, closing], return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not waiting.done():
                    waiting.cancel()
            if closing.done():
                await self.close(code=closing.result())
                return
            event = waiting.result()
            if event.position > after:  # those up to ``after`` were read in catching up
                await self.send(text_data=event.json_text)
                after = event.position

    async def _catch_up(self, after: int) -> int:
        """Send the events after ``after`` from the database, up to the newest (which
        is at least the hub's position when this client joined); the last position
        read."""
        read = database_sync_to_async(event_stream.next_batch)
        while not self.subscriber.closing.done():
            events = await read(after, limit=BATCH)
            if not events:
                break
            workflows = await workflows_needed([self.subscriber], events)
            for event in events:
                if self.subscriber.filter.matches(event, workflows):
                    await self.send(text_data=event.json_text)
            after = events[-1].position
            if len(events) < BATCH:
                break
        return after

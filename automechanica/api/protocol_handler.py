"""The worker protocol's requests go through Django in one thread, not six hand-offs.

Django's ASGI handler runs a synchronous view and its middleware in an ``asgiref``
hop dance: a thread made for each request (``ThreadSensitiveContext``), and between
the event loop and that thread a hand-off for the ``request_started`` signal, the
middleware chain, each ``process_view``, the view itself and ``request_finished``.
Each hand-off waits for the event loop, which is serving every other request, so a
remote agent's claim or batch of outcomes waited about 38 ms in daphne for a few
milliseconds of work (``queue_bench --remote``, docs/performance.md).

:func:`serve_worker_protocol` sends the protocol's routes (``PROTOCOL_PATHS``) to
:class:`ProtocolHandler` instead: Django's synchronous handler (the one WSGI uses:
the same middleware, URL resolution, django-ninja views, authentication and
signals) run in one call on a fixed pool of threads, one per pooled database
connection, so that a burst of requests waits in the pool's queue and not for a
connection. Their answers are never streamed, which is what makes one call enough.
Every other request goes to Django's ASGI handler as before.
"""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, ASGIRequest, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.http import HttpResponseBase
from django.urls import set_script_prefix

from .long_poll import App, Scope

PROTOCOL_PATHS = re.compile(
    r"/api/v1/(agents/[^/]+/claim|outcomes|tasks/[^/]+/(claim|heartbeat|complete|fail))/?"
)
# Threads when the web server has no pool (WEB_DB_POOL_MAX_SIZE 0).
UNPOOLED_THREADS = 10


class ProtocolHandler(BaseHandler):
    """Django's synchronous request handling behind an ASGI callable (reading the
    body and sending the answer as Django's ASGI handler does)."""

    request_class = ASGIRequest
    chunk_size = ASGIHandler.chunk_size
    chunk_bytes = ASGIHandler.chunk_bytes
    read_body = ASGIHandler.read_body
    create_request = ASGIHandler.create_request
    send_response = ASGIHandler.send_response

    def __init__(self, threads: int) -> None:
        super().__init__()
        self.load_middleware(is_async=False)
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="worker-protocol")

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        loop = asyncio.get_running_loop()
        response = await loop.run_in_executor(self._threads, self._respond, scope, body_file)
        await self.send_response(response, send)

    def _respond(self, scope: Scope, body_file: IO[bytes]) -> HttpResponseBase:
        try:
            set_script_prefix(get_script_prefix(scope))
            signals.request_started.send(sender=self.__class__, scope=scope)
            request, refused = self.create_request(scope, body_file)
            response = refused or self.get_response(request)
            response.close()  # request_finished: the connection goes back to the pool
            return response
        finally:
            body_file.close()


def serve_worker_protocol(app: App) -> App:
    """``app``, with the worker protocol's ``POST`` routes served by a
    :class:`ProtocolHandler` (made at the first such request, once Django is set up)."""
    handler: ProtocolHandler | None = None

    async def application(scope: Scope, receive: Any, send: Any) -> None:
        nonlocal handler
        if (
            scope["type"] != "http"
            or scope.get("method") != "POST"
            or not PROTOCOL_PATHS.fullmatch(scope.get("path", ""))
        ):
            return await app(scope, receive, send)
        if handler is None:
            handler = ProtocolHandler(settings.WEB_DB_POOL_MAX_SIZE or UNPOOLED_THREADS)
        await handler(scope, receive, send)

    return application

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
connection. A burst of requests waits in the event loop for a free thread, as long as
a request would wait for a pooled connection (``WEB_DB_POOL_TIMEOUT_SECONDS``), and is
then answered 503 ``server_busy`` (the agent client retries it). Their answers are
never streamed, which is what makes one call enough. Every other request goes to
Django's ASGI handler as before.
"""

from __future__ import annotations

import asyncio
import logging
import re
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Any

from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, ASGIRequest, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.http import HttpResponseBase, JsonResponse
from django.urls import set_script_prefix

from .errors import body
from .long_poll import App, Scope

logger = logging.getLogger(__name__)

PROTOCOL_PATHS = re.compile(
    r"/api/v1/(agents/[^/]+/claim|outcomes|tasks/[^/]+/(claim|heartbeat|complete|fail))/?"
)
# Threads, and the wait for one, when the web server has no pool (WEB_DB_POOL_MAX_SIZE 0).
UNPOOLED_THREADS = 10
UNPOOLED_WAIT_SECONDS = 30.0


class ProtocolHandler(BaseHandler):
    """Django's synchronous request handling behind an ASGI callable (reading the
    body and sending the answer as Django's ASGI handler does)."""

    request_class = ASGIRequest
    chunk_size = ASGIHandler.chunk_size
    chunk_bytes = ASGIHandler.chunk_bytes
    read_body = ASGIHandler.read_body
    create_request = ASGIHandler.create_request
    send_response = ASGIHandler.send_response

    def __init__(self, threads: int, wait_seconds: float) -> None:
        super().__init__()
        self.load_middleware(is_async=False)
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="worker-protocol")
        # A request holds a slot from before it is handed to a thread until that thread
        # is done with it, so none waits in the executor's queue, where no time limit
        # would apply and its body would stay in memory.
        self._slots = asyncio.Semaphore(threads)
        self._wait_seconds = wait_seconds

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            await asyncio.wait_for(self._slots.acquire(), self._wait_seconds)
        except TimeoutError:
            body_file.close()
            await self.send_response(self._busy(), send)
            return
        except asyncio.CancelledError:
            body_file.close()
            raise
        loop = asyncio.get_running_loop()
        running = self._threads.submit(self._respond, scope, body_file)

        def done(future: Future) -> None:  # also when the request was cancelled meanwhile
            loop.call_soon_threadsafe(self._slots.release)
            if future.cancelled():
                body_file.close()

        running.add_done_callback(done)
        response = await asyncio.wrap_future(running)
        await self.send_response(response, send)

    def _respond(self, scope: Scope, body_file: IO[bytes]) -> HttpResponseBase:
        try:
            set_script_prefix(get_script_prefix(scope))
            signals.request_started.send(sender=self.__class__, scope=scope)
            request, refused = self.create_request(scope, body_file)
            response = refused or self.get_response(request)
            if response.streaming:
                raise RuntimeError(f"{scope['path']}: a worker protocol view streamed")
            response._handler_class = self.__class__
        except BaseException:
            # request_finished, as the response's close() would send it: this thread's
            # connection goes back to the pool.
            signals.request_finished.send(sender=self.__class__)
            raise
        finally:
            body_file.close()
        try:
            response.close()  # request_finished: the connection goes back to the pool
        except Exception:  # the view's work is done (committed): answer it all the same
            logger.exception("%s: finishing the request failed", scope["path"])
        return response

    def _busy(self) -> HttpResponseBase:
        message = (
            f"every worker protocol thread of this server was busy for {self._wait_seconds:g} s "
            "(WEB_DB_POOL_MAX_SIZE, WEB_DB_POOL_TIMEOUT_SECONDS); try again"
        )
        return JsonResponse(
            body("server_busy", message, details={"waited_seconds": self._wait_seconds}),
            status=503,
        )


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
            pool = settings.WEB_DATABASE_POOL
            handler = ProtocolHandler(
                pool["max_size"] if pool else UNPOOLED_THREADS,
                pool["timeout"] if pool else UNPOOLED_WAIT_SECONDS,
            )
        await handler(scope, receive, send)

    return application

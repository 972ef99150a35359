"""Request bodies over ``API_MAX_REQUEST_BYTES`` are refused as they arrive, unread.

Why not an ASGI middleware: daphne (Twisted) reads a request's whole body, into
memory or a temporary file, before it calls the ASGI application at all, so a
middleware would first see a 10 GB body once daphne had stored all of it; a
``Content-Length`` of 10 GB with three bytes sent would hold a connection until the
client gave up, and the application would never be called. The limit is kept in
daphne's request instead, where Twisted hands over the headers (``gotLength``) and
then each piece of the body (``handleContentChunk``, chunked bodies decoded):

- a ``Content-Length`` over the limit is answered 413 as soon as the headers are in,
  without waiting for the body (and without the ``100 Continue`` a client asked for);
- a body without one (``Transfer-Encoding: chunked``) is counted as it comes and
  answered 413 once past the limit; nothing read is kept.

The answer is the API's error body (``request_too_large``) with ``Connection:
close``. The connection then closes the way HTTP servers close on a client still
sending (nginx's "lingering close"): the response is sent and the write side shut,
what else arrives is dropped, and the connection is dropped once the client closes
or after :data:`LINGER_SECONDS`; closing at once with unread data would make the
kernel reset the connection, and the client could lose the 413. The application is
never called for a refused request, and the server goes on serving the others.

:func:`install` makes daphne build these requests; ``automechanica.asgi`` calls it,
so every way of running the web server (``daphne automechanica.asgi:application``,
``manage.py up``, ``runserver``) has the limit. Behind any other server, Django's
``DATA_UPLOAD_MAX_MEMORY_SIZE`` (the same setting) still refuses the body, once read.
"""

from __future__ import annotations

import json
import logging

from daphne import http_protocol
from django.conf import settings
from twisted.internet import reactor

from automechanica.api.errors import body

logger = logging.getLogger(__name__)

# How long a refused connection may go on sending before it is dropped.
LINGER_SECONDS = 5.0


def refusal(limit: int) -> bytes:
    """The whole HTTP answer to a body over ``limit`` bytes."""
    content = json.dumps(
        body(
            "request_too_large",
            f"the request body is over the limit of {limit} bytes (API_MAX_REQUEST_BYTES)",
            [("body", f"is over {limit} bytes")],
            {"limit_bytes": limit},
        )
    ).encode()
    head = (
        "HTTP/1.1 413 Content Too Large\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(content)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + content


class BodyLimitedRequest(http_protocol.WebRequest):
    """daphne's request, refusing a body over ``API_MAX_REQUEST_BYTES`` as it arrives."""

    _refused = False
    _received = 0

    def gotLength(self, length: int | None) -> None:
        limit = settings.API_MAX_REQUEST_BYTES
        if length is not None and length > limit:
            # No "100 Continue" for a body that will not be read.
            self.requestHeaders.removeHeader(b"Expect")
            super().gotLength(0)
            self._refuse(limit, f"Content-Length {length}")
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if self._refused:
            return
        self._received += len(data)
        limit = settings.API_MAX_REQUEST_BYTES
        if self._received > limit:
            self._refuse(limit, f"over {self._received} bytes received")
            return
        super().handleContentChunk(data)

    def process(self) -> None:
        # A refused chunked body can still end within the data Twisted is parsing.
        if not self._refused:
            super().process()

    def _refuse(self, limit: int, what: str) -> None:
        self._refused = True
        channel = self.channel
        logger.warning(
            "refused a request body over %d bytes (%s) from %s",
            limit,
            what,
            channel.transport.getPeer(),
        )
        # Whatever else the client sends is dropped, unparsed.
        channel.dataReceived = lambda data: None
        channel.transport.write(refusal(limit))
        channel.transport.loseWriteConnection()
        reactor.callLater(LINGER_SECONDS, channel.transport.abortConnection)


def install() -> None:
    """Make daphne build :class:`BodyLimitedRequest` for every HTTP request.

    daphne's ``HTTPFactory.buildProtocol`` sets each connection's request class from
    the module's ``WebRequest`` when the connection opens, and daphne imports the
    application (this project's ``asgi`` module, which calls this) before it listens.
    """
    http_protocol.WebRequest = BodyLimitedRequest

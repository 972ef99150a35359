"""Bodies over API_MAX_REQUEST_BYTES are refused by a real daphne as they arrive."""

from __future__ import annotations

import json
import select
import socket
import time
from urllib.parse import urlsplit

import pytest

from task_queue.models import Task
from tests.support.api import token
from tests.support.server import LiveServer, http

pytestmark = pytest.mark.slow

LIMIT = 4096
# A refused request is answered long before this; a server reading the body first
# never answers at all.
ANSWER_TIMEOUT = 10


def connect(server: LiveServer) -> socket.socket:
    address = urlsplit(server.url)
    sock = socket.create_connection((address.hostname, address.port), timeout=ANSWER_TIMEOUT)
    return sock


def head(secret: str, *lines: str) -> bytes:
    return (
        "\r\n".join(
            [
                "POST /api/v1/tasks HTTP/1.1",
                "Host: 127.0.0.1",
                "Content-Type: application/json",
                f"Authorization: Bearer {secret}",
                *lines,
            ]
        )
        + "\r\n\r\n"
    ).encode()


def read_answer(sock: socket.socket) -> tuple[int, dict]:
    """The whole answer (the server closes after it): its status and JSON body."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    _, _, content = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), json.loads(content)


def test_oversized_bodies_are_refused_unread_and_the_server_goes_on(live_servers):
    server = live_servers(API_MAX_REQUEST_BYTES=str(LIMIT))
    secret = token("write")

    # Content-Length of 10 GB, three bytes sent: answered at once, without the
    # "100 Continue" asked for, and without waiting for the rest.
    with connect(server) as sock:
        started = time.monotonic()
        sock.sendall(head(secret, "Content-Length: 10000000000", "Expect: 100-continue") + b"{}")
        status, answer = read_answer(sock)
        assert time.monotonic() - started < ANSWER_TIMEOUT
    assert status == 413, answer
    assert answer["code"] == "request_too_large"
    assert answer["field_errors"] == [{"field": "body", "message": f"is over {LIMIT} bytes"}]
    assert answer["details"] == {"limit_bytes": LIMIT}

    # A chunked body: answered once past the limit, before the client ends it.
    with connect(server) as sock:
        sock.sendall(head(secret, "Transfer-Encoding: chunked"))
        sent = 0
        piece = b"x" * 512
        # A piece at a time, until the answer is there to read.
        while not select.select([sock], [], [], 0.001)[0]:
            assert sent < 100 * LIMIT, "no answer while the body went on"
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            sent += len(piece)
        status, answer = read_answer(sock)
    assert status == 413, answer
    assert answer["code"] == "request_too_large"

    # Neither reached the application; the same process serves what fits.
    assert Task.objects.count() == 0
    body = {"agent_name": "EchoAgent", "task_type": "echo", "payload": {"n": 1}}
    status, created = http("POST", server.url + "/api/v1/tasks", secret, body)
    assert status == 201, created
    assert server.process.poll() is None
    status, answer = http(
        "POST", server.url + "/api/v1/tasks", secret, body | {"payload": {"s": "x" * LIMIT}}
    )
    assert (status, answer["code"]) == (413, "request_too_large")

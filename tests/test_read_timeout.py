"""Reads of API GET routes and dashboard pages past READ_STATEMENT_TIMEOUT_SECONDS are
a clear 503 from a real daphne, which goes on serving."""

from __future__ import annotations

import urllib.error
import urllib.request

import psycopg
import pytest

from tests.support.api import token
from tests.support.database import database_url
from tests.support.server import http
from tests.support.users import staff

pytestmark = pytest.mark.slow


def page(url: str, session: str) -> tuple[int, str, str]:
    """(status, content type, text) of a dashboard page for this session."""
    request = urllib.request.Request(url, headers={"Cookie": f"sessionid={session}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


def test_a_read_past_the_statement_timeout_is_a_503_and_the_server_goes_on(live_servers):
    server = live_servers(READ_STATEMENT_TIMEOUT_SECONDS="0.5")
    secret = token("read")
    session = staff().cookies["sessionid"].value

    # Another session holds the tasks table and the dead letter's own: every read of
    # them waits, past the limit (statement_timeout counts time spent waiting for a lock).
    with psycopg.connect(database_url()) as holder:
        holder.execute("LOCK TABLE tasks, dead_letter_payloads IN ACCESS EXCLUSIVE MODE")

        status, answer = http("GET", server.url + "/api/v1/tasks?q=SKU", secret)
        assert status == 503, answer
        assert answer["code"] == "read_timeout"
        assert answer["details"] == {"timeout_seconds": 0.5}
        assert answer["field_errors"] == []

        status, content_type, text = page(server.url + "/dead-letter/", session)
        assert status == 503, text
        assert content_type.startswith("text/plain")
        assert "READ_STATEMENT_TIMEOUT_SECONDS" in text
        holder.rollback()

    status, answer = http("GET", server.url + "/api/v1/tasks?q=SKU", secret)
    assert (status, answer["items"]) == (200, [])
    status, _, text = page(server.url + "/dead-letter/", session)
    assert status == 200, text
    assert server.process.poll() is None

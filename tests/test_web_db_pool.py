"""The web server's database connections come from a pool (automechanica.web_db_pool):
a request's connection stays open and serves the next requests; without the pool
(WEB_DB_POOL_MAX_SIZE=0) each request's connection is closed at its end. A pooled
connection the database dropped is replaced as a request takes it."""

from __future__ import annotations

import pytest
from django.db import connection

from tests.support.api import token
from tests.support.server import http
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

# Every other client of the test database: the server's connections (this test
# starts no other process).
OTHER_BACKENDS = """
SELECT pid, backend_start FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND backend_type = 'client backend'
"""
TERMINATE = "SELECT pg_terminate_backend(pid) FROM unnest(%(pids)s::int[]) AS pid"


def other_backends() -> set[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(OTHER_BACKENDS)
        return set(cursor.fetchall())


def requests(server, secret: str, count: int) -> None:
    for _ in range(count):
        status, _ = http("GET", server.url + "/api/v1/agents", secret)
        assert status == 200


def test_requests_share_pooled_connections(live_servers):
    server = live_servers()
    secret = token("read")
    requests(server, secret, 3)
    pooled = other_backends()
    assert 1 <= len(pooled) <= 10, pooled  # the pool's size (WEB_DB_POOL_MAX_SIZE)
    requests(server, secret, 20)
    # The same connections served these requests: none opened since, none closed.
    assert other_backends() == pooled


def test_a_pooled_connection_the_database_dropped_is_replaced(live_servers):
    server = live_servers()
    secret = token("read")
    requests(server, secret, 3)
    pooled = other_backends()
    with connection.cursor() as cursor:
        cursor.execute(TERMINATE, {"pids": [pid for pid, _ in pooled]})
    wait_for(lambda: not other_backends() & pooled, timeout=30, what="the backends to end")
    requests(server, secret, 3)  # each answered 200 on a new connection


def test_without_the_pool_each_request_closes_its_connection(live_servers):
    server = live_servers(WEB_DB_POOL_MAX_SIZE="0")
    requests(server, token("read"), 3)
    wait_for(lambda: not other_backends(), timeout=30, what="request connections to close")

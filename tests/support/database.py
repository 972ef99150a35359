"""The test database, as other processes reach it, and small queries on it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

from django.db import connection


def database_url() -> str:
    """A DATABASE_URL for the test database, for processes the tests start."""
    settings = connection.settings_dict
    name = settings["NAME"]
    if settings["ENGINE"] == "automechanica.embedded_postgres":
        from automechanica.embedded_postgres import server

        return server.connection_url(name)
    user = quote(settings["USER"] or "", safe="")
    password = f":{quote(settings['PASSWORD'], safe='')}" if settings["PASSWORD"] else ""
    host = quote(settings["HOST"] or "", safe="")
    port = f":{settings['PORT']}" if settings["PORT"] else ""
    return f"postgresql://{user}{password}@{host}{port}/{name}"


def count_rows(sql: str, params: list | None = None) -> int:
    """The single number a ``SELECT count(*) …`` returns."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchone()[0]


def registered_listeners(channel: str) -> int:
    """Connections registered as listening on ``channel`` (``channel_listeners``)."""
    return count_rows("SELECT count(*) FROM channel_listeners WHERE channel = %s", [channel])


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of an ``EXPLAIN (FORMAT JSON)`` plan, from ``node`` down."""
    yield node
    for child in node.get("Plans", ()):
        yield from plan_nodes(child)

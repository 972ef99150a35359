"""The web server takes its database connections from a pool (Django's, psycopg_pool).

Django's ASGI handler runs each request's synchronous code on a thread of its own
(one asgiref ``ThreadSensitiveContext`` per request) and Django's connections are
per thread: with ``CONN_MAX_AGE`` 0 every request opened a PostgreSQL connection and
closed it at its end, and a positive ``CONN_MAX_AGE`` would leave one open on each
finished request's thread, never used again (Django's documentation: under ASGI,
disable persistent connections and use a pool). From a pool, the connection a
request closes goes back for the next one; the live stream's and the dashboard's
reads (``database_sync_to_async``) borrow theirs the same way.

Only the web server pools: a worker's threads keep their connections for their whole
life, and a command connects once. ``WEB_DATABASE_POOL`` sizes the pool (each daphne
process has its own; keep their sum under the server's ``max_connections``).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings


def install() -> bool:
    """Give every database without a pool of its own the ``WEB_DATABASE_POOL`` pool,
    before Django connects anywhere; returns whether it did.

    Only when this process has not loaded the settings yet (``automechanica.asgi`` as
    daphne's application): a process that had (the test suite, ``runserver``) may hold
    a connection opened without the pool already, which the pool could not take back.
    """
    if settings.configured:
        return False
    pool = settings.WEB_DATABASE_POOL
    if not pool:
        return False
    for database in settings.DATABASES.values():
        options: dict[str, Any] = database.setdefault("OPTIONS", {})
        # A pool's connections are given back, never kept: Django refuses both.
        if not database.get("CONN_MAX_AGE") and "pool" not in options:
            options["pool"] = dict(pool)
            # The pool checks a connection as a request takes it (an empty query):
            # one the database dropped (a restart) is replaced, not used and failed.
            database["CONN_HEALTH_CHECKS"] = True
    return True

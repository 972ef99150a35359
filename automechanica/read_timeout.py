"""The reads of API ``GET`` routes and dashboard pages have a time limit.

Each such view runs in a transaction whose statements PostgreSQL cancels after
``READ_STATEMENT_TIMEOUT_SECONDS`` (``SET LOCAL statement_timeout``); a cancelled
read is answered 503 (the API's error body with ``code`` ``read_timeout``; plain text
for a page) instead of a 500, and the connection is as good as before. Writes, the
workers, maintenance and every other process are not bounded: only these views run
through here. 0 turns the limit off.

It is a ``MiddlewareMixin``, which runs in either mode: a middleware that ran only
synchronously, last in ``MIDDLEWARE``, made Django run the whole chain in a thread
that called back into the event loop for the view. A SIGTERM arriving while such a
thread was between the two could leave it waiting on the stopped loop for ever, and
daphne never exited (its exit waits for the thread). Run asynchronously, no request
thread waits on the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import OperationalError, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin
from psycopg.errors import QueryCanceled

from automechanica.api.errors import body
from task_queue.sql.db import limit_statement_time

# The URL apps whose GET views are bounded: the API (django-ninja names its URLs'
# app "ninja") and the dashboard.
API_APP = "ninja"
BOUNDED_APPS = frozenset({API_APP, "dashboard"})
READ_METHODS = frozenset({"GET", "HEAD"})


class ReadTimeoutMiddleware(MiddlewareMixin):
    """Runs bounded views itself (``process_view``), so it is last in ``MIDDLEWARE``."""

    def process_view(
        self,
        request: HttpRequest,
        view: Callable[..., HttpResponse],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> HttpResponse | None:
        seconds = settings.READ_STATEMENT_TIMEOUT_SECONDS
        apps = set(request.resolver_match.app_names)
        if not seconds or request.method not in READ_METHODS or not BOUNDED_APPS & apps:
            return None
        try:
            with transaction.atomic():
                limit_statement_time(seconds)
                return view(request, *args, **kwargs)
        except OperationalError as error:
            if not isinstance(error.__cause__, QueryCanceled):
                raise
            return too_slow(seconds, api=API_APP in apps)


def too_slow(seconds: float, *, api: bool) -> HttpResponse:
    message = (
        f"the database did not answer this read within {seconds:g} s "
        "(READ_STATEMENT_TIMEOUT_SECONDS); narrow the filters or try again"
    )
    if api:
        return JsonResponse(
            body("read_timeout", message, details={"timeout_seconds": seconds}), status=503
        )
    return HttpResponse(
        f"Service unavailable: {message}.\n", status=503, content_type="text/plain; charset=utf-8"
    )

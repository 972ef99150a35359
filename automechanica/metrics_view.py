"""``GET /metrics``: the queue's Prometheus exposition (``task_queue.prometheus``)
behind its access rule.

Who may scrape: a client from ``METRICS_ALLOWED_NETWORKS`` (none by default), or one
sending an API token (``Authorization: Bearer``, any scope), or a staff session.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from functools import wraps

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST

from automechanica.api.auth import token_or_staff
from task_queue.networks import parse_networks
from task_queue.prometheus import exposition


def _scrapers_only(view: Callable[[HttpRequest], HttpResponse]) -> Callable[..., HttpResponse]:
    """An allowed network, or else a token or staff session (``token_or_staff``).

    The network is the one of ``REMOTE_ADDR``, the peer of this server: behind a
    reverse proxy that is the proxy, so allow only networks whose every client may
    scrape, never the proxy's own address.
    """
    guarded = token_or_staff(view)

    @wraps(view)
    def check(request: HttpRequest) -> HttpResponse:
        if _from_allowed_network(request.META.get("REMOTE_ADDR", "")):
            return view(request)
        return guarded(request)

    return check


def _from_allowed_network(address: str) -> bool:
    try:
        client = ipaddress.ip_address(address)
    except ValueError:  # not an IP address (a unix socket): not an allowed network
        return False
    return any(client in network for network in parse_networks(settings.METRICS_ALLOWED_NETWORKS))


@require_safe
@_scrapers_only
def metrics_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)

"""Where a webhook may be sent: to public addresses, and to the networks
``ALERT_WEBHOOK_ALLOWED_NETWORKS`` names.

Whoever may write an alert rule chooses its URLs, and the maintenance process that
sends them runs inside the deployment's network. Unguarded, a rule could make it post
to the database's port, a cloud metadata service (169.254.169.254) or any internal
service, and read each answer's status in the attempt log (server-side request
forgery). So a URL naming an address that is not public (loopback, private,
link-local, shared, reserved, multicast) is refused when the rule is written; and as
a notification is sent, the host is resolved once and every address it resolves to is
checked, and the connection goes to an address that passed (a DNS answer that
changes between the check and the connection cannot move it). Through a proxy
(``HTTPS_PROXY``), the check is of the proxy's address: allow its network, and let
the proxy filter where it goes.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import urllib.request
from typing import Any

from django.conf import settings

from task_queue.networks import parse_networks

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class RefusedAddress(OSError):
    """Every address of a webhook's host is outside where webhooks may go."""


def refusal(address: Address) -> str | None:
    """Why a webhook may not go to ``address``, or None if it may."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    if any(address in net for net in parse_networks(settings.ALERT_WEBHOOK_ALLOWED_NETWORKS)):
        return None
    if address.is_global and not address.is_multicast:
        return None
    return f"{address} is not a public address (ALERT_WEBHOOK_ALLOWED_NETWORKS may allow it)"


def literal_refusal(host: str) -> str | None:
    """Why a webhook may not go to ``host`` if it is an IP address; None for a name
    (checked once resolved, as it is sent) or an allowed address."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    return refusal(address)


def connect(
    host_and_port: tuple[str, int], timeout: Any = None, source_address: Any = None
) -> socket.socket:
    """``socket.create_connection``, to the addresses of the host that may be sent to
    only: :class:`RefusedAddress` if none may."""
    host, port = host_and_port
    refused, error = [], None
    for family, kind, protocol, _, address in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        if why := refusal(ipaddress.ip_address(address[0])):
            refused.append(why)
            continue
        sock = socket.socket(family, kind, protocol)
        try:
            if isinstance(timeout, int | float):
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(address)
            return sock
        except OSError as failed:
            sock.close()
            error = failed
    if error is not None:
        raise error
    raise RefusedAddress(f"{host}: {'; '.join(dict.fromkeys(refused))}")


class _GuardedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = connect


class _GuardedHTTPSConnection(http.client.HTTPSConnection):
    # The TLS handshake still names and verifies the host (server_hostname).
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = connect


class HTTPHandler(urllib.request.HTTPHandler):
    """urllib's, connecting through :func:`connect`."""

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_GuardedHTTPConnection, req)


class HTTPSHandler(urllib.request.HTTPSHandler):
    """urllib's, connecting through :func:`connect`."""

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(
            _GuardedHTTPSConnection,
            req,
            context=self._context,  # type: ignore[attr-defined]
        )

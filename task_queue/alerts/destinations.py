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
(``HTTPS_PROXY``), the proxy's address must be allowed like any other, and the target
may resolve to no address that is not (the proxy resolves it again).
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from task_queue.networks import parse_networks

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class RefusedAddress(OSError):
    """Every address of a webhook's host is outside where webhooks may go."""


# IPv6 addresses that carry an IPv4 one, checked as that one (their low 32 bits): NAT64
# (a gateway with DNS64 reaches 10.0.0.5 at 64:ff9b::a00:5) and IPv4-compatible.
_CARRY_IPV4 = [ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("::/96")]
# Refused whatever they carry: local-use NAT64, IPv4-translated, site-local, Teredo.
_NEVER = [ipaddress.ip_network(n) for n in ("64:ff9b:1::/48", "::ffff:0:0:0/96", "fec0::/10",
                                            "2001::/32")]  # fmt: skip


_NOT_PUBLIC = "{} is not a public address (ALERT_WEBHOOK_ALLOWED_NETWORKS may allow it)"


def refusal(address: Address) -> str | None:
    """Why a webhook may not go to ``address``, or None if it may."""
    if any(address in net for net in parse_networks(settings.ALERT_WEBHOOK_ALLOWED_NETWORKS)):
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if any(address in net for net in _NEVER):
            return _NOT_PUBLIC.format(address)
        carried = address.ipv4_mapped or address.sixtofour
        special = address.is_loopback or address.is_unspecified  # ::1 and :: carry none
        if carried is None and not special and any(address in net for net in _CARRY_IPV4):
            carried = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if carried is not None:
            return refusal(carried)
    if address.is_global and not address.is_multicast:
        return None
    return _NOT_PUBLIC.format(address)


def literal_refusal(host: str) -> str | None:
    """Why a webhook may not go to ``host`` if it is an IP address, in any form the
    resolver takes (``2130706433``, ``0x7f.1`` and ``127.1`` are 127.0.0.1); None for a
    name (checked once resolved, as it is sent) or an allowed address."""
    try:
        address: Address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        try:
            address = ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return refusal(address)


def check_resolved(host: str, port: int, *, every: bool = False) -> list[tuple[Any, ...]]:
    """The addresses of ``host`` a webhook may go to (``getaddrinfo``'s entries), or
    :class:`RefusedAddress` if there are none (``every``: if any may not). The reason
    names no address: an attempt's error is shown to whoever writes rules, and must not
    map the internal network's names for them."""
    found = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    allowed = [entry for entry in found if refusal(ipaddress.ip_address(entry[4][0])) is None]
    if not allowed or (every and len(allowed) < len(found)):
        raise RefusedAddress(f"{host} resolves to an address webhooks may not go to "
                             "(public ones may, and ALERT_WEBHOOK_ALLOWED_NETWORKS)")  # fmt: skip
    return allowed


def _check_proxied_target(request: urllib.request.Request) -> None:
    """Through a proxy, the connection is checked as the proxy's; the target is checked
    here, every address it resolves to (the proxy resolves it again, and may pick any)."""
    if not request.has_proxy():
        return
    target = urlsplit(request.full_url)
    host = target.hostname or ""
    if why := literal_refusal(host):
        raise RefusedAddress(why)
    check_resolved(host, target.port or (443 if target.scheme == "https" else 80), every=True)


def connect(
    host_and_port: tuple[str, int], timeout: Any = None, source_address: Any = None
) -> socket.socket:
    """``socket.create_connection``, to the addresses of the host that may be sent to
    only (:func:`check_resolved`)."""
    host, port = host_and_port
    error: OSError | None = None
    for family, kind, protocol, _, address in check_resolved(host, port):
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
    assert error is not None  # check_resolved gave at least one address
    raise error


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
        _check_proxied_target(req)
        return self.do_open(_GuardedHTTPConnection, req)


class HTTPSHandler(urllib.request.HTTPSHandler):
    """urllib's, connecting through :func:`connect`."""

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        _check_proxied_target(req)
        return self.do_open(
            _GuardedHTTPSConnection,
            req,
            context=self._context,  # type: ignore[attr-defined]
        )

"""Settings that list networks (``METRICS_ALLOWED_NETWORKS``,
``ALERT_WEBHOOK_ALLOWED_NETWORKS``): comma-separated CIDRs."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(entries: Iterable[str]) -> list[Network]:
    """The networks of a setting's entries. A bad entry allows nothing here; it is a
    configuration error that the system checks (automechanica.checks) report."""
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            continue
    return networks

"""Settings that list networks (``METRICS_ALLOWED_NETWORKS``,
``ALERT_WEBHOOK_ALLOWED_NETWORKS``): comma-separated CIDRs."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(entries: Iterable[str]) -> list[Network]:
    """The networks of a setting's entries. A bad entry allows nothing here; it is a
    configuration error that the system checks (automechanica.checks) report."""
    return [network for _, network, _ in _read(entries) if network is not None]


def network_problems(entries: Iterable[str]) -> list[tuple[str, str]]:
    """(entry, why it is not a network) for each bad entry."""
    return [(entry, problem) for entry, network, problem in _read(entries) if network is None]


def _read(entries: Iterable[str]) -> Iterator[tuple[str, Network | None, str]]:
    for entry in entries:
        try:
            yield entry, ipaddress.ip_network(entry, strict=False), ""
        except ValueError as problem:
            yield entry, None, str(problem)

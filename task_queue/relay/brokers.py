"""Which module speaks to a broker URL's scheme, for relay_events and runworker."""

from __future__ import annotations

import importlib
from types import ModuleType
from urllib.parse import urlsplit

from task_queue.relay.names import destination_key

# scheme → (the module of its bridge and dispatch source, the extra that installs its
# client)
BROKERS = {
    "nats": ("task_queue.relay.jetstream", "nats"),
    "amqp": ("task_queue.relay.rabbitmq", "amqp"),
}


class BrokerURLError(ValueError):
    """A URL no broker module speaks, or whose module's client is not installed."""


def broker_module(url: str, option: str) -> ModuleType:
    """The module for ``url``; the error names ``option`` and what to do."""
    scheme = urlsplit(url).scheme
    if scheme not in BROKERS:  # named without its credentials, which it may carry
        raise BrokerURLError(
            f"{option}: expected nats://… or amqp://…, got {destination_key(url, '')!r}"
        )
    module, extra = BROKERS[scheme]
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise BrokerURLError(
            f"{option} {scheme}://… needs the {extra} extra ({error.name} is missing): "
            f"uv sync --extra {extra}"
        ) from None

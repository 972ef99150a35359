"""Broker names (seed 000 §9, §10), optionally under a namespace so that several
deployments, or test runs, can share one broker."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

COMMAND_KIND = "cmd.task.execute.v1"
# What a --namespace may hold: it becomes part of stream, subject and queue names.
NAMESPACE = re.compile(r"[A-Za-z0-9_-]*")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def subject_for(kind: str) -> str:
    """A NATS subject or AMQP routing key from an event kind: each dot-separated token
    keeps only letters, digits, ``_`` and ``-`` (a publication's event name is free
    text; ``*``, ``>`` or a space would break a subject)."""
    return ".".join(_UNSAFE.sub("_", token) or "_" for token in kind.split("."))


@dataclass(frozen=True)
class Names:
    namespace: str = ""

    def _prefixed(self, name: str, sep: str) -> str:
        return f"{self.namespace}{sep}{name}" if self.namespace else name

    # NATS JetStream: streams by subject space; subjects carry the namespace.
    def stream(self, name: str) -> str:  # GRNS_EVT, GRNS_CMD, GRNS_DLQ
        return self._prefixed(name, "_")

    def subject(self, subject: str) -> str:
        return self._prefixed(subject, ".")

    # RabbitMQ: exchanges and queues carry the namespace; routing keys do not.
    def amqp(self, name: str) -> str:  # grns.evt, grns.cmd, grns.cmd.task.execute
        return self._prefixed(name, ".")


def destination_key(url: str, namespace: str) -> str:
    """The cursor's key: the URL without credentials, and the namespace if any."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    key = f"{parts.scheme}://{host}{port}{parts.path if parts.path not in ('', '/') else ''}"
    return f"{key}#{namespace}" if namespace else key

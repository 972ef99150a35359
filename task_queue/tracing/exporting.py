"""Choosing the tracing hooks (``task_queue.tracing.active``), once per process when
the queue app is ready: OpenTelemetry's (``task_queue.tracing.otel``) when the
environment asks for traces and the ``otel`` extra is installed, else none. The engine
only calls the hooks, so it never imports the exporter."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from task_queue import tracing

logger = logging.getLogger(__name__)

_EXPORTER_SETTINGS = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)


def configured(environ: dict[str, str] | os._Environ = os.environ) -> bool:
    """Whether the environment asks for traces: an exporter or an OTLP endpoint named
    (``OTEL_TRACES_EXPORTER=none`` and ``OTEL_SDK_DISABLED=true`` say no)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters == "none":
        return False
    return any(environ.get(name, "").strip() for name in _EXPORTER_SETTINGS)


def provider_installed() -> bool:
    """Whether this process's own code installed a TracerProvider before the apps
    loaded (``opentelemetry-instrument``, a deployment's settings): looked up only if
    OpenTelemetry is imported already, so as not to import it."""
    api = sys.modules.get("opentelemetry.trace")
    return api is not None and not isinstance(api.get_tracer_provider(), api.ProxyTracerProvider)


def setup(provider: Any = None) -> bool:
    """Choose the hooks, once per process (``task_queue.apps``): OpenTelemetry's when
    the environment configures it (:func:`configured`) or a TracerProvider is
    installed already, and the ``otel`` extra is installed; else none. ``provider``:
    a TracerProvider to use instead (tests pass one with an in-memory exporter).
    True when enabled."""
    if provider is None and not configured() and not provider_installed():
        tracing.active = tracing.NO_TRACING
        return False
    try:
        from task_queue.tracing import otel
    except ImportError as error:
        logger.warning("OTEL_* asks for traces but OpenTelemetry is not installed (%s)", error)
        tracing.active = tracing.NO_TRACING
        return False
    tracing.active = otel.OtelTracing(provider)
    return True


def disable() -> None:
    """Back to no hooks (tests, after :func:`setup` with a provider)."""
    tracing.active = tracing.NO_TRACING

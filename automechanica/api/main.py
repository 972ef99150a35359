"""The HTTP API: ``/api/v1/...``, its OpenAPI schema at ``/api/openapi.json`` and
interactive docs at ``/api/docs``."""

import json
import math
from typing import Any

import pydantic_core
from django.http import HttpRequest
from ninja import NinjaAPI
from ninja.operation import Operation
from ninja.parser import Parser
from ninja.renderers import JSONRenderer
from ninja.responses import NinjaJSONEncoder

from . import errors
from .auth import token_or_staff
from .routers import (
    alerts,
    memory,
    messages,
    publications,
    remote_workers,
    schedules,
    system,
    tasks,
    workflows,
)


class StrictJsonParser(Parser):
    """JSON as RFC 8259 has it: Python's parser also takes NaN and Infinity (and makes
    infinity of 1e999), which no column can store; here they make the body malformed."""

    def parse_body(self, request: HttpRequest) -> Any:
        return json.loads(request.body, parse_constant=_refuse_constant, parse_float=_finite)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    """A number too large for a float (1e999) would become infinity."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


class FastJsonRenderer(JSONRenderer):
    """Answers written by pydantic's serializer (Rust) rather than ``json.dumps`` with
    ninja's encoder, which calls back into Python for every UUID and datetime: a
    remote claim's answer of 36 tasks took 1.07 ms to write that way and 0.11 ms this
    way (CPU, on the 2-core machine of docs/performance.md), about a tenth of the web
    server's time per remotely drained task.

    The JSON differs from ``json.dumps``'s in form (compact, UTF-8 rather than ``\\u``
    escapes) and in its times: to the microsecond (ISO 8601, ``Z`` for UTC), as
    PostgreSQL writes the answers it builds (``task_queue.sql.reading``). A value
    pydantic cannot write (a string with a lone surrogate, a type it does not know that
    ninja's encoder does) falls back to ninja's way.
    """

    def render(self, request: HttpRequest, data: Any, *, response_status: int) -> Any:
        try:
            return pydantic_core.to_json(data)
        except pydantic_core.PydanticSerializationError:
            return json.dumps(data, cls=NinjaJSONEncoder)


class AutoMechanicaApi(NinjaAPI):
    def get_openapi_operation_id(self, operation: Operation) -> str:
        """The view's name (``get_task``), which OpenAPI links and clients refer to."""
        return operation.view_func.__name__


api = AutoMechanicaApi(
    title="AutoMechanica API",
    version="1",
    description=(
        "The control plane of the AutoMechanica task queue: orchestrators create "
        "workflows and tasks here, watch them, and cancel or revive them. Every route "
        "needs `Authorization: Bearer <token>` (`manage.py create_api_token NAME "
        "--scope read|write|admin`). Every 4xx answer has the body "
        "`{code, message, field_errors: [{field, message}], details}`."
    ),
    urls_namespace="api",
    parser=StrictJsonParser(),
    renderer=FastJsonRenderer(),
    docs_decorator=token_or_staff,
)
errors.install(api)
for router in (
    tasks.router,
    workflows.router,
    system.router,
    memory.router,
    messages.router,
    publications.router,
    schedules.router,
    remote_workers.router,
    alerts.router,
):
    api.add_router("/v1", router)

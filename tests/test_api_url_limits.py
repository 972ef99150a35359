"""Every valid GET fits daphne's request head.

Twisted (under daphne) refuses a request line plus headers over
``HTTPChannel.totalHeadersSize`` (16 KiB) with a bare 400 and closes the connection
while the client may still be sending: the client sees the connection reset, not an
answer. So the API's limits on query and path parameters must keep the longest valid
URL under that size, counting each character as 4-byte UTF-8 sent percent-encoded
(12 bytes).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import pytest
from twisted.web.http import HTTPChannel

from automechanica.api.main import api
from tests.support.api import token
from tests.support.server import http

# Room for the request's headers (Host, Authorization, User-Agent, Accept…).
HEADER_ALLOWANCE = 1024
WIDEST_CHARACTER = 12  # one 4-byte UTF-8 character, percent-encoded
UNBOUNDED = 10**9
NUMBER = 25  # the longest an integer or a float prints
MOMENT = 40 * 3  # an ISO 8601 time, its + and : percent-encoded


def _resolve(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in schema:
        return components[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def _longest_value(schema: dict[str, Any], components: dict[str, Any]) -> int:
    """The most bytes one value of ``schema`` takes in a URL."""
    schema = _resolve(schema, components)
    if "anyOf" in schema:
        return max(_longest_value(option, components) for option in schema["anyOf"])
    kind = schema.get("type")
    if kind == "string":
        if "enum" in schema:
            return max(len(str(value)) for value in schema["enum"])
        if schema.get("format") == "uuid":
            return 36
        if schema.get("format") == "date-time":
            return MOMENT
        return schema.get("maxLength", UNBOUNDED) * WIDEST_CHARACTER
    if kind in ("integer", "number", "boolean", "null"):
        return NUMBER
    return UNBOUNDED


def _longest_parameter(parameter: dict[str, Any], components: dict[str, Any]) -> int:
    schema = _resolve(parameter.get("schema", {}), components)
    if parameter["in"] == "path":
        return _longest_value(schema, components)
    arrays = [
        _resolve(option, components)
        for option in schema.get("anyOf", [schema])
        if _resolve(option, components).get("type") == "array"
    ]
    each = len(parameter["name"]) + 2  # name=…&
    if arrays:
        items = arrays[0].get("maxItems", UNBOUNDED)
        return items * (each + _longest_value(arrays[0].get("items", {}), components))
    return each + _longest_value(schema, components)


def _longest_urls() -> dict[str, int]:
    schema = api.get_openapi_schema()
    components = schema["components"]["schemas"]
    longest = {}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            parameters = [p for p in operation.get("parameters", []) if p["in"] != "header"]
            longest[f"{method.upper()} {path}"] = len(path) + sum(
                _longest_parameter(p, components) for p in parameters
            )
    return longest


def test_every_operations_longest_valid_url_fits_daphnes_request_head():
    budget = HTTPChannel.totalHeadersSize - HEADER_ALLOWANCE
    too_long = {name: size for name, size in _longest_urls().items() if size > budget}
    assert not too_long, f"longer than {budget} bytes: {too_long}"


@pytest.mark.slow
def test_the_longest_task_search_is_answered_through_daphne(live_servers):
    """Each string filter of GET /tasks at its maximum length, in 4-byte characters."""
    server = live_servers()
    wide = "\N{GRINNING FACE}"
    query = urlencode(
        [("status", status) for status in ("pending", "running", "dead")]
        + [
            ("agent_name", wide * 200),
            ("task_type", wide * 200),
            ("trace_id", wide * 200),
            ("q", wide * 400),
            ("created_after", "2026-01-01T00:00:00+00:00"),
            ("limit", "10"),
        ]
    )
    assert len(query) > 12_000
    status, body = http("GET", f"{server.url}/api/v1/tasks?{query}", token("read"))
    assert status == 200, body
    assert body["items"] == []


@pytest.mark.slow
def test_a_search_text_over_its_limit_is_a_422_naming_it(live_servers):
    server = live_servers()
    status, body = http("GET", f"{server.url}/api/v1/tasks?q={'x' * 401}", token("read"))
    assert status == 422
    assert "q" in str(body)

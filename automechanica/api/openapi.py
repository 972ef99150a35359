"""Additions to the generated OpenAPI schema."""

from typing import Any


def links(parameter: str, operations: dict[str, str]) -> dict[str, Any]:
    """``openapi_extra`` for a create operation: OpenAPI links from its 201 answer's
    ``id`` to the operations (by operation id) that take it as ``parameter``, so a
    client, or a stateful fuzzer, knows what it can call next with it.

    The status is an int, as ninja's own keys are: a string "201" would become a second
    "201" key in the JSON, which Swagger UI's parser refuses.
    """
    return {
        "responses": {
            201: {
                "links": {
                    name: {
                        "operationId": operation_id,
                        "parameters": {parameter: "$response.body#/id"},
                    }
                    for name, operation_id in operations.items()
                }
            }
        }
    }

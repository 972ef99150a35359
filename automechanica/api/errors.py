"""The API's error body, and how each kind of failure becomes one.

Every 4xx answer (and the 503 of a read past its time limit) is ``{"code", "message",
"field_errors": [{"field", "message"}], "details"}``: ``code`` is stable for programs,
``field_errors`` names each bad field as a path into the request
(``tasks[3].priority``, ``payload``, ``cursor``).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI, Schema
from ninja.errors import AuthenticationError, AuthorizationError, HttpError, ValidationError

from agents_app.messaging import InvalidMessage
from task_queue.operations import IdempotencyConflict, InvalidTask


class FieldError(Schema):
    field: str
    message: str


class ErrorOut(Schema):
    code: str
    message: str
    field_errors: list[FieldError] = []
    details: dict[str, Any] = {}


# Every operation documents these, so a client (and the schema check) knows the shape;
# 503 is a read past its time limit (automechanica.read_timeout).
ERROR_STATUSES = (400, 401, 403, 404, 409, 413, 422, 503)
ERROR_RESPONSES: dict[int, type[ErrorOut]] = dict.fromkeys(ERROR_STATUSES, ErrorOut)


# The status of each kind of refused task; the others are 422.
INVALID_TASK_STATUS = {"payload_too_large": 413, "workflow_cancelled": 409}


class ApiError(Exception):
    """Raised by an endpoint to answer with an error body."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field_errors: list[tuple[str, str]] = (),
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field_errors = list(field_errors)
        self.details = details or {}

    @classmethod
    def invalid(cls, field: str, message: str, **details: Any) -> ApiError:
        return cls(
            422,
            "validation_error",
            f"{field}: {message}",
            field_errors=[(field, message)],
            details=details,
        )

    @classmethod
    def not_found(cls, what: str) -> ApiError:
        return cls(404, "not_found", f"no such {what}")

    @classmethod
    def stale_receipt(cls, what: str) -> ApiError:
        """An ack whose receipt is not the current delivery's (the lease ran out and
        the item was given back or went to another reader, or it is done)."""
        return cls(
            409,
            "stale_receipt",
            f"the receipt is not this {what}'s current delivery",
            field_errors=[("receipt", "is not the current delivery's")],
        )

    @classmethod
    def wrong_status(cls, what: str, status: str, action: str) -> ApiError:
        return cls(
            409,
            "invalid_status",
            f"the {what} is {status}: cannot {action}",
            details={"status": status},
        )


def body(
    code: str,
    message: str,
    field_errors: list[tuple[str, str]] = (),
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "code": code,
        "message": message,
        "field_errors": [{"field": f, "message": m} for f, m in field_errors],
        "details": details or {},
    }


def field_path(location: tuple | list) -> str:
    """``("tasks", 3, "priority")`` → ``tasks[3].priority``."""
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "body"


def _validation_field(error: dict[str, Any]) -> str:
    """Where a request validation error is, as the client wrote it.

    ninja reports ``("body", <parameter>, ...)`` for the JSON body, where the
    parameter name and our union tags ("one"/"many") mean nothing to the client, and
    ``("query", [<parameter>,] <field>, [index])`` for query parameters, which are
    flat: the last name is the parameter's.
    """
    source, *rest = error.get("loc", ()) or ("body",)
    if source == "body":
        rest = [part for part in rest[1:] if part not in ("one", "many")]
        return field_path(rest) if rest else "body"
    names = [part for part in rest if isinstance(part, str)]
    return names[-1] if names else source


def install(api: NinjaAPI) -> None:
    """Replace ninja's default error answers with the API's error body."""

    def respond(request: HttpRequest, status: int, payload: dict[str, Any]) -> HttpResponse:
        return api.create_response(request, payload, status=status)

    @api.exception_handler(ApiError)
    def api_error(request: HttpRequest, exc: ApiError) -> HttpResponse:
        return respond(
            request, exc.status, body(exc.code, exc.message, exc.field_errors, exc.details)
        )

    @api.exception_handler(InvalidTask)
    def invalid_task(request: HttpRequest, exc: InvalidTask) -> HttpResponse:
        status = INVALID_TASK_STATUS.get(exc.code, 422)
        return respond(
            request, status, body(exc.code, str(exc), [(exc.path, exc.message)], exc.details)
        )

    @api.exception_handler(InvalidMessage)
    def invalid_message(request: HttpRequest, exc: InvalidMessage) -> HttpResponse:
        return respond(request, 422, body("invalid", str(exc), [(exc.field, exc.message)]))

    @api.exception_handler(IdempotencyConflict)
    def idempotency_conflict(request: HttpRequest, exc: IdempotencyConflict) -> HttpResponse:
        return respond(
            request,
            409,
            body(
                "idempotency_conflict",
                str(exc),
                [(exc.path, "was used before with a different request")],
                {"task_id": str(exc.task_id)},
            ),
        )

    @api.exception_handler(ValidationError)
    def validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
        fields = [(_validation_field(e), e.get("msg", "is invalid")) for e in exc.errors]
        message = "; ".join(f"{f}: {m}" for f, m in fields) or "the request is invalid"
        return respond(request, 422, body("validation_error", message, fields))

    @api.exception_handler(AuthenticationError)
    def unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
        response = respond(
            request,
            401,
            body("unauthorized", "send a valid API token: Authorization: Bearer <token>"),
        )
        response["WWW-Authenticate"] = "Bearer"
        return response

    @api.exception_handler(AuthorizationError)
    def forbidden(request: HttpRequest, exc: AuthorizationError) -> HttpResponse:
        return respond(request, 403, body("forbidden", str(exc)))

    @api.exception_handler(RequestDataTooBig)
    def too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
        return respond(request, 413, body("request_too_large", str(exc)))

    @api.exception_handler(HttpError)
    def http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
        # ninja raises HttpError(400) for a body that is not JSON.
        code = "invalid_json" if exc.status_code == 400 else "error"
        message = "the request body is not valid JSON" if code == "invalid_json" else str(exc)
        return respond(request, exc.status_code, body(code, message))

    @api.exception_handler(Http404)
    def not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
        return respond(request, 404, body("not_found", str(exc) or "not found"))

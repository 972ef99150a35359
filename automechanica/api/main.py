"""The HTTP API: ``/api/v1/...``, its OpenAPI schema at ``/api/openapi.json`` and
interactive docs at ``/api/docs``."""

from ninja import NinjaAPI
from ninja.operation import Operation

from . import errors
from .auth import token_or_staff
from .routers import system, tasks, workflows


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
    docs_decorator=token_or_staff,
)
errors.install(api)
for router in (tasks.router, workflows.router, system.router):
    api.add_router("/v1", router)

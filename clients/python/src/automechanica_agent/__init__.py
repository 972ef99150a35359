"""Run an AutoMechanica agent anywhere, with only the HTTP API and a token."""

from .api import Api, ApiError, LeaseLost
from .runner import Runner
from .task import Cancelled, PermanentError, Task

__all__ = ["Api", "ApiError", "Cancelled", "LeaseLost", "PermanentError", "Runner", "Task"]

"""The backend's DatabaseWrapper: PostgreSQL's, with the embedded server's address."""

from typing import Any

from django.db.backends.postgresql import base

from . import server


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self) -> dict[str, Any]:
        params = super().get_connection_params()
        # Without a NAME (as when creating the test database) Django connects to the
        # "postgres" database, which always exists.
        params["host"] = server.ensure_running(params["dbname"])
        params["user"] = server.SUPERUSER
        return params

"""``manage.py embedded_db status|stop|url``: the embedded PostgreSQL server."""

import json
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from automechanica.embedded_postgres import server


class Command(BaseCommand):
    help = "Show, stop, or print the URL of the embedded PostgreSQL (used without DATABASE_URL)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["status", "stop", "url"])

    def handle(self, *args: Any, **options: Any) -> None:
        if settings.DATABASES["default"]["ENGINE"] != "automechanica.embedded_postgres":
            raise CommandError("DATABASE_URL is set: the embedded server is not in use")
        action = options["action"]
        if action == "status":
            self.stdout.write(json.dumps(server.status(), indent=2))
        elif action == "stop":
            self.stdout.write("stopped" if server.stop() else "was not running")
        else:
            # A data directory refused (SettingsRefused) is manage.py's one line.
            self.stdout.write(server.connection_url(settings.DATABASES["default"]["NAME"]))

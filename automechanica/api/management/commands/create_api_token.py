"""``manage.py create_api_token NAME --scope read|write|admin [--agent NAME ...]``: the
token on the last line."""

from django.core.management.base import BaseCommand, CommandError, CommandParser

from automechanica.api.models import Scope
from automechanica.api.tokens import create_token


class Command(BaseCommand):
    help = "Create an API token. The token is printed once, alone on the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="who or what uses the token, e.g. orchestrator")
        parser.add_argument("--scope", required=True, choices=Scope.values)
        parser.add_argument(
            "--agent",
            action="append",
            default=[],
            dest="agents",
            help="bind the token to this agent (repeatable): it may then send, read "
            "mailboxes and subscriptions, acknowledge and revive only as these agents",
        )

    def handle(self, *args, name: str, scope: str, agents: list[str], **options) -> None:
        try:
            row, token = create_token(name, scope, agents)
        except ValueError as error:
            raise CommandError(str(error)) from None
        bound = f", bound to {', '.join(row.agents)}" if row.agents else ""
        self.stdout.write(
            f"Created API token {row.name!r} with scope {row.scope!r}{bound} (id {row.pk}). "
            "It is shown only now; store it safely:"
        )
        self.stdout.write(token)

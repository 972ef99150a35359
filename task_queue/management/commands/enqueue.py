"""``manage.py enqueue AGENT TASK_TYPE``: create tasks and print their ids, one a line."""

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from task_queue.operations import InvalidTask, TaskSpec, enqueue_many


class Command(BaseCommand):
    help = "Enqueue tasks for an agent; prints each new task's id on its own line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("agent", metavar="AGENT")
        parser.add_argument("task_type", metavar="TASK_TYPE")
        parser.add_argument("--payload", default="{}", help="the payload, a JSON object")
        parser.add_argument("--priority", type=int, default=2, help="0 (first) to 9 (last); 2")
        parser.add_argument("--max-attempts", type=int, help="default: the agent's setting")
        parser.add_argument("--count", type=int, default=1, help="how many such tasks")
        parser.add_argument("--delay", type=float, help="seconds before the tasks are due")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            payload = json.loads(options["payload"])
        except json.JSONDecodeError as error:
            raise CommandError(f"--payload is not valid JSON: {error}") from None
        if options["count"] < 1:
            raise CommandError("--count must be at least 1")
        spec = dict(
            agent_name=options["agent"],
            task_type=options["task_type"],
            payload=payload,
            priority=options["priority"],
            max_attempts=options["max_attempts"],
            delay_seconds=options["delay"],
        )
        try:
            # One spec, many times: enqueue_many validates and encodes it once.
            enqueued = enqueue_many([TaskSpec(**spec)] * options["count"])
        except InvalidTask as error:
            option = {"agent_name": "AGENT", "task_type": "TASK_TYPE"}.get(
                error.field, "--" + error.field.replace("_seconds", "").replace("_", "-")
            )
            raise CommandError(f"{option}: {error.message}") from None
        self.stdout.write("\n".join(str(task.id) for task in enqueued))

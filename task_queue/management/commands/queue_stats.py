"""``manage.py queue_stats [--json]``: task counts by status and agent."""

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from task_queue.stats import queue_stats


class Command(BaseCommand):
    help = "Show task counts by status and by agent, and the oldest pending task's wait."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args: Any, **options: Any) -> None:
        stats = queue_stats()
        if options["json"]:
            self.stdout.write(json.dumps(stats, indent=2))
            return
        statuses = list(stats["totals"])
        width = max([len("agent"), *map(len, stats["by_agent"])])
        self.stdout.write(f"{'agent':<{width}}  " + "  ".join(f"{s:>9}" for s in statuses))
        rows = [*stats["by_agent"].items(), ("total", stats["totals"])]
        for agent, counts in rows:
            self.stdout.write(
                f"{agent:<{width}}  " + "  ".join(f"{counts[s]:>9}" for s in statuses)
            )
        age = stats["oldest_pending_age_seconds"]
        self.stdout.write(
            "oldest pending task has waited " + (f"{age:.1f} s" if age is not None else "-")
        )

"""``manage.py dashboard_bench``: how long the dashboard's pages, the API's reads and
Prometheus ``/metrics`` take on the current database (seed it first with
``seed_tasks`` to measure at scale). Everything runs in-process through Django's test
client (view, queries and template or JSON), as a staff user or with a read token
made for the run and revoked after it."""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.test import Client
from django.utils import timezone

from automechanica.api.models import ApiToken
from automechanica.api.tokens import create_token
from automechanica.dashboard.overview import take_snapshot
from task_queue import stats
from task_queue.bench import machine_facts
from task_queue.models import REVIVABLE_STATUSES, Task

BENCH_USER = "dashboard-bench"


class Command(BaseCommand):
    help = "Time the dashboard's pages, the live snapshot, the API's reads and /metrics."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--repeat", type=int, default=20, help="renders per page (20)")
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument(
            "--only", default="", help="time only the reads whose name contains this text"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["repeat"] < 1:
            raise CommandError("--repeat must be at least 1")
        user, _ = User.objects.get_or_create(username=BENCH_USER, defaults={"is_staff": True})
        client = Client(SERVER_NAME="localhost")  # one of the default ALLOWED_HOSTS
        client.force_login(user)
        dead = Task.objects.filter(status__in=REVIVABLE_STATUSES).order_by("-finished_at").first()
        pages = {
            "overview /": "/",
            "dead letter /dead-letter/": "/dead-letter/",
            "dead letter, payload filter": "/dead-letter/?q=SKU-12",
            "dead letter, payload filter, rare": "/dead-letter/?q=SKU-12345",
            "dead letter, payload filter, no match": "/dead-letter/?q=no-such-text",
            "dead letter, payload filter, all match": "/dead-letter/?q=SKU",
            "dead letter, payload filter + agent": "/dead-letter/?q=SKU-12&agent=FitmentAgent",
            "dead letter, payload filter (all) + error class": (
                "/dead-letter/?q=SKU&error_class=TimeoutError"
            ),
            "dead letter, every filter": (
                "/dead-letter/?q=SKU&agent=FitmentAgent&error_class=TimeoutError"
                "&task_type=seed:FitmentAgent&since=2000-01-01T00:00&until=2100-01-01T00:00"
            ),
            "dead letter, page 40": "/dead-letter/?page=40",
            "dead letter, agent + error class": (
                "/dead-letter/?agent=FitmentAgent&error_class=TimeoutError"
            ),
            "dead letter, agent": "/dead-letter/?agent=FitmentAgent",
            "dead letter, error class": "/dead-letter/?error_class=TimeoutError",
            "dead letter, task type": "/dead-letter/?task_type=seed:FitmentAgent",
            "dead letter, since": "/dead-letter/?since=2000-01-01T00:00",
            "dead letter count": "/dead-letter/count/?agent=FitmentAgent",
            "dead letter count, payload filter": "/dead-letter/count/?q=SKU-12",
            "dead letter count, payload filter, all match": "/dead-letter/count/?q=SKU",
            "dead letter count, error class": "/dead-letter/count/?error_class=TimeoutError",
            "dead letter count, no filter": "/dead-letter/count/",
            "workers /workers/": "/workers/",
            "workflows /workflows/": "/workflows/",
            "reports /reports/daily/": "/reports/daily/",
            "messages /messages/": "/messages/",
        }
        if dead:
            pages["task page"] = f"/tasks/{dead.id}/"
        only = options["only"]
        results = {name: self._time(lambda p=path: _get(client, p), options["repeat"])
                   for name, path in pages.items() if only in name}  # fmt: skip
        if only in "live snapshot (once a second)":
            results["live snapshot (once a second)"] = self._time(take_snapshot, options["repeat"])
        row, token = create_token(BENCH_USER, "read")
        try:
            endpoints = {
                "GET /api/v1/tasks": "/api/v1/tasks",
                "GET /api/v1/tasks?status=dead": "/api/v1/tasks?status=dead",
                "GET /api/v1/dead-letter": "/api/v1/dead-letter",
                "GET /api/v1/dead-letter, agent": "/api/v1/dead-letter?agent_name=FitmentAgent",
                "GET /api/v1/dead-letter, payload text": "/api/v1/dead-letter?q=SKU-12",
                "GET /api/v1/dead-letter, payload text, all match": "/api/v1/dead-letter?q=SKU",
                "GET /api/v1/dead-letter, payload text, rare": "/api/v1/dead-letter?q=SKU-12345",
                "GET /api/v1/dead-letter, payload text, no match": (
                    "/api/v1/dead-letter?q=no-such-text"
                ),
                "GET /api/v1/dead-letter, payload text + agent + status": (
                    "/api/v1/dead-letter?q=SKU&agent_name=FitmentAgent&status=dead"
                ),
                "GET /api/v1/agents": "/api/v1/agents",
                "GET /api/v1/metrics": "/api/v1/metrics",
                "Prometheus /metrics": "/metrics",
            }
            api = Client(SERVER_NAME="localhost", HTTP_AUTHORIZATION=f"Bearer {token}")
            for name, path in endpoints.items():
                if only not in name:
                    continue
                results[name] = self._time(lambda p=path: _get(api, p), options["repeat"])
        finally:
            ApiToken.objects.filter(pk=row.pk).update(revoked_at=timezone.now())
        report = {
            "tasks": sum(n for _, _, n in stats.task_counts()),
            "repeat": options["repeat"],
            "milliseconds": results,
            "machine": machine_facts(),
        }
        if options["json"]:
            self.stdout.write(json.dumps(report))
            return
        self.stdout.write(f"tasks in the table: {report['tasks']:,}")
        for name, figures in results.items():
            self.stdout.write(
                f"{name:40} p50 {figures['p50']:7.1f} ms   p95 {figures['p95']:7.1f} ms   "
                f"max {figures['max']:7.1f} ms"
            )

    def _time(self, action, repeat: int) -> dict[str, float]:
        action()  # warm: templates compiled, connection open
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            action()
            times.append((time.perf_counter() - started) * 1000)
        times.sort()
        return {
            "p50": statistics.median(times),
            "p95": times[min(len(times) - 1, int(len(times) * 0.95))],
            "max": times[-1],
        }


def _get(client: Client, path: str) -> None:
    response = client.get(path)
    if response.status_code != 200:
        raise CommandError(f"GET {path} answered {response.status_code}")

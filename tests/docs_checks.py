"""What each command's example in the docs must do (tests/test_docs_examples.py).

A check's ``setup`` runs before the example and returns what ``verify`` compares
against; ``poke`` gives a command that runs until stopped new work once it runs;
``verify`` asserts the effect the page describes. A command without a check here
fails its examples.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.models import Max
from django.db.models.functions import Now
from django.utils.dateparse import parse_datetime

from agents_app.models import AgentEvent
from automechanica.api.models import ApiToken
from automechanica.api.tokens import find_active_token
from task_queue.models import AlertRule, EventRelayCursor, OutboxEvent, Task, Worker, Workflow
from task_queue.operations import enqueue
from task_queue.relay.names import destination_key
from tests.support.queue import claim_and_start, complete_pending

UUID_LINE = re.compile(r"^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$", re.M)
UP_IS_TESTED_BY = "tests/test_commands.py::test_up_serves_the_api_and_stops_everything_on_ctrl_c"


@dataclass
class Run:
    """What an example printed (standard output, or a process's whole log)."""

    output: str
    workdir: Path
    pid: int | None = None  # the process of an example that runs until stopped


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def completed_echo_task() -> None:
    """New work for a command that runs until stopped: a task run to completion (an
    agent event to embed, events to export or relay)."""
    enqueue("EchoAgent", "echo", {"poke": True})
    complete_pending("EchoAgent")


class Check:
    def setup(self, opts: dict[str, Any]) -> Any:
        return None

    def poke(self, opts: dict[str, Any]) -> None:
        pass

    def verify(self, opts: dict[str, Any], state: Any, run: Run) -> None:
        raise NotImplementedError


class Enqueue(Check):
    def setup(self, opts: dict[str, Any]) -> set:
        return set(Task.objects.values_list("id", flat=True))

    def verify(self, opts: dict[str, Any], before: set, run: Run) -> None:
        ids = run.output.split()
        tasks = Task.objects.filter(id__in=ids).exclude(id__in=before)
        assert len(ids) == tasks.count() == opts["count"], run.output
        made = {(t.agent_name, t.task_type, t.status) for t in tasks}
        assert made == {(opts["agent"], opts["task_type"], "pending")}
        assert all(t.payload == json.loads(opts["payload"]) for t in tasks)


class RunWorker(Check):
    def setup(self, opts: dict[str, Any]) -> list:
        due = Task.objects.filter(
            agent_name__in=opts["agents"], status="pending", available_at__lte=Now()
        )
        return list(due.values_list("id", flat=True))

    def verify(self, opts: dict[str, Any], due: list, run: Run) -> None:
        if run.pid is None:
            assert due, "no task for it to run: the page should enqueue one first"
        else:
            assert Worker.objects.filter(
                pid=run.pid, agents=opts["agents"], concurrency=opts["concurrency"]
            ).exists(), "the worker has not registered"
        expected = min(len(due), opts["max_tasks"] or len(due))
        outcomes = Counter(Task.objects.filter(id__in=due).values_list("status", flat=True))
        assert outcomes["completed"] == expected, f"{dict(outcomes)}: not all completed"


class QueueStats(Check):
    def verify(self, opts: dict[str, Any], state: None, run: Run) -> None:
        counts = Counter(Task.objects.values_list("status", flat=True))
        if opts["json"]:
            totals = json.loads(run.output)["totals"]
            assert {status: n for status, n in totals.items() if n} == dict(counts)
        else:
            header, *rows = run.output.splitlines()
            assert header.split()[0] == "agent"
            agents = set(Task.objects.values_list("agent_name", flat=True))
            assert agents <= {row.split()[0] for row in rows}, run.output


class RunEmbedder(Check):
    def setup(self, opts: dict[str, Any]) -> int:
        return AgentEvent.objects.filter(embedding__isnull=True).count()

    def poke(self, opts: dict[str, Any]) -> None:
        completed_echo_task()

    def verify(self, opts: dict[str, Any], waiting: int, run: Run) -> None:
        if run.pid is None:
            assert waiting, "no agent event to embed: the page should run a task first"
        assert AgentEvent.objects.exists()
        assert not AgentEvent.objects.filter(embedding__isnull=True).exists()


class RunMaintenance(Check):
    def setup(self, opts: dict[str, Any]) -> Any:
        """A running task whose worker vanished: its lease ran out 5 minutes ago."""
        task = enqueue("EchoAgent", "echo", {"lease": "expired"})
        claim_and_start("EchoAgent")
        Task.objects.filter(id=task.id).update(lease_expires_at=Now() - timedelta(minutes=5))
        return task.id

    def verify(self, opts: dict[str, Any], task_id: Any, run: Run) -> None:
        task = Task.objects.get(id=task_id)
        assert (task.status, task.attempts) == ("pending", 1), "the reaper did not recover it"
        assert ("one maintenance pass:" if opts["once"] else "maintenance every") in run.output


class EmbeddedDb(Check):
    def setup(self, opts: dict[str, Any]) -> None:
        if connection.settings_dict["ENGINE"] != "automechanica.embedded_postgres":
            pytest.skip("DATABASE_URL is set: the embedded server is not in use")
        assert opts["action"] != "stop", "an example must not stop the suite's database"

    def verify(self, opts: dict[str, Any], state: None, run: Run) -> None:
        if opts["action"] == "status":
            assert json.loads(run.output)["running"] is True
        else:
            assert run.output.startswith("postgresql://"), run.output


class CreateApiToken(Check):
    def verify(self, opts: dict[str, Any], state: None, run: Run) -> None:
        row = find_active_token(run.output.strip().splitlines()[-1])
        assert row is not None and (row.name, row.scope) == (opts["name"], opts["scope"])
        assert row.agents == sorted(set(opts["agents"]))


class ExportEvents(Check):
    def setup(self, opts: dict[str, Any]) -> None:
        assert OutboxEvent.objects.exists(), "no event to export: the page should make some"

    def poke(self, opts: dict[str, Any]) -> None:
        completed_echo_task()

    def verify(self, opts: dict[str, Any], state: None, run: Run) -> None:
        path = run.workdir / opts["output"] if opts["output"] else None
        events = json_lines(path.read_text() if path and path.exists() else run.output)
        assert events and all(e["kind"].startswith("evt.") for e in events), run.output
        if opts["since"] is not None:
            assert all(e["position"] > opts["since"] for e in events)
        elif opts["since_time"]:
            since = parse_datetime(opts["since_time"])
            assert all(parse_datetime(e["emitted_at"]) >= since for e in events)
        else:  # the whole stream, up to what the poke added
            everything = {str(m) for m in OutboxEvent.objects.values_list("message_id", flat=True)}
            assert everything <= {e["message_id"] for e in events}


class RelayEvents(Check):
    def setup(self, opts: dict[str, Any]) -> None:
        assert OutboxEvent.objects.exists(), "no event to relay: the page should make some"

    def poke(self, opts: dict[str, Any]) -> None:
        completed_echo_task()

    def verify(self, opts: dict[str, Any], state: None, run: Run) -> None:
        destination = destination_key(opts["to"], opts["namespace"])
        cursor = EventRelayCursor.objects.filter(destination=destination).first()
        last = OutboxEvent.objects.aggregate(last=Max("position"))["last"]
        assert cursor is not None and last and cursor.position == last, "not all relayed"
        if opts["dispatch"]:
            assert cursor.dispatched_through is not None, "its scan of due times never ran"


class RunOrchestrator(Check):
    def verify(self, opts: dict[str, Any], state: None, run: Run) -> None:
        ids = UUID_LINE.findall(run.output)  # it prints the started workflow's id
        started = Workflow.objects.filter(id__in=ids).first()
        assert started is not None, run.output
        assert Task.objects.filter(workflow_id=started.id).exists()


class Migrate(Check):
    def verify(self, opts: dict[str, Any], state: None, run: Run) -> None:
        executor = MigrationExecutor(connection)
        assert not executor.migration_plan(executor.loader.graph.leaf_nodes())


class SeedTasks(Check):
    def setup(self, opts: dict[str, Any]) -> int:
        return Task.objects.count()

    def verify(self, opts: dict[str, Any], before: int, run: Run) -> None:
        assert run.output.startswith(f"inserting {opts['count']} synthetic tasks into ")
        assert Task.objects.count() == before + opts["count"]


class DashboardBench(Check):
    def setup(self, opts: dict[str, Any]) -> None:
        assert Task.objects.exists(), "no task to show: the page should seed some first"

    def verify(self, opts: dict[str, Any], state: None, run: Run) -> None:
        timed = [line for line in run.output.splitlines() if " p50 " in line]
        assert len(timed) >= 4, run.output


class QueueBench(Check):
    def verify(self, opts: dict[str, Any], state: None, run: Run) -> None:
        report = json.loads(run.output)  # the bench removes its tasks after
        if opts.get("remote"):  # both runs, and their ratio; its token is deleted after
            drains = [report[side]["drain_tasks_per_s"] for side in ("remote", "in_process")]
            assert report["remote_to_in_process"] == _ratio(*drains)
            if opts["rounds"] > 1:  # every round's ratio; the median round reported whole
                ratios = [each["remote_to_in_process"] for each in report["rounds"]]
                assert len(ratios) == opts["rounds"]
                assert report["remote_to_in_process"] == sorted(ratios)[(len(ratios) - 1) // 2]
                for each in report["rounds"]:
                    assert each["remote_to_in_process"] == _ratio(
                        each["remote_drain_tasks_per_s"], each["in_process_drain_tasks_per_s"]
                    )
            else:
                assert "rounds" not in report
            for part in ("in_process", "remote"):
                self._verify_run(opts, report[part])
            # daphne's CPU, apart from the clients'; runworker goes through no server.
            assert report["remote"]["drain_cost_per_task"]["server_cpu_us"] >= 0
            assert "server_cpu_us" not in report["in_process"]["drain_cost_per_task"]
            assert not ApiToken.objects.filter(name="queue_bench remote").exists()
            return
        self._verify_run(opts, report)

    def _verify_run(self, opts: dict[str, Any], report: dict[str, Any]) -> None:
        assert report["tasks"] == opts["tasks"] and report["drain_tasks_per_s"] > 0
        assert report["pickup_latency_ms"]["samples"] == opts["latency_samples"]
        assert report["machine"]["cpus"] and report["machine"]["postgresql"]
        # CPU time comes in 10 ms ticks per process, so a 200-task drain may count
        # none; a server on another machine has no CPU time here (None).
        cost = report["drain_cost_per_task"]
        assert cost["postgres_cpu_us"] is None or cost["postgres_cpu_us"] >= 0
        assert cost["worker_cpu_us"] >= 0 and cost["wal_bytes"] > 0


def _ratio(remote: float, in_process: float) -> float:
    """The remote drain over the in-process one, rounded as queue_bench rounds it."""
    return round(remote / in_process, 3)


class EnqueueBench(Check):
    def setup(self, opts: dict[str, Any]) -> int:
        return Task.objects.count()

    def verify(self, opts: dict[str, Any], before: int, run: Run) -> None:
        report = json.loads(run.output)
        modes = opts["mode"] or ["api", "api-minimal", "cli", "python"]
        assert set(report) == {*modes, "machine"}
        for mode in modes:
            assert len(report[mode]["tasks_per_s"]) == opts["repeat"] and report[mode]["median"] > 0
            if mode.startswith("api"):
                assert report[mode]["connections"] == opts["connections"]
        assert report["machine"]["cpus"] and report["machine"]["postgresql"]
        assert Task.objects.count() == before  # the bench removes its tasks


class AlertBench(Check):
    def verify(self, opts: dict[str, Any], state: None, run: Run) -> None:
        assert run.output.startswith(f"{opts['runs']} evaluations of 7 rules over ")
        assert not AlertRule.objects.filter(name__startswith="alert_bench:").exists()


class Up(Check):
    def setup(self, opts: dict[str, Any]) -> None:
        pytest.skip(f"up starts every process; {UP_IS_TESTED_BY} runs it (slow)")


CHECKS: dict[str, Check] = {
    "enqueue": Enqueue(),
    "runworker": RunWorker(),
    "queue_stats": QueueStats(),
    "runembedder": RunEmbedder(),
    "runmaintenance": RunMaintenance(),
    "embedded_db": EmbeddedDb(),
    "create_api_token": CreateApiToken(),
    "export_events": ExportEvents(),
    "relay_events": RelayEvents(),
    "runorchestrator": RunOrchestrator(),
    "migrate": Migrate(),
    "seed_tasks": SeedTasks(),
    "dashboard_bench": DashboardBench(),
    "queue_bench": QueueBench(),
    "enqueue_bench": EnqueueBench(),
    "alert_bench": AlertBench(),
    "up": Up(),
}

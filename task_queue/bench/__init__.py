"""The queue benchmark behind ``manage.py queue_bench``.

Real worker processes (``manage.py runworker EchoAgent``) on the configured
database, with all bookkeeping on (history, AgentEvent, embedding job):

0. the database is vacuumed, so that what earlier runs deleted is not cleaned up by
   autovacuum during this one;
1. enqueue: N tasks through ``enqueue_many`` in one transaction, 1,000 a statement;
2. drain: from that commit until the last task is finished, by W workers;
3. pickup latency: on the now idle queue, one task at a time at a steady low rate;
   enqueue commit → the worker's start statement (the task's ``started_at``), the
   last step before the handler runs. ``done_latency_ms`` is enqueue commit → the
   completion statement: for EchoAgent, which does nothing, an upper bound on the
   time to handler start. The true pickup latency lies between the two.

With ``remote``, the same run is made again with remote agents instead of runworker
processes (the HTTP API's worker protocol, through a real daphne): the HTTP API
registers how to start them (``register_remote_workers``), since the queue cannot
import the layers above it. The report then has both, and their ratio. On a shared
2-core machine one drain can run at a fifth of the speed of the next; ``rounds``
repeats the pair, each side first every other time, and reports the
median round with every round's figures.
"""

from __future__ import annotations

import gc
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import psutil
from django.conf import settings
from django.db import connection, transaction

from task_queue.models import Worker, Workflow
from task_queue.operations import TaskSpec, enqueue, enqueue_many

from . import sql as bench_sql

ENQUEUE_CHUNK = 1000
# How often the benchmark checks whether the workers are done. Each check is a
# query on the tasks table, so checking often would load the database it measures.
PROGRESS_POLL_SECONDS = 0.25
# While the agent's running totals have stopped falling, the workflow is counted at
# most this often (other EchoAgent tasks enqueued during a run keep the totals up after
# the workflow has drained).
WORKFLOW_COUNT_EVERY_POLLS = 4


@dataclass
class BenchConfig:
    tasks: int = 20_000
    workers: int = 2
    concurrency: int = 50
    latency_samples: int = 200
    latency_rate: float = 50.0  # tasks per second during the latency phase
    timeout: float = 600.0
    remote: bool = False  # also drain with remote agents, and compare
    rounds: int = 1  # with remote: pairs of drains, alternating which side goes first


class BenchProcesses(NamedTuple):
    """The processes a drain runs on: the workers (each registers in `workers` under
    its own pid) and the servers they go through (remote agents' daphne), whose CPU
    is reported apart (``server_cpu_us``)."""

    workers: list[subprocess.Popen]
    servers: list[subprocess.Popen]


# Starts the benchmark's workers: (config, log folder) -> a context manager giving their
# processes and stopping them after.
WorkerStarter = Callable[[BenchConfig, Path], AbstractContextManager[BenchProcesses]]
_remote_workers: WorkerStarter | None = None


def register_remote_workers(starter: WorkerStarter) -> None:
    """How ``--remote`` starts remote agents (the HTTP API registers it)."""
    global _remote_workers
    _remote_workers = starter


def run(config: BenchConfig) -> dict[str, Any]:
    if not config.remote:
        return _run(config, _local_workers)
    if _remote_workers is None:
        raise RuntimeError("--remote needs the HTTP API's app (automechanica.api) installed")
    sides = {"in_process": _local_workers, "remote": _remote_workers}
    rounds = []
    for number in range(config.rounds):
        # Each side first every other round: a machine slowing down or speeding up
        # during the run does not favour one side.
        order = list(sides) if number % 2 == 0 else list(reversed(sides))
        reports = {side: _run(config, sides[side]) for side in order}
        ratio = reports["remote"]["drain_tasks_per_s"] / reports["in_process"]["drain_tasks_per_s"]
        rounds.append((round(ratio, 3), reports))
    # The median round (the lower middle one of an even count), whole.
    ratio, reports = sorted(rounds, key=lambda r: r[0])[(len(rounds) - 1) // 2]
    report: dict[str, Any] = {side: reports[side] for side in sides}
    report["remote_to_in_process"] = ratio
    if config.rounds > 1:
        report["rounds"] = [
            {
                **{
                    f"{side}_{figure}": each[side][figure]
                    for side in sides
                    for figure in ("drain_tasks_per_s", "drain_cost_per_task")
                },
                "remote_to_in_process": each_ratio,
            }
            for each_ratio, each in rounds
        ]
    return report


@contextmanager
def _local_workers(config: BenchConfig, log_dir: Path) -> Iterator[BenchProcesses]:
    workers = [
        _start_worker(config.concurrency, log_dir / f"worker-{i}.log")
        for i in range(config.workers)
    ]
    try:
        yield BenchProcesses(workers, [])
    finally:
        stop_processes(workers)


def _run(config: BenchConfig, start_workers: WorkerStarter) -> dict[str, Any]:
    bench_sql.vacuum_database()
    workflow = Workflow.objects.create(name=f"queue_bench {datetime.now(UTC).isoformat()}")
    log_dir = Path(tempfile.mkdtemp(prefix="queue_bench-"))
    with start_workers(config, log_dir) as processes:
        report = _measure(workflow, processes, config, log_dir)
    shutil.rmtree(log_dir)  # kept when the benchmark failed, for its workers' logs
    return report


def _measure(
    workflow: Workflow, processes: BenchProcesses, config: BenchConfig, log_dir: Path
) -> dict[str, Any]:
    try:
        _wait_registered(processes.workers, config.timeout, log_dir)
        meter = CostMeter(processes.workers, processes.servers)
        enqueue_rate, drain_rate, cost = _throughput(workflow.id, config, meter)
        latencies, done_latencies = _pickup_latencies(config)
        return {
            "tasks": config.tasks,
            "workers": config.workers,
            "concurrency": config.concurrency,
            "enqueue_tasks_per_s": round(enqueue_rate),
            "drain_tasks_per_s": round(drain_rate),
            # Per drained task: CPU in PostgreSQL (all its processes), in the workers,
            # and WAL written.
            "drain_cost_per_task": cost,
            "pickup_latency_ms": {
                "samples": len(latencies),
                "rate_per_s": config.latency_rate,
                "p50": _percentile(latencies, 50),
                "p95": _percentile(latencies, 95),
                "p99": _percentile(latencies, 99),
            },
            "done_latency_ms": {
                "p50": _percentile(done_latencies, 50),
                "p95": _percentile(done_latencies, 95),
                "p99": _percentile(done_latencies, 99),
            },
            "machine": machine_facts(),
        }
    finally:
        bench_sql.delete_workflow_tasks(workflow.id)
        workflow.delete()


def _start_worker(concurrency: int, log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "runworker",
                "EchoAgent",
                "--concurrency",
                str(concurrency),
            ],
            cwd=settings.BASE_DIR,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _wait_registered(workers: list[subprocess.Popen], timeout: float, log_dir: Path) -> None:
    pids = {w.pid for w in workers}
    deadline = time.monotonic() + timeout
    while set(Worker.objects.filter(pid__in=pids).values_list("pid", flat=True)) != pids:
        if any(w.poll() is not None for w in workers):
            raise RuntimeError(f"a benchmark worker exited during start-up; logs in {log_dir}")
        if time.monotonic() > deadline:
            raise RuntimeError("benchmark workers did not start")
        time.sleep(0.05)


class CostMeter:
    """CPU time of the server's processes and of the workers, and WAL written, between
    :meth:`start` and :meth:`per_task`: the cost of the drain, broken down.

    The server's processes are found from this session's backend (its parent is the
    postmaster): a server on another machine has no processes here, and its CPU time
    is reported as ``None``. Each process counts the time it spent since the start (a
    process started since, all of its time): backends that exit during the drain take
    their time with them, and on a server that other clients share (the suite's
    parallel processes on one system server) their coming and going cannot make the
    sum fall. The workers' connections live as long as the workers.
    """

    def __init__(self, workers: list[subprocess.Popen], servers: list[subprocess.Popen]) -> None:
        self.workers = [psutil.Process(w.pid) for w in workers]
        self.servers = [psutil.Process(s.pid) for s in servers]

    def start(self) -> None:
        self.wal, backend_pid = bench_sql.server_counters()
        self.postmaster = _postmaster(backend_pid)
        self.server_cpu = _cpu_seconds(_family(self.postmaster))
        self.worker_cpu = _cpu_seconds(self.workers)
        self.servers_cpu = _cpu_seconds(self.servers)

    def per_task(self, tasks: int) -> dict[str, float | None]:
        wal, _ = bench_sql.server_counters()
        server = _cpu_since(_family(self.postmaster), self.server_cpu) if self.postmaster else None
        cost = {
            "postgres_cpu_us": round(server / tasks * 1e6, 1) if server is not None else None,
            "worker_cpu_us": round(_cpu_since(self.workers, self.worker_cpu) / tasks * 1e6, 1),
            "wal_bytes": round((wal - self.wal) / tasks),
        }
        if self.servers:
            spent = _cpu_since(self.servers, self.servers_cpu)
            cost["server_cpu_us"] = round(spent / tasks * 1e6, 1)
        return cost


def _postmaster(backend_pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(backend_pid).parent()
    except psutil.Error:
        return None  # the server is not on this machine


def _family(process: psutil.Process | None) -> list[psutil.Process]:
    if process is None:
        return []
    try:
        return [process, *process.children(recursive=True)]
    except psutil.Error:
        return []


def _cpu_seconds(processes: list[psutil.Process]) -> dict[psutil.Process, float]:
    """Each process's CPU time so far (a process is its pid and start time)."""
    spent = {}
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue  # exited since it was listed
        spent[process] = times.user + times.system
    return spent


def _cpu_since(processes: list[psutil.Process], before: dict[psutil.Process, float]) -> float:
    """The CPU time ``processes`` spent since ``before`` was read (``_cpu_seconds``)."""
    return sum(
        seconds - before.get(process, 0.0) for process, seconds in _cpu_seconds(processes).items()
    )


def _throughput(
    workflow_id, config: BenchConfig, meter: CostMeter
) -> tuple[float, float, dict[str, float | None]]:
    specs = [
        TaskSpec("EchoAgent", "echo", {"n": i}, workflow_id=workflow_id)
        for i in range(config.tasks)
    ]
    unfinished_before = bench_sql.unfinished_of_agent("EchoAgent")
    started = time.perf_counter()
    with transaction.atomic():
        for i in range(0, len(specs), ENQUEUE_CHUNK):
            enqueue_many(specs[i : i + ENQUEUE_CHUNK])
        # The workers start at the commit: the cost counted is the drain's alone.
        meter.start()
    committed = time.perf_counter()
    committed_at = datetime.now(UTC)
    _wait_drained(workflow_id, unfinished_before, time.monotonic() + config.timeout)
    cost = meter.per_task(config.tasks)
    last_finished = max(finished for _, _, finished in bench_sql.task_times(workflow_id))
    drain_seconds = (last_finished - committed_at).total_seconds()
    return config.tasks / (committed - started), config.tasks / drain_seconds, cost


def _wait_drained(workflow_id, unfinished_before: int, deadline: float) -> None:
    """Until every task of the workflow has finished.

    The running totals say when EchoAgent is back to the unfinished tasks it had
    before, without reading the tasks table; only then is the workflow counted, and
    counted again until it is done. On a queue that is not quiet, other EchoAgent tasks
    may keep the totals up after the workflow has drained: the workflow is also counted
    when the totals have stopped falling, at most every WORKFLOW_COUNT_EVERY_POLLS
    polls. A count reads every task of the workflow (0.3 to 0.7 s of PostgreSQL at a
    million); counted while the totals still fall, as it was every 10 s, it took about
    2 % of the million-task drain it measured.
    """
    polls_since_count = 0
    previous = None
    while (unfinished := bench_sql.unfinished_of_agent("EchoAgent")) > unfinished_before:
        if time.monotonic() > deadline:
            break  # the workflow's count below says how far it got
        stalled = previous is not None and unfinished >= previous
        polls_since_count += 1
        if stalled and polls_since_count >= WORKFLOW_COUNT_EVERY_POLLS:
            polls_since_count = 0
            if _drained(workflow_id):
                return
        previous = unfinished
        time.sleep(PROGRESS_POLL_SECONDS)
    while not _drained(workflow_id):
        if time.monotonic() > deadline:
            finished, total = bench_sql.task_progress(workflow_id)
            raise RuntimeError(f"drain timed out with {finished} of {total} finished")
        time.sleep(PROGRESS_POLL_SECONDS)


def _drained(workflow_id) -> bool:
    finished, total = bench_sql.task_progress(workflow_id)
    return finished == total


def _pickup_latencies(config: BenchConfig) -> tuple[list[float], list[float]]:
    """Milliseconds from each probe's enqueue commit to its start and to its completion."""
    probe = Workflow.objects.create(name="queue_bench latency")
    committed: dict = {}
    interval = 1 / config.latency_rate
    next_at = time.monotonic()
    # A garbage collection between the commit and the clock reading would date the
    # commit late and the latency short (even below zero, as seen on a loaded machine).
    gc.disable()
    try:
        for i in range(config.latency_samples):
            time.sleep(max(0.0, next_at - time.monotonic()))  # the load generator's pacing
            task = enqueue("EchoAgent", "echo", {"probe": i}, workflow_id=probe.id)
            committed[task.id] = datetime.now(UTC)
            next_at += interval
    finally:
        gc.enable()
    deadline = time.monotonic() + config.timeout
    while (progress := bench_sql.task_progress(probe.id))[0] < progress[1]:
        if time.monotonic() > deadline:
            raise RuntimeError("latency probes did not finish")
        time.sleep(PROGRESS_POLL_SECONDS)
    times = bench_sql.task_times(probe.id)
    bench_sql.delete_workflow_tasks(probe.id)
    probe.delete()

    def since_commit(task_id, moment: datetime) -> float:
        return (moment - committed[task_id]).total_seconds() * 1000

    return (
        [since_commit(task_id, started) for task_id, started, _ in times],
        [since_commit(task_id, finished) for task_id, _, finished in times],
    )


def stop_processes(workers: list[subprocess.Popen]) -> None:
    """SIGTERM, and SIGKILL what has not exited 30 s later."""
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()


def _percentile(values: list[float], pct: int) -> float:
    if len(values) < 2:
        return round(values[0], 2) if values else float("nan")
    return round(statistics.quantiles(values, n=100, method="inclusive")[pct - 1], 2)


def machine_facts() -> dict[str, Any]:
    cpu_model = next(
        (line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")),
        platform.processor(),
    )
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        server_version = cursor.fetchone()[0]
    engine = settings.DATABASES["default"]["ENGINE"]
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "postgresql": server_version,
        "database": "embedded" if engine.endswith("embedded_postgres") else "DATABASE_URL",
        "load_average_1m": os.getloadavg()[0],
    }


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []

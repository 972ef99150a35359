"""A worker process: leases tasks of some agents and runs them on a pool of threads.

Threads, and what each one does:

- the fetch loop (the caller's thread) claims as many due tasks as there are free
  slots in one statement, which starts them (status ``running``), and hands them to
  the handler threads. It sleeps until a NOTIFY for one of its agents, a free slot, the
  next task's ``available_at`` or the poll interval, whichever comes first;
- ``concurrency`` handler threads run agents (``execution.run_handler``);
- the outcome writer records finished tasks in batches (``outcomes``);
- the monitor heartbeats every ``lease/3`` (one statement extends all leases,
  writes the progress handlers reported since the last one, records the worker's
  state and reports cancellation requests and lost leases), and at once when the
  worker starts draining; it runs the reaper, and fails handlers that pass their
  agent's timeout;
- the listener turns notifications into wake-ups (``notifications``);
- with ``--dispatch``, the follower takes the broker's dispatch commands and claims
  their tasks by id (``relay.follower``); the listener is then off, and the fetch
  loop claims by itself only at the poll interval, as the fallback for a lost command.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol
from uuid import UUID

import psutil
from django.db import DatabaseError, connection

from task_queue.sql import heartbeats, leasing

from . import leases, registry, remote, task_logging, tracing
from .claim_position import ClaimPosition
from .execution import InFlight, StopReason, deadline_for, run_handler, timed_out
from .maintenance import reaper
from .models import WorkerState
from .notifications import Listener
from .outcomes import OutcomeWriter, log_outcome, release
from .retry import CONNECTION_ERRORS, Backoff

logger = logging.getLogger(__name__)

MONITOR_TICK_SECONDS = 0.25
MIN_IDLE_WAIT_SECONDS = 0.005


@dataclass
class WorkerConfig:
    agents: list[str]
    concurrency: int = 10
    lease_seconds: float = 30.0
    poll_seconds: float = 5.0
    reaper_seconds: float = 5.0
    grace_seconds: float = 10.0
    burst: bool = False
    max_tasks: int | None = None
    # Follow a broker's dispatch commands (``runworker --dispatch``): makes the
    # follower of this worker (``relay.follower.Follower``), which the engine itself
    # never imports.
    dispatch: Callable[[Worker], DispatchFollower] | None = None


class DispatchFollower(Protocol):
    """What the worker asks of the follower of a broker's dispatch commands."""

    def start(self) -> None: ...

    def slot_freed(self) -> None: ...

    def settled(self, runs: Iterable[tuple[UUID, UUID]]) -> None:
        """These runs' (task, lease token) outcomes are committed, or given back."""

    def stop(self) -> None: ...


class MonitorFailed(RuntimeError):
    """The worker stopped because its monitor thread failed (the reason is chained)."""


@dataclass
class WorkerReport:
    claimed: int
    written: int
    refused: int
    released: int


class Worker:
    def __init__(
        self, config: WorkerConfig, *, now: Callable[[], datetime | None] = lambda: None
    ) -> None:
        """``now`` gives the time for every queue statement; None means the database's
        clock. Tests pass a fixed time to step through backoff without sleeping."""
        self.config = config
        self.now = now
        self.id = leases.holder_id()
        self.agents = {name: registry.get(name)() for name in config.agents}
        self.inflight: dict[UUID, InFlight] = {}
        self.claimed = 0
        self.released = 0
        self._claim_position = ClaimPosition()  # the fetch loop's alone
        self.monitor_failure: Exception | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._claim_lock = threading.Lock()  # the fetch loop's claims and the follower's
        self._stopping = threading.Event()
        self._monitor_stop = threading.Event()
        self._work: queue.SimpleQueue[InFlight | None] = queue.SimpleQueue()
        self._follower = config.dispatch(self) if config.dispatch is not None else None
        self._writer = OutcomeWriter(
            self.id, now, written=self._wake, on_written=self._settled if self._follower else None
        )
        self._listener = (
            Listener(self.agents, self._wake, config.poll_seconds)
            if self._follower is None
            else None
        )
        self._process = psutil.Process()  # for the memory the heartbeat reports
        # Once the worker's row is deleted no heartbeat writes it again (the upsert
        # would bring back a stale row): the lock orders a heartbeat in flight first.
        self._registry_lock = threading.Lock()
        self._deregistered = False

    # ------------------------------------------------------------ lifecycle

    def run(self) -> WorkerReport:
        """Work until stopped (or, with ``burst``/``max_tasks``, until done)."""
        self._writer.start()
        if self._listener is not None:
            self._listener.start()
            # Once it is known whether notifications arrive; where they do not, the
            # listener has warned, and the worker polls.
            self._listener.checked.wait(self._listener.check_seconds + 1)
        for i in range(self.config.concurrency):
            threading.Thread(target=self._handle_loop, name=f"handler-{i}", daemon=True).start()
        self._heartbeat()  # registers the worker before it takes any task
        monitor = threading.Thread(target=self._monitor_loop, name="monitor", daemon=True)
        monitor.start()
        if self._follower is not None:
            self._follower.start()
        logger.info(
            "worker %s ready: agents %s, concurrency %d",
            self.id,
            ", ".join(self.agents),
            self.config.concurrency,
        )
        try:
            self._fetch_loop()
        finally:
            self._shutdown(monitor)
        if self.monitor_failure is not None:
            raise MonitorFailed(repr(self.monitor_failure)) from self.monitor_failure
        return WorkerReport(self.claimed, self._writer.written, self._writer.refused, self.released)

    def request_stop(self) -> None:
        """Stop leasing; in-flight tasks get the grace period to finish (thread-safe)."""
        self._stopping.set()
        self._wake.set()

    # ------------------------------------------------------------ fetching

    def _fetch_loop(self) -> None:
        backoff = Backoff()
        if self._follower is not None:  # the fallback: a poll interval from the start
            self._stopping.wait(self.config.poll_seconds)
        while not self._stopping.is_set():
            self._wake.clear()
            free = self._free_slots()
            try:
                claimed = self._claim_and_dispatch(free) if free else 0
                if free and claimed == free:
                    continue  # there may be more due right now
                if self._finished(claimed):
                    return
                wait = self._idle_wait() if free else self.config.poll_seconds
                backoff.reset()
            except CONNECTION_ERRORS as error:
                wait = backoff.next()
                logger.warning("fetching tasks failed (%s); retrying in %.1f s", error, wait)
                connection.close()
            if self._follower is None:
                self._wake.wait(wait)
            else:  # the fallback: finished tasks free slots for commands, not for this claim
                self._stopping.wait(wait)

    # ------------------------------------------------------------ dispatch

    def free_slots(self) -> int:
        """Slots free for a dispatched task (the follower's; thread-safe)."""
        return self._free_slots()

    def stopping(self) -> bool:
        return self._stopping.is_set()

    def claim_dispatched(
        self, task_id: UUID, agent: str, before_start: Callable[[UUID], None]
    ) -> str:
        """Claim the task a dispatch command names (on the follower's database thread):
        ``claimed`` (``before_start`` got its lease token before it started), ``later``
        (no free slot, or the task is due but cannot start just now: its row locked by
        another claim, its agent at a limit) or ``done`` (nothing to run: finished,
        held, not yet due, its agent paused, or no such task)."""
        with self._claim_lock:
            if self._stopping.is_set() or not self._free_slots():
                return "later"
            task = leasing.claim_task(
                owner=self.id,
                task_id=task_id,
                agent=agent,
                lease_seconds=self.config.lease_seconds,
                now=self.now(),
            )
            if task is not None:
                before_start(task.lease_token)
                self._hand_over([task])
                return "claimed"
        return "later" if remote.why_not(task_id).reason == "over_limit" else "done"

    def _settled(self, runs: list[tuple[UUID, UUID]]) -> None:
        """These runs' (task, lease token) outcomes are committed, or their tasks were
        given back or their leases lost."""
        if self._follower is not None:
            self._follower.settled(runs)

    def _free_slots(self) -> int:
        free = self.config.concurrency - len(self.inflight)
        if self.config.max_tasks is not None:
            free = min(free, self.config.max_tasks - self.claimed)
        return max(free, 0)

    def _finished(self, claimed_now: int) -> bool:
        if self.inflight or claimed_now or not self._writer.idle():
            return False
        if self.config.max_tasks is not None and self.claimed >= self.config.max_tasks:
            return True
        return self.config.burst

    def _claim_and_dispatch(self, limit: int) -> int:
        with self._claim_lock:
            if self._follower is not None:  # the follower may have taken slots
                limit = min(limit, self._free_slots())
            began = tracing.active.claim_began()
            with leasing.claiming():  # settings and stale plans; the claim's transaction
                claimed = leasing.claim_tasks(
                    owner=self.id,
                    agents=list(self.agents),
                    limit=limit,
                    lease_seconds=self.config.lease_seconds,
                    now=self.now(),
                    position=self._claim_position,
                )
            if not claimed:
                return 0
            tracing.active.claimed(claimed, began, self.id)
            self._hand_over(claimed)
        return len(claimed)

    def _hand_over(self, claimed: list[leasing.ClaimedTask]) -> None:
        """Give claimed tasks to the handler threads."""
        self.claimed += len(claimed)
        flights = [self._in_flight(task) for task in claimed]
        with self._lock:  # held from here on, so the heartbeat extends these leases
            self.inflight.update((f.task.id, f) for f in flights)
        for flight in flights:
            self._work.put(flight)

    def _in_flight(self, task: leasing.ClaimedTask) -> InFlight:
        agent = self.agents[task.agent_name]
        return InFlight(task=task, agent=agent, deadline=deadline_for(agent))

    def _forget(self, flights: list[InFlight]) -> None:
        with self._lock:
            for flight in flights:
                self.inflight.pop(flight.task.id, None)

    def _idle_wait(self) -> float:
        """Seconds until the next pending task falls due, within the poll interval."""
        if self._follower is not None:
            return self.config.poll_seconds  # dispatch commands wake it, not due times
        next_due = leasing.next_due_at(list(self.agents))
        if next_due is None:
            return self.config.poll_seconds
        now = self.now() or datetime.now(UTC)
        seconds = (next_due - now).total_seconds()
        return min(max(seconds, MIN_IDLE_WAIT_SECONDS), self.config.poll_seconds)

    # ------------------------------------------------------------ handling

    def _handle_loop(self) -> None:
        while (flight := self._work.get()) is not None:
            try:
                if flight.settled:
                    continue  # released at shutdown before a thread took it: not ours now
                about = task_logging.enter(flight.task, self.id)  # the hot path: no `with`
                span = tracing.active.task_started(flight.task, self.id)
                written = None
                try:
                    logger.debug("task %s started: %s", flight.task.id, flight.task.task_type)
                    outcome = run_handler(flight)
                    if outcome is not None and flight.settle():
                        written = outcome
                        log_outcome(outcome)
                        self._writer.put(outcome)
                    elif flight.stop_reason is not None:
                        reason = flight.stop_reason.value
                        logger.debug("task %s stopped: %s", flight.task.id, reason)
                        if flight.stop_reason is StopReason.LEASE_LOST:
                            self._settled([flight.held])  # nothing of ours to write
                finally:
                    tracing.active.task_ended(span, written, flight.stop_reason)
                    task_logging.leave(about)
            finally:
                self._forget([flight])
                self._wake.set()
                if self._follower is not None:
                    self._follower.slot_freed()

    # ------------------------------------------------------------ monitoring

    def _monitor_loop(self) -> None:
        """Heartbeats, timeouts and the reaper. Should anything unexpected stop this
        thread, the leases it extends would expire under tasks still running and the
        fetch loop would go on claiming more: so the worker stops instead, giving its
        tasks back, and ``run`` raises :class:`MonitorFailed`."""
        heartbeat_every = self.config.lease_seconds / 3
        next_heartbeat = time.monotonic() + heartbeat_every
        next_reap = time.monotonic()
        draining_shown = False
        try:
            while not self._monitor_stop.wait(MONITOR_TICK_SECONDS):
                now = time.monotonic()
                self._fail_timed_out(now)
                # A stop request is shown at once (state draining), not a lease/3 later.
                if now >= next_heartbeat or (self._stopping.is_set() and not draining_shown):
                    draining_shown = self._stopping.is_set()
                    self._heartbeat()
                    next_heartbeat = now + heartbeat_every
                if now >= next_reap:
                    self._reap()
                    next_reap = now + self.config.reaper_seconds
        except Exception as error:
            logger.exception("the monitor failed; stopping the worker, giving its tasks back")
            self.monitor_failure = error
            self.request_stop()
        finally:
            connection.close()

    def _held_flights(self) -> list[InFlight]:
        with self._lock:
            return [f for f in self.inflight.values() if not f.settled]

    def _state(self, flights: list[InFlight]) -> WorkerState:
        if self._stopping.is_set():
            return WorkerState.DRAINING
        return WorkerState.BUSY if flights else WorkerState.IDLE

    def _heartbeat(self) -> None:
        """Extend the leases, write the progress not yet written (kept for the next
        heartbeat if this one fails) and the worker's state."""
        flights = self._held_flights()
        progress = [f.unwritten_progress() for f in flights]
        try:
            with self._registry_lock:
                if self._deregistered:
                    return
                alive = self._write_heartbeat(flights, progress)
        except CONNECTION_ERRORS as error:
            logger.warning("heartbeat failed (%s)", error)
            connection.close()
            return
        for flight, report in zip(flights, progress, strict=True):
            if report is not None:
                flight.progress_written = report
        for flight in flights:
            if flight.task.id not in alive:
                if flight.settle():
                    with task_logging.about_task(flight.task, self.id):
                        logger.warning("lost the lease on task %s; stopping it", flight.task.id)
                    flight.stop(StopReason.LEASE_LOST)
            elif alive[flight.task.id].cancel_requested:
                flight.stop(StopReason.CANCEL_REQUESTED)

    def _write_heartbeat(
        self, flights: list[InFlight], progress: list[tuple[float, str] | None]
    ) -> dict[UUID, heartbeats.HeldLease]:
        return heartbeats.heartbeat(
            owner=self.id,
            held=[f.held for f in flights],
            lease_seconds=self.config.lease_seconds,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            agents=list(self.agents),
            concurrency=self.config.concurrency,
            memory_bytes=self._process.memory_info().rss,
            state=self._state(flights),
            progress=progress if any(progress) else (),
            now=self.now(),
        )

    def _fail_timed_out(self, now: float) -> None:
        for flight in self._held_flights():
            if now > flight.deadline and flight.settle():
                with task_logging.about_task(flight.task, self.id):
                    logger.warning("task %s timed out; stopping it", flight.task.id)
                flight.stop(StopReason.TIMED_OUT)
                self._writer.put(timed_out(flight))

    def _reap(self) -> None:
        try:
            reaper.reap_expired_leases(now=self.now())
        except CONNECTION_ERRORS as error:
            logger.warning("reaper pass failed (%s)", error)
            connection.close()

    # ------------------------------------------------------------ shutdown

    def _shutdown(self, monitor: threading.Thread) -> None:
        """Let in-flight tasks finish within the grace period, then give back the rest."""
        self._stopping.set()
        with self._claim_lock:  # a dispatched claim under way hands its task over first
            pass
        # Without its monitor nothing extends the leases: no grace, give the tasks back.
        grace = 0.0 if self.monitor_failure is not None else self.config.grace_seconds
        deadline = time.monotonic() + grace
        while self.inflight and (remaining := deadline - time.monotonic()) > 0:
            self._wake.clear()
            if self.inflight:
                self._wake.wait(min(remaining, 0.1))
        unfinished = [f for f in self._held_flights() if f.settle()]
        for flight in unfinished:
            flight.stop(StopReason.SHUTDOWN)
        self._writer.close(timeout=30)
        if unfinished:
            self._release(unfinished)
        if self._follower is not None:  # after the acks of the outcomes written above
            self._follower.stop()
        self._monitor_stop.set()
        monitor.join(5)
        if self._listener is not None:
            self._listener.stop()
        for _ in range(self.config.concurrency):
            self._work.put(None)
        self._deregister()
        connection.close()

    def abandon(self) -> None:
        """Give back every lease at once, its handlers still running: what a second
        stop signal does just before the process exits. Another worker takes the tasks
        now instead of after their leases expire (a wrapper such as ``timeout`` under
        ``uv run`` delivers two SIGTERMs for one stop)."""
        if flights := self._held_flights():
            self._release(flights)
        self._deregister()

    def _deregister(self) -> None:
        """Delete the worker's row, after a heartbeat in flight (5 s at most: a second
        stop signal must not hang on a database that does not answer)."""
        locked = self._registry_lock.acquire(timeout=5)
        self._deregistered = True
        if locked:
            self._registry_lock.release()
        try:
            heartbeats.delete_worker(self.id)
        except DatabaseError:
            logger.exception("could not remove the worker's row")

    def _release(self, flights: list[InFlight]) -> None:
        try:
            released = release(self.id, [f.held for f in flights], self.now())
            given_back = [task_id for task_id, status in released.items() if status == "pending"]
        except DatabaseError:
            logger.exception(
                "releasing %d leases failed; the reaper will recover them", len(flights)
            )
            return
        self.released = len(given_back)
        self._settled([f.held for f in flights])
        logger.info("released %d unfinished tasks for other workers", len(given_back))

"""Runs a handler on claimed tasks, N at a time, with everything the protocol asks of
a worker (docs/remote-agents.md).

Threads:

- the claimer long-polls for as many tasks as there are free slots; or, following
  dispatch commands (``dispatch``: :class:`~automechanica_agent.dispatch.NatsCommands`),
  takes as many commands and claims each one's task by id, acknowledging the command
  once the task's outcome was accepted (at once for a task it cannot claim, or later
  again for one over its agent's limit);
- ``concurrency`` handler threads run the handler, one task each;
- the heartbeater extends every held lease at a third of its length until its
  outcome is acknowledged, sending the latest progress, and stops a task whose lease
  was lost or whose cancel was asked;
- outcomes wait in an :class:`~automechanica_agent.outbox.Outbox`: a busy worker's
  next claim carries them (one request reports and claims), and the sender sends
  them in batches when no claim is coming, retrying while the server is down.

``stop()`` (SIGTERM, SIGINT in the CLI) ends the claims, gives running handlers
``grace_seconds`` to finish, then asks the rest to stop and gives their tasks back
(``released``: pending again, no attempt counted), waits for a long poll still in
flight (at most ``wait_seconds``) to give back what it brings, and sends what is left
to send.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import httpx

from .api import Api, ApiError, LeaseLost
from .outbox import Outbox
from .task import Cancelled, PermanentError, Task

logger = logging.getLogger(__name__)

Handler = Callable[[Task], Any]
# How long a finished task's outcome waits for a claim to carry it while claims are
# coming (the queue is busy) before the sender sends it on its own.
CARRY_SECONDS = 0.1
# The most outcomes one request may carry (the API's limit).
MAX_BATCH = 500
MESSAGE_MAX_CHARS = 4_000
TRACEBACK_MAX_CHARS = 16_000


class Runner:
    def __init__(
        self,
        url: str,
        token: str,
        agent: str,
        handler: Handler,
        *,
        worker: str | None = None,
        concurrency: int = 4,
        lease_seconds: float = 30.0,
        wait_seconds: float = 10.0,
        grace_seconds: float = 10.0,
        batch_size: int = 100,
        dispatch: Any = None,
    ) -> None:
        self.agent = agent
        self.handler = handler
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}"
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.wait_seconds = wait_seconds
        self.grace_seconds = grace_seconds
        if not 1 <= batch_size <= MAX_BATCH:
            raise ValueError(f"batch_size must be 1 to {MAX_BATCH}, not {batch_size}")
        self.batch_size = batch_size
        self._dispatch = dispatch
        self._commands: dict[str, Any] = {}  # a claimed task's dispatch command
        # Claims have a client of their own (its long polls outlast the others' timeouts).
        self._claims = Api(url, token, timeout=wait_seconds + 30)
        self._api = Api(url, token)
        # Leases held, until their outcome is acknowledged (heartbeats go to these).
        self._held: dict[str, Task] = {}
        # Tasks handed to a handler thread and not yet finished: a slot each. A finished
        # task's outcome goes with the next claim, or is sent on its own (the outbox).
        self._running = 0
        self._settled: set[str] = set()
        self._lock = threading.Lock()
        self._slot_free = threading.Event()
        self._stopping = threading.Event()
        self._done = threading.Event()
        self._outbox = Outbox(CARRY_SECONDS)
        # Claims carry outcomes unless the server does not take them (an older one).
        self._carry = True
        # Handler threads are daemons: one whose handler ignores a stop request does not
        # keep the process from exiting (its task was given back).
        self._work: queue.SimpleQueue[Task] = queue.SimpleQueue()
        self.counts = {"completed": 0, "failed": 0, "released": 0, "lost": 0}

    # ------------------------------------------------------------ lifecycle

    def run(self) -> dict[str, int]:
        """Work until :meth:`stop`; returns how many outcomes of each kind were sent."""
        sender = threading.Thread(target=self._send_loop, name="sender")
        beater = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        claim_loop = self._claim_loop if self._dispatch is None else self._follow_loop
        claimer = threading.Thread(target=claim_loop, name="claimer", daemon=True)
        handlers = [
            threading.Thread(target=self._handle_loop, name=f"handler-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        for thread in (sender, beater, claimer, *handlers):
            thread.start()
        logger.info(
            "worker %s: agent %s, concurrency %d", self.worker, self.agent, self.concurrency
        )
        self._stopping.wait()
        self._shutdown(sender, claimer)
        return dict(self.counts)

    def stop(self) -> None:
        """Stop taking tasks and shut down (safe from a signal handler's thread)."""
        self._stopping.set()
        self._slot_free.set()

    def _shutdown(self, sender: threading.Thread, claimer: threading.Thread) -> None:
        logger.info(
            "stopping: %d tasks running get %.0f s to finish", len(self._held), self.grace_seconds
        )
        deadline = time.monotonic() + self.grace_seconds
        while self._held and time.monotonic() < deadline:
            self._slot_free.wait(0.05)
            self._slot_free.clear()
        with self._lock:
            left = list(self._held.values())
        for task in left:
            task.stop("shutdown")
            if self._settle(task):
                self._report(task, {"status": "released"})
        if left:
            logger.info("giving %d unfinished tasks back", len(left))
        # A long poll still in flight may yet bring tasks (the ones just given back,
        # even): its answer comes within the wait, and they are given back too. It is
        # not cut short: a socket closed under a blocked read sends the server nothing,
        # and the server would claim tasks for an answer no one reads.
        claimer.join(self.wait_seconds + 10)
        self._claims.close()
        # A claim still retrying gives its outcomes back to the outbox as it fails.
        claimer.join(5)
        self._outbox.close()
        # Outcomes still unsent after this are lost: their leases run out and the
        # reaper gives the tasks back.
        sender.join(60)
        self._done.set()
        self._api.close()
        if self._dispatch is not None:  # commands not acknowledged are delivered again
            self._dispatch.close()

    # ------------------------------------------------------------ claiming

    def _free_slots(self) -> int:
        """A slot per handler; and no more leases than twice the slots, finished ones
        waiting for their outcome's answer included (a server refusing outcomes must
        not have this worker take, and heartbeat, task after task)."""
        unanswered = 2 * self.concurrency - len(self._held)
        free = min(self.concurrency - self._running, unanswered)
        if free <= 0:
            if unanswered <= 0:  # no claim until outcomes are answered: send them
                self._outbox.claim_coming(False)
            self._slot_free.wait(1.0)
            self._slot_free.clear()
        return free

    def _claim_loop(self) -> None:
        while not self._stopping.is_set():
            if (free := self._free_slots()) <= 0:
                continue
            began = time.monotonic()
            carried = self._outbox.take(self.batch_size) if self._carry else []
            # A claim that carries outcomes does not wait: their answers would wait too.
            wait_seconds = 0 if carried else self.wait_seconds
            try:
                claimed, results = self._claims.claim(
                    self.agent, self.worker, free, self.lease_seconds, wait_seconds, carried
                )
                tasks = [Task.from_claim(claim) for claim in claimed]
            except ApiError as error:
                if carried:  # perhaps refused for one of them: sent on their own instead
                    # At most MAX_BATCH outcomes, each task once: a server refuses the
                    # field itself only if it does not know it (an older one).
                    if _names_field(error, "outcomes"):
                        self._carry = False
                        logger.warning(
                            "the server does not take outcomes with a claim (%s): they are "
                            "sent on their own from now on",
                            error,
                        )
                    else:
                        logger.warning("claim with %d outcomes refused (%s)", len(carried), error)
                    self._send_batch(carried)
                elif not self._stopping.is_set():
                    logger.warning("claim failed (%r); trying again in 1 s", error)
                    self._stopping.wait(1.0)
                continue
            except Exception as error:  # the claimer must outlive any one answer
                self._outbox.put(carried, first=True)
                if not self._stopping.is_set():
                    logger.warning("claim failed (%r); trying again in 1 s", error)
                    self._stopping.wait(1.0)
                continue
            try:
                self._answered(carried, results)
            except Exception:  # the claimer must outlive any one answer
                logger.exception("the answers to %d outcomes were not understood", len(carried))
                for outcome in carried:
                    self._forget(outcome["task_id"])
            self._outbox.claim_coming(bool(tasks) and self._carry)
            for task in tasks:
                self._start(task)
            if not tasks and not carried and time.monotonic() - began < min(self.wait_seconds, 1.0):
                # Answered at once with nothing (a server that does not wait): no spin.
                self._stopping.wait(1.0)

    def _follow_loop(self) -> None:
        while not self._stopping.is_set():
            if (free := self._free_slots()) <= 0:
                continue
            try:
                commands = self._dispatch.fetch(free)
            except Exception as error:  # the claimer must outlive any one broker error
                if not self._stopping.is_set():
                    logger.warning("taking dispatch commands failed (%r); again in 1 s", error)
                    self._stopping.wait(1.0)
                continue
            for command in commands:
                self._claim_dispatched(command)

    def _claim_dispatched(self, command: Any) -> None:
        try:
            task = Task.from_claim(
                self._claims.claim_task(command.task_id, self.worker, self.lease_seconds)
            )
        except ApiError as error:
            details = error.body.get("details") if isinstance(error.body, dict) else None
            reason = details.get("reason") if isinstance(details, dict) else None
            if reason == "over_limit":  # due, but its agent is at a limit: a little later
                self._dispatch.later(command, 1.0)
            else:  # done, held, not due, paused, unknown, not ours: nothing to run
                self._dispatch.ack(command)
            return
        except Exception as error:  # the server down: the broker delivers it again
            logger.warning("claiming task %s failed (%r)", command.task_id, error)
            self._dispatch.later(command, 1.0)
            return
        with self._lock:
            self._commands[task.id] = command
        self._start(task)

    def _start(self, task: Task) -> None:
        with self._lock:
            self._held[task.id] = task
        if self._stopping.is_set():  # claimed as we stopped: give it back
            if self._settle(task):
                self._report(task, {"status": "released"})
            return
        with self._lock:
            self._running += 1
        self._work.put(task)

    # ------------------------------------------------------------ handling

    def _handle_loop(self) -> None:
        while True:
            task = self._work.get()
            try:
                self._handle(task)
            except (Exception, SystemExit):  # a handler thread must outlive any one task
                logger.exception("handling task %s failed", task.id)

    def _handle(self, task: Task) -> None:
        # The slot is freed after the outcome is in the outbox, so that the claim its
        # freeing lets go carries it.
        try:
            try:
                result = self.handler(task)
            except Cancelled:
                outcome = self._stopped(task)
            except Exception as error:
                outcome = self._stopped(task) if task.stop_reason else _failure(error)
            else:
                outcome = self._stopped(task) if task.stop_reason else _completion(result)
            if outcome is not None and self._settle(task):
                self._report(task, outcome)
            elif task.stop_reason == "lease lost":  # nothing to report: the lease is free
                self._forget(task.id)
        finally:
            with self._lock:
                self._running -= 1
            self._slot_free.set()

    def _stopped(self, task: Task) -> dict[str, Any] | None:
        """What a task stopped from outside reports: a cancelled one a failure (the
        server ends it cancelled), one stopped by the shutdown is given back, a lost
        one nothing (it is not this worker's any more)."""
        if task.stop_reason == "cancel requested":
            error = {"type": "Cancelled", "message": "cancel requested"}
            return {"status": "failed", "error": error, "retryable": False}
        if task.stop_reason == "shutdown":
            return {"status": "released"}
        return None

    def _settle(self, task: Task) -> bool:
        """The right to report this task's outcome; only the first caller gets it."""
        with self._lock:
            if task.id in self._settled:
                return False
            self._settled.add(task.id)
            return True

    def _report(self, task: Task, outcome: dict[str, Any]) -> None:
        self._outbox.put([{"task_id": task.id, "lease_token": task.lease_token, **outcome}])

    def _forget(self, task_id: str) -> None:
        """The task's outcome was answered (or its lease lost): it is done here."""
        with self._lock:
            self._held.pop(task_id, None)
            self._settled.discard(task_id)
            command = self._commands.pop(task_id, None)
        if command is not None:
            self._dispatch.ack(command)
        self._slot_free.set()

    # ------------------------------------------------------------ heartbeats

    def _heartbeat_loop(self) -> None:
        """Every held lease, until its outcome is acknowledged (a finished task's lease
        must outlast the sending of its outcome)."""
        sent: dict[str, tuple[float, str] | None] = {}
        while not self._done.wait(self.lease_seconds / 3):
            with self._lock:
                held = [t for t in self._held.values() if t.stop_reason != "lease lost"]
            for task in held:
                try:
                    self._heartbeat(task, sent)
                except Exception as error:  # the heartbeat must outlive any one answer
                    logger.warning("heartbeat of task %s failed (%r)", task.id, error)
            for task_id in set(sent) - {t.id for t in held}:
                del sent[task_id]

    def _heartbeat(self, task: Task, sent: dict[str, tuple[float, str] | None]) -> None:
        progress = task._progress
        try:
            answer = self._api.heartbeat(
                task.id, task.lease_token, None if progress is sent.get(task.id) else progress
            )
        except LeaseLost:
            logger.warning("lost the lease on task %s; stopping it", task.id)
            task.stop("lease lost")
            if task.id in self._held and self._settle(task):
                self._count("lost")
            return
        sent[task.id] = progress
        if answer["cancel_requested"]:
            task.stop("cancel requested")

    def _count(self, kind: str) -> None:
        with self._lock:
            self.counts[kind] += 1

    # ------------------------------------------------------------ outcomes

    def _send_loop(self) -> None:
        """Outcomes no claim carries, in batches; a batch that cannot be sent at all is
        logged, and its tasks are left to their leases (the reaper gives them back)."""
        while (batch := self._outbox.next_batch(self.batch_size)) is not None:
            self._send_batch(batch)

    def _send_batch(self, batch: list[dict[str, Any]]) -> None:
        try:
            self._send(batch)
        except Exception:  # the sender (or claimer) must outlive any one answer
            logger.exception("sending %d outcomes failed", len(batch))
            for outcome in batch:
                self._forget(outcome["task_id"])

    def _send(self, batch: list[dict[str, Any]]) -> None:
        try:
            results = self._api.outcomes(batch)
        except ApiError as error:
            if len(batch) > 1:  # one refused outcome must not hold up the others
                for outcome in batch:
                    self._send([outcome])
                return
            results = [self._refused(batch[0], error)]
        except httpx.HTTPError as error:  # only once the client is closed
            logger.error("could not send %d outcomes (%s)", len(batch), error)
            return
        self._answered(batch, results)

    def _answered(self, batch: list[dict[str, Any]], results: list[dict[str, Any]]) -> None:
        """The server's answer to each outcome of ``batch``: counted, and done here."""
        for outcome, result in zip(batch, results, strict=True):
            if "error" in result:
                logger.warning(
                    "outcome of task %s refused: %s", outcome["task_id"], result["error"]
                )
                self._count("lost")
            else:
                self._count(outcome["status"])
            self._forget(outcome["task_id"])

    def _refused(self, outcome: dict[str, Any], error: ApiError) -> dict[str, Any]:
        """The server refused this outcome itself (a result too large, say): report the
        task failed with the reason instead, once."""
        logger.error("outcome of task %s refused: %s", outcome["task_id"], error)
        if outcome["status"] != "completed":
            return {"error": {"code": "refused", "message": str(error)}}
        reason = {"type": "OutcomeRefused", "message": str(error)[:MESSAGE_MAX_CHARS]}
        failure = {**outcome, "status": "failed", "error": reason, "retryable": False}
        failure.pop("result", None)
        try:
            return self._api.outcomes([failure])[0]
        except (ApiError, httpx.HTTPError) as again:
            return {"error": {"code": "refused", "message": str(again)}}


def _completion(result: Any) -> dict[str, Any]:
    if result is None:
        result = {}
    elif not isinstance(result, dict):
        result = {"result": result}
    return {"status": "completed", "result": result}


def _failure(error: BaseException) -> dict[str, Any]:
    trace = "".join(traceback.format_exception(error))
    return {
        "status": "failed",
        "error": {
            "type": type(error).__name__,
            "message": str(error)[:MESSAGE_MAX_CHARS],
            "traceback": trace[-TRACEBACK_MAX_CHARS:],
        },
        "retryable": not isinstance(error, PermanentError),
    }


def _names_field(error: ApiError, field: str) -> bool:
    """Whether the API refused the request for ``field`` itself (a 422 naming it)."""
    body = error.body if isinstance(error.body, dict) else {}
    fields = body.get("field_errors") or []
    return error.status == 422 and any(
        isinstance(f, dict) and f.get("field") == field for f in fields
    )

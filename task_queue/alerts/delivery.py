"""Sending alert notifications, outside the evaluation's transaction.

Each pass of the maintenance loop gives back deliveries whose sender died mid-send,
leases the due ones (a claim counts an attempt) and hands them to a few sender
threads, so a receiver that is down, slow or failing never holds the loop up. A
sender records the attempt (status, HTTP code, error) with the outcome, fenced by
its lease: sent; tried again after ``attempt² × BASE_DELAY_SECONDS``; or failed once
``max_attempts`` are spent. A sender killed mid-send leaves its delivery to the
recovery, which may send it a second time: a receiver can tell by the
``X-AutoMechanica-Delivery`` header.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from django.db import connection

from task_queue import leases
from task_queue.sql import alerts as alerts_sql

from . import channels

logger = logging.getLogger(__name__)

SENDERS = 4
BASE_DELAY_SECONDS = 5.0  # 5 s, 20 s, 45 s, ... (8 attempts: about 17 minutes)
# Long enough for a send's timeout, so only a sender that died loses its lease.
LEASE_SECONDS = channels.TIMEOUT_SECONDS + 30

_senders = ThreadPoolExecutor(max_workers=SENDERS, thread_name_prefix="alert-sender")
# Sends started and not finished: a pass leases only as many as there are free
# senders, so a leased delivery is sent at once, never left queued past its lease.
_in_flight = threading.BoundedSemaphore(SENDERS)


def deliver(*, wait_for_sends: bool = False) -> int:
    """One pass: recover, lease and start sending the due deliveries (as many as
    there are free senders); how many were started. ``wait_for_sends``: return once
    they were sent (tests)."""
    leases.recover_expired(alerts_sql.DELIVERY_LEASE, alerts_sql.RECOVER_DELIVERIES)
    free = 0
    while free < SENDERS and _in_flight.acquire(blocking=False):
        free += 1
    claimed = []
    try:
        if free:
            claimed = alerts_sql.claim_deliveries(
                owner=leases.holder_id(), limit=free, lease_seconds=LEASE_SECONDS
            )
    finally:
        for _ in range(free - len(claimed)):
            _in_flight.release()
    started: list[Future] = [_senders.submit(_send, *row) for row in claimed]
    if wait_for_sends:
        wait(started)
    return len(started)


def _send(
    delivery_id: int, token: Any, attempt: int, channel: dict[str, Any], body: dict[str, Any]
) -> None:
    try:
        sent = channels.send(channel, body, delivery_id)
        status = alerts_sql.finish_delivery(
            delivery_id=delivery_id,
            token=token,
            ok=sent.ok,
            http_status=sent.http_status,
            error=sent.error,
            base_delay=BASE_DELAY_SECONDS,
        )
        if not sent.ok:
            shown = channels.shown(channel)
            logger.warning(
                "alert %s (%s) to %s %s: attempt %d failed (%s); now %s",
                body["rule"], body["state"], shown["type"], shown.get("url") or shown.get("to"),
                attempt, sent.error, status,
            )  # fmt: skip
    except Exception:  # a sender thread must outlive any one delivery
        logger.exception("alert delivery %s failed", delivery_id)
    finally:
        connection.close()  # this thread's; the next send opens its own
        _in_flight.release()

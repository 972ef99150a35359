"""The agent client's outbox (clients/python): outcomes ride on the next claim while
claims are coming, and the sender takes them at once when none is, or after the
carry time; closing hands the rest to the sender. Loaded from its file: it needs
only the standard library."""

from __future__ import annotations

import importlib.util
import threading
import time

from tests.support.processes import REPO
from tests.support.waiting import wait_for

_spec = importlib.util.spec_from_file_location(
    "agent_outbox", REPO / "clients" / "python" / "src" / "automechanica_agent" / "outbox.py"
)
outbox_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(outbox_module)
Outbox = outbox_module.Outbox


def sender(box, batches: list) -> threading.Thread:
    def send() -> None:
        while (batch := box.next_batch(100)) is not None:
            batches.append(batch)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_with_no_claim_coming_the_sender_sends_at_once():
    box = Outbox(carry_seconds=3600)
    batches: list = []
    thread = sender(box, batches)
    box.append({"task_id": "a"})
    wait_for(lambda: batches, timeout=10, what="the sender's batch")
    assert batches == [[{"task_id": "a"}]]
    box.close()
    thread.join(10)
    assert not thread.is_alive()


def test_while_claims_come_a_claim_carries_them_and_the_sender_waits():
    box = Outbox(carry_seconds=3600)
    box.claim_coming(True)
    batches: list = []
    thread = sender(box, batches)
    box.append({"task_id": "a"})
    box.append({"task_id": "b"})
    assert box.take(1) == [{"task_id": "a"}]
    assert box.take(10) == [{"task_id": "b"}]
    assert batches == []
    # The claimer now waits (its claim got nothing): the sender takes what comes.
    box.append({"task_id": "c"})
    box.claim_coming(False)
    wait_for(lambda: batches, timeout=10, what="the sender's batch")
    assert batches == [[{"task_id": "c"}]]
    box.close()
    thread.join(10)
    assert not thread.is_alive()


def test_an_outcome_no_claim_took_is_sent_after_the_carry_time():
    box = Outbox(carry_seconds=0.2)
    box.claim_coming(True)
    batches: list = []
    thread = sender(box, batches)
    began = time.monotonic()
    box.append({"task_id": "a"})
    wait_for(lambda: batches, timeout=10, what="the sender's batch")
    assert batches == [[{"task_id": "a"}]]
    assert time.monotonic() - began >= 0.2
    box.close()
    thread.join(10)


def test_outcomes_put_back_go_first():
    box = Outbox(carry_seconds=0)
    box.append({"task_id": "b"})
    box.put([{"task_id": "a"}])
    assert box.take(10) == [{"task_id": "a"}, {"task_id": "b"}]

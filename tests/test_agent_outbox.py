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


class Sender:
    """The sender's loop on a thread of its own, keeping the batches it takes."""

    def __init__(self, box) -> None:
        self.box = box
        self.batches: list = []
        self.thread = threading.Thread(target=self._send, daemon=True)
        self.thread.start()

    def _send(self) -> None:
        while (batch := self.box.next_batch(100)) is not None:
            self.batches.append(batch)

    def sent(self) -> list:
        wait_for(lambda: self.batches, timeout=10, what="the sender's batch")
        return self.batches

    def stop(self) -> None:
        """Closing ends the sender's loop."""
        self.box.close()
        self.thread.join(10)
        assert not self.thread.is_alive()


def test_with_no_claim_coming_the_sender_sends_at_once():
    box = Outbox(carry_seconds=3600)
    sender = Sender(box)
    box.put([{"task_id": "a"}])
    assert sender.sent() == [[{"task_id": "a"}]]
    sender.stop()


def test_while_claims_come_a_claim_carries_them_and_the_sender_waits():
    box = Outbox(carry_seconds=3600)
    box.claim_coming(True)
    sender = Sender(box)
    box.put([{"task_id": "a"}])
    box.put([{"task_id": "b"}])
    assert box.take(1) == [{"task_id": "a"}]
    assert box.take(10) == [{"task_id": "b"}]
    assert sender.batches == []
    # The claimer now waits (its claim got nothing): the sender takes what comes.
    box.put([{"task_id": "c"}])
    box.claim_coming(False)
    assert sender.sent() == [[{"task_id": "c"}]]
    sender.stop()


def test_an_outcome_no_claim_took_is_sent_after_the_carry_time():
    box = Outbox(carry_seconds=0.2)
    box.claim_coming(True)
    sender = Sender(box)
    began = time.monotonic()
    box.put([{"task_id": "a"}])
    assert sender.sent() == [[{"task_id": "a"}]]
    assert time.monotonic() - began >= 0.2
    sender.stop()


def test_outcomes_put_back_go_first():
    box = Outbox(carry_seconds=0)
    box.put([{"task_id": "b"}])
    box.put([{"task_id": "a"}], first=True)
    assert box.take(10) == [{"task_id": "a"}, {"task_id": "b"}]

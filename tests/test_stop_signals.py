"""StopSignals in one process: a signal is a stop request, nothing else; the block can
be used again; and afterwards the process's own handlers are back."""

from __future__ import annotations

import os
import signal

import pytest

from task_queue.stop_signals import StopSignals


def test_a_signal_requests_a_stop_and_the_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as stop:
        assert not stop.is_set() and not stop.wait(0.01)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # a second one right behind: still a request
        assert stop.wait(5) and stop.is_set()
    assert signal.getsignal(signal.SIGTERM) is before
    assert stop.is_set()  # what was known when the block ended


def test_the_block_can_be_used_again_in_the_same_process():
    # Python's own Ctrl-C handler, whatever this process inherited: a shell without job
    # control starts a background command with SIGINT ignored, and Python keeps that.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for _ in range(3):
            with StopSignals() as stop:
                stop.set()
                assert stop.is_set()
        with StopSignals() as fresh:
            assert not fresh.is_set()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):  # Ctrl-C works again outside the blocks
            # raise() delivers it to this thread, and its handler runs before
            # raise_signal returns; os.kill may deliver it to another thread of the
            # process, which Python hears of only once that thread runs.
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, inherited)

"""EchoAgent: returns its payload. For smoke tests and the queue benchmark."""

from typing import Any

from task_queue.agent import Agent, InvalidPayload, PermanentError, TaskContext
from task_queue.registry import register


class TransientEchoError(Exception):
    """A failure EchoAgent raises on request, which the worker retries."""


@register
class EchoAgent(Agent):
    """Payload keys that steer it:

    - ``sleep_ms``: sleep that long first (cancellable), in tenths, each reported as
      progress (``task.progress``: the task page's bar moves at each heartbeat);
    - ``fail``: ``"transient"`` (retried) or ``"permanent"`` (fails the task);
    - ``fail_times``: fail only the first N attempts, then succeed.
    """

    name = "EchoAgent"
    task_types = ("echo",)
    description = "Returns its payload; can sleep and fail on request."

    def handle(self, task: TaskContext) -> dict[str, Any]:
        payload = task.payload
        sleep_ms = payload.get("sleep_ms", 0)
        if isinstance(sleep_ms, bool) or not isinstance(sleep_ms, int | float) or sleep_ms < 0:
            raise InvalidPayload("sleep_ms", "must be a non-negative number")
        for tenth in range(1, 11 if sleep_ms else 1):
            task.sleep(sleep_ms / 10_000)
            task.progress(tenth / 10, f"slept {tenth * sleep_ms // 10:g} of {sleep_ms:g} ms")
        fail = payload.get("fail")
        if fail is not None:
            if fail not in ("transient", "permanent"):
                raise InvalidPayload("fail", 'must be "transient" or "permanent"')
            fail_times = payload.get("fail_times")
            if fail_times is not None and (
                isinstance(fail_times, bool) or not isinstance(fail_times, int)
            ):
                raise InvalidPayload("fail_times", "must be an integer")
            if fail_times is None or task.attempt < fail_times:
                if fail == "permanent":
                    raise PermanentError(
                        f"permanent failure requested (attempt {task.attempt + 1})"
                    )
                raise TransientEchoError(
                    f"transient failure requested (attempt {task.attempt + 1})"
                )
        return payload

    def describe(self, task: TaskContext, result: dict[str, Any]) -> str:
        return f"EchoAgent echoed {len(result)} keys"

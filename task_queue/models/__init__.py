"""The queue's tables: tasks and workflows, their history, live workers, metric
rollups, the audit log, the event stream, recurring schedules and alert rules.

Django owns the schema (migrations, admin); reading and writing tasks on the hot
path goes through the named SQL in ``task_queue.sql``.
"""

from .alerts import (
    AlertDelivery,
    AlertDeliveryAttempt,
    AlertFiring,
    AlertKind,
    AlertNotification,
    AlertRule,
    AlertState,
    DeliveryStatus,
)
from .audit import OperatorAction
from .dead_letter import DeadLetterEntry, dead_letter_payload_contains, dead_letter_tasks
from .metrics import HISTOGRAM_BOUNDS, RetentionRun, RollupProgress, TaskQueueMetric
from .schedules import Schedule, ScheduleRun
from .stream import EventRelayCursor, OutboxEvent
from .tasks import (
    FINAL_STATUSES,
    HELD_STATUSES,
    MAX_ATTEMPTS_LIMIT,
    PRIORITY_MAX,
    PRIORITY_MIN,
    REVIVABLE_STATUSES,
    DeadLetterTask,
    Priority,
    Task,
    TaskEvent,
    TaskHistory,
    TaskStatus,
    Workflow,
    WorkflowEscalationCheck,
    payload_contains,
    payload_text,
)
from .workers import (
    MAX_CONCURRENCY_LIMIT,
    MAX_RATE_COUNT,
    MAX_RATE_PERIOD_SECONDS,
    AgentLimits,
    PausedAgent,
    Worker,
    WorkerHeartbeat,
    WorkerKind,
    WorkerState,
)

__all__ = [
    "FINAL_STATUSES",
    "HELD_STATUSES",
    "HISTOGRAM_BOUNDS",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_CONCURRENCY_LIMIT",
    "MAX_RATE_COUNT",
    "MAX_RATE_PERIOD_SECONDS",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "REVIVABLE_STATUSES",
    "AgentLimits",
    "AlertDelivery",
    "AlertDeliveryAttempt",
    "AlertFiring",
    "AlertKind",
    "AlertNotification",
    "AlertRule",
    "AlertState",
    "DeadLetterEntry",
    "DeadLetterTask",
    "DeliveryStatus",
    "EventRelayCursor",
    "OperatorAction",
    "OutboxEvent",
    "PausedAgent",
    "Priority",
    "RetentionRun",
    "RollupProgress",
    "Schedule",
    "ScheduleRun",
    "Task",
    "TaskEvent",
    "TaskHistory",
    "TaskQueueMetric",
    "TaskStatus",
    "Worker",
    "WorkerHeartbeat",
    "WorkerKind",
    "WorkerState",
    "Workflow",
    "WorkflowEscalationCheck",
    "dead_letter_payload_contains",
    "dead_letter_tasks",
    "payload_contains",
    "payload_text",
]

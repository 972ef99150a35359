"""The NOTIFY channels of the queue's tables."""

from __future__ import annotations

NOTIFY_CHANNEL = "automechanica_tasks"


# Every statement that changes tasks (all but lease renewals) notifies here (a
# trigger, migrations queue 0004 and 0006): {"tasks": [[id, old_status, new_status],
# ... up to 60, dead-letter moves first], "more": changed tasks beyond those,
# "left": tasks that left the dead letter, "arrived": tasks that entered it}.
# The dashboard listens.
TASK_CHANGES_CHANNEL = "automechanica_task_changes"

# Every transaction that writes envelopes into event_outbox notifies here, once, with
# an empty payload (a trigger, migration queue 0019). The API's stream hub listens.
EVENTS_CHANNEL = "automechanica_events"

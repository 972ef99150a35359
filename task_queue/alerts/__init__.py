"""Alert rules (spec 001 §9, issue 35): conditions of the queue watched per agent by the
maintenance loop, each telling its channels once when it starts to hold, again every
``repeat_seconds`` while it holds, and once when it stops.

- ``evaluation``: reads the running counters (never a count of the tasks table) and
  moves each rule's state, making its notifications in the same transaction, under
  one lock, so however many maintenance processes run (or die mid-evaluation) each
  change is notified once;
- ``delivery``: sends each notification to each channel outside that transaction,
  retried with backoff, every attempt recorded;
- ``channels``: the webhook (signed), Slack and email;
- ``rules``: writing rules (the API), audited; ``declared``: those of settings
  (``QUEUE_ALERT_RULES``), synced when a maintenance loop starts.
"""

from . import declared, delivery, evaluation

__all__ = ["declared", "delivery", "evaluation"]

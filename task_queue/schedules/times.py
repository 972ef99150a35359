"""When a schedule's slots are: a cron expression read in a time zone (cronsim does
the parsing, day-of-week and DST arithmetic), or a fixed interval.

Interval slots fall on multiples of the interval since the Unix epoch, so every
process computes the same slots (and the same idempotency keys) whenever it starts.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Longest interval accepted: beyond a year it is almost surely a unit mistake.
MAX_INTERVAL_SECONDS = 366 * 24 * 3600


class BadTiming(ValueError):
    """A schedule's timing was refused; ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def zone(name: object) -> ZoneInfo:
    """The IANA time zone ``name`` (``Europe/Paris``), or :class:`BadTiming`."""
    if not isinstance(name, str) or not name:
        raise BadTiming("timezone", "must be an IANA time zone name such as Europe/Paris")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise BadTiming("timezone", f"unknown time zone {name!r}") from None


def check(cron: object, interval_seconds: object, timezone: object) -> None:
    """Raise :class:`BadTiming` unless exactly one of ``cron`` and ``interval_seconds``
    is given, and it (and the time zone) is valid."""
    tz = zone(timezone)
    if cron is not None and interval_seconds is not None:
        raise BadTiming("cron", "give cron or interval_seconds, not both")
    if cron is None and interval_seconds is None:
        raise BadTiming("cron", "give cron (with timezone) or interval_seconds")
    if cron is not None:
        if not isinstance(cron, str):
            raise BadTiming("cron", "must be a cron expression such as '*/5 * * * *'")
        try:
            next(CronSim(cron, datetime.now(tz)))
        except (CronSimError, StopIteration, ValueError) as error:
            raise BadTiming("cron", f"{cron!r} is not a cron expression: {error}") from None
        return
    if (
        not isinstance(interval_seconds, int)
        or isinstance(interval_seconds, bool)
        or not 1 <= interval_seconds <= MAX_INTERVAL_SECONDS
    ):
        raise BadTiming(
            "interval_seconds",
            f"must be a whole number of seconds from 1 to {MAX_INTERVAL_SECONDS}",
        )


def next_slot(
    cron: str | None, interval_seconds: int | None, timezone: str, after: datetime
) -> datetime:
    """The first slot strictly after ``after``, in UTC."""
    if cron:
        return next(CronSim(cron, after.astimezone(zone(timezone)))).astimezone(UTC)
    step = timedelta(seconds=interval_seconds)
    return EPOCH + ((after - EPOCH) // step + 1) * step


def latest_slot(
    cron: str | None, interval_seconds: int | None, timezone: str, at: datetime
) -> datetime:
    """The last slot at or before ``at``, in UTC."""
    if cron:
        # cronsim walks back from strictly before its start; slots are whole minutes.
        earlier = CronSim(cron, (at + timedelta(seconds=1)).astimezone(zone(timezone)), True)
        slot = next(earlier)
        while slot > at:
            slot = next(earlier)
        return slot.astimezone(UTC)
    step = timedelta(seconds=interval_seconds)
    return EPOCH + ((at - EPOCH) // step) * step

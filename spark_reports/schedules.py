"""When a schedule runs and which period it reports: plain functions of time
(no clock, no database).

A schedule runs at ``hour``:00 UTC -- daily every day, weekly on Mondays,
monthly on the 1st -- and reports the day, the Monday-to-Sunday week or the
calendar month that ended at midnight before.
"""

from datetime import UTC, date, datetime, timedelta

FREQUENCIES = ("daily", "weekly", "monthly")


def _occurrence_on(day: date, frequency: str) -> bool:
    if frequency == "daily":
        return True
    if frequency == "weekly":
        return day.weekday() == 0
    if frequency == "monthly":
        return day.day == 1
    raise ValueError(f"unknown frequency {frequency!r}")


def _at(day: date, hour: int) -> datetime:
    return datetime(day.year, day.month, day.day, hour, tzinfo=UTC)


def next_run(frequency: str, hour: int, after: datetime) -> datetime:
    """The first run strictly after ``after``."""
    day = after.astimezone(UTC).date()
    for _ in range(40):
        if _occurrence_on(day, frequency) and _at(day, hour) > after:
            return _at(day, hour)
        day += timedelta(days=1)
    raise AssertionError("unreachable")  # pragma: no cover


def latest_due(frequency: str, hour: int, now: datetime) -> datetime:
    """The last run at or before ``now``."""
    day = now.astimezone(UTC).date()
    for _ in range(40):
        if _occurrence_on(day, frequency) and _at(day, hour) <= now:
            return _at(day, hour)
        day -= timedelta(days=1)
    raise AssertionError("unreachable")  # pragma: no cover


def period_for(frequency: str, run_at: datetime) -> tuple[date, date]:
    """(first day, last day) reported by the run at ``run_at``."""
    today = run_at.astimezone(UTC).date()
    if frequency == "daily":
        day = today - timedelta(days=1)
        return day, day
    if frequency == "weekly":
        monday = today - timedelta(days=today.weekday())
        return monday - timedelta(days=7), monday - timedelta(days=1)
    if frequency == "monthly":
        last = today.replace(day=1) - timedelta(days=1)
        return last.replace(day=1), last
    raise ValueError(f"unknown frequency {frequency!r}")

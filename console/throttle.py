"""Login throttling: after ``LOGIN_FAILURE_LIMIT`` failures for a username, or
from an address, within ``LOGIN_FAILURE_WINDOW`` seconds, further attempts for
that username or from that address are refused -- the right password too --
until enough failures have aged out of the window.

Failures live in the database (``LoginFailure``), so every console process
counts the same ones. A refused attempt is not a new failure (waiting the
window out always works); a successful login clears the username's failures.
"""

import datetime as dt
import math

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from .models import LoginFailure


def limit() -> int:
    return max(1, int(getattr(settings, "LOGIN_FAILURE_LIMIT", 5)))


def _window() -> dt.timedelta:
    return dt.timedelta(seconds=int(getattr(settings, "LOGIN_FAILURE_WINDOW", 900)))


def _wait(failures: list, now) -> float:
    """Seconds until fewer than the limit of ``failures`` (oldest first) are in the window."""
    over = len(failures) - limit()
    if over < 0:
        return 0.0
    return max(0.0, (failures[over] + _window() - now).total_seconds())


def seconds_locked(username: str, remote_addr: str | None, now=None) -> float:
    """How long attempts for ``username`` / from ``remote_addr`` must wait (0: not locked)."""
    now = now or timezone.now()
    since = now - _window()
    recent = LoginFailure.objects.filter(at__gt=since)
    waits = [_wait(list(recent.filter(username=username.lower()).values_list("at", flat=True)), now)]
    if remote_addr:
        waits.append(_wait(list(recent.filter(remote_addr=remote_addr).values_list("at", flat=True)), now))
    return max(waits)


def record_failure(username: str, remote_addr: str | None, now=None) -> bool:
    """Count a failed login; True when this failure locked the username or the address."""
    now = now or timezone.now()
    LoginFailure.objects.create(username=username.lower(), remote_addr=remote_addr or "", at=now)
    # old rows are of no further use
    LoginFailure.objects.filter(at__lt=now - _window()).delete()
    return seconds_locked(username, remote_addr, now) > 0


def clear(username: str) -> None:
    LoginFailure.objects.filter(Q(username=username.lower())).delete()


def wait_text(seconds: float) -> str:
    """"3 minutes", "45 seconds" -- for "try again in ...")."""
    if seconds >= 90:
        minutes = math.ceil(seconds / 60)
        return f"{minutes} minutes"
    seconds = max(1, math.ceil(seconds))
    return f"{seconds} second{'s' if seconds != 1 else ''}"

"""Template helpers of every page: active navigation, numbers and times."""

import datetime as dt
import re

from django import template
from django.utils import timezone
from django.utils.timesince import timesince

from core.roles import is_platform_admin

register = template.Library()


@register.simple_tag(takes_context=True)
def active(context, *names):
    """"active" when the current URL's name is one of ``names``."""
    match = getattr(context.get("request"), "resolver_match", None)
    return "active" if match is not None and match.url_name in names else ""


@register.filter
def limit(value):
    return "unlimited" if value is None else f"{value:,}"


@register.filter
def count(value):
    if value is None or value == "":
        return "—"
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return value


def plural(n, noun: str, nouns: str | None = None) -> str:
    """"1 device", "2 devices", "1,204 devices" (``nouns``: an irregular plural)."""
    try:
        k = int(n or 0)
    except (TypeError, ValueError):
        return f"{n} {nouns or noun + 's'}"
    return f"{k:,} {noun if k == 1 else nouns or noun + 's'}"


@register.filter(name="plural")
def plural_filter(value, noun):
    """``{{ n|plural:"device" }}`` -> "1 device" / "3 devices"; ``"child,children"`` for an irregular one."""
    one, _, many = str(noun).partition(",")
    return plural(value, one, many or None)


@register.filter
def ago(value):
    """"just now" under a minute (timesince said "0 minutes ago"), else "5 minutes ago"."""
    if value is None:
        return "—"
    if (timezone.now() - value).total_seconds() < 60:
        return "just now"
    return f"{timesince(value)} ago"


@register.filter
def humanbytes(value):
    if value is None:
        return "—"
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return value


@register.filter
def duration(seconds):
    """``93784`` -> "1d 2h 3m"."""
    if seconds is None or seconds == "":
        return "—"
    seconds = int(float(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h {minutes}m"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


@register.filter
def unixtime(value):
    """Unix seconds (as the admin API gives them) -> an aware datetime."""
    if value in (None, ""):
        return None
    return dt.datetime.fromtimestamp(float(value), tz=dt.UTC)


@register.filter
def expired(value):
    return value is not None and value <= timezone.now()


@register.filter
def get(mapping, key):
    return mapping.get(key) if mapping else None


@register.filter
def label(name):
    return str(name).replace("_", " ")


# what the pages call the things the audit log names by type (the ACL page says "ACL rule 7" too)
OBJECT_KINDS = {"acl_rule": "ACL rule", "api_token": "API token", "report_schedule": "report schedule",
                "system_topics": "$SYS settings"}


@register.filter
def object_kind(object_type):
    """An audit row's object type as the pages name such objects."""
    return OBJECT_KINDS.get(str(object_type), str(object_type).replace("_", " "))


# a path or file URL in a failed job's reason: ``/var/lib/mqtthub/usage/lake/connections/.../part-0.parquet``
_PATH = re.compile(r"(?:\b[a-z][a-z0-9+.-]*:)?(?://[^/\s'\"]*)?(?:/[^/\s'\",;:()\[\]]+){2,}/?")
# and what is left of a URL naming a host: ``spark://10.0.0.5:7077``
_HOST = re.compile(r"\b([a-z][a-z0-9+.-]*)://[^\s'\"/]+")


@register.filter
def reason_for(reason, user):
    """A failed job's reason as ``user`` may read it: whole for a platform administrator; for a tenant's
    members each path or file URL cut to its last part and each URL's host left out (the file a job
    could not read is named; where the platform keeps its data, its hosts and mounts, are not theirs
    to see)."""
    if not reason or is_platform_admin(user):
        return reason
    text = _PATH.sub(lambda m: "…/" + m.group(0).rstrip("/").rsplit("/", 1)[-1], str(reason))
    return _HOST.sub(lambda m: m.group(1) + "://…", text)

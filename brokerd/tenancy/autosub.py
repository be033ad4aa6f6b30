"""A tenant's auto-subscribe rules (pure): which subscriptions a connecting
client gets without sending a SUBSCRIBE.

Each rule names the clients it is for (a device-name glob, as the ACL's
``pattern`` rules, or every client when it has none) and a filter with the
ACL's ``{device}`` / ``{client_id}`` placeholders. A placeholder whose value
is empty, holds ``+``, ``#`` or ``/`` (or starts with ``$`` in the first
level) makes the rule not apply to that client (``acl.expand``).
The broker then subscribes the client through its ordinary SUBSCRIBE path,
so the tenant's ACL, subscription quota, retained messages and session
persistence apply exactly as for a client's own SUBSCRIBE.
"""

from fnmatch import fnmatchcase

from .acl import expand


class AutoSub:
    __slots__ = ("id", "pattern", "filter", "qos", "no_local", "rap", "rh")

    def __init__(self, d: dict):
        self.id = int(d.get("id", 0))
        self.pattern = d.get("pattern") or None
        self.filter = str(d["filter"])
        self.qos = int(d.get("qos", 0))
        self.no_local = bool(d.get("no_local", False))
        self.rap = bool(d.get("rap", False))
        self.rh = int(d.get("rh", 0))
        if self.qos not in (0, 1, 2) or self.rh not in (0, 1, 2) or not self.filter:
            raise ValueError(f"auto-subscription {self.id}: invalid qos, retain handling or filter")


def compile_autosub(docs) -> tuple | None:
    """The snapshot's ``autosub`` list -> a tuple of AutoSub, or None when there are none."""
    out = tuple(AutoSub(d) for d in docs or () if isinstance(d, dict) and "filter" in d)
    return out or None


def for_client(entries, device: str | None, client_id: str) -> list:
    """[(AutoSub, concrete filter)] that apply to this client, in the rules' order."""
    out = []
    for e in entries:
        if e.pattern is not None and (device is None or not fnmatchcase(device, e.pattern)):
            continue
        filt = expand(e.filter, device or "", client_id)
        if filt is not None:
            out.append((e, filt))
    return out

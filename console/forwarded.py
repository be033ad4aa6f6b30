"""Which address a request comes from: the socket's peer, unless that peer is
a proxy named in ``TRUSTED_PROXIES``.

The login throttle (``console.throttle``) and the audit log key on the
client's address, so it must be one an attacker cannot choose. daphne's
``--proxy-headers`` takes the *leftmost* ``X-Forwarded-For`` entry from any
peer: a client talking to daphne directly (``make run``; the image serving
TLS itself) writes whatever address it likes there, and even behind a proxy
that appends to the header the leftmost entry is the client's own words. So
daphne runs without it and this ASGI wrapper decides instead, as uvicorn's
``--forwarded-allow-ips`` does:

- the peer is not a trusted proxy (the default: no proxies): the peer's
  address is the client's; forwarded headers are ignored;
- the peer is one: walk the hops of ``X-Forwarded-For`` (every such header,
  in order) from the right, skipping trusted proxies; the first address that
  is not one is the client's -- it was written by a proxy we trust. A hop
  that is not an IP address stops the walk at the last trusted hop. The
  nearest proxy's ``X-Forwarded-Proto`` (``http``/``https``) sets the scheme.

Django sees the result as ``REMOTE_ADDR``; websockets (Channels) as
``scope["client"]``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from django.core.exceptions import ImproperlyConfigured

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(values: Iterable[str]) -> tuple[Network, ...]:
    """``["10.0.0.5", "10.1.0.0/16", "::1"]`` -> networks; a bad entry stops the process."""
    out = []
    for value in values:
        try:
            out.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ImproperlyConfigured(f"TRUSTED_PROXIES: {value!r} is not an IP address or network") from None
    return tuple(out)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An address as proxies write it (``1.2.3.4``, ``1.2.3.4:5678``, ``[::1]:80``, ``::1``), or None."""
    text = text.strip().strip('"')
    if text.startswith("["):
        text = text[1:].split("]", 1)[0]
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def is_trusted(address, networks: tuple[Network, ...]) -> bool:
    ip = _ip(address) if isinstance(address, str) else address
    return ip is not None and any(ip in net for net in networks)


def client_address(peer: str, forwarded_for: list[str], networks: tuple[Network, ...]) -> str:
    """The client's address for a request from ``peer`` carrying these
    ``X-Forwarded-For`` header values (in the order received)."""
    if not is_trusted(peer, networks):
        return peer
    hops = [h for value in forwarded_for for h in value.split(",") if h.strip()]
    client = peer
    for hop in reversed(hops):
        ip = _ip(hop)
        if ip is None:
            return client                   # a trusted proxy passed on nonsense: stop at that proxy
        client = str(ip)
        if not is_trusted(ip, networks):
            return client
    return client                           # every hop a trusted proxy: the leftmost


def _headers(scope, name: bytes) -> list[str]:
    return [v.decode("latin-1") for k, v in scope.get("headers") or () if k.lower() == name]


class ForwardedFor:
    """ASGI wrapper: ``scope["client"]`` (and ``scheme``) as described above.
    ``trusted`` defaults to the ``TRUSTED_PROXIES`` setting (read per request,
    parsed once per value)."""

    def __init__(self, app, trusted: Iterable[str] | None = None):
        self.app = app
        self._fixed = None if trusted is None else parse_networks(trusted)
        self._parsed: tuple[tuple, tuple[Network, ...]] = ((), ())

    @property
    def networks(self) -> tuple[Network, ...]:
        if self._fixed is not None:
            return self._fixed
        from django.conf import settings

        value = tuple(getattr(settings, "TRUSTED_PROXIES", ()) or ())
        if value != self._parsed[0]:
            self._parsed = (value, parse_networks(value))
        return self._parsed[1]

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket") and scope.get("client"):
            networks = self.networks
            if networks and is_trusted(scope["client"][0], networks):
                scope = rewrite(scope, networks)
        return await self.app(scope, receive, send)


def rewrite(scope: dict, networks: tuple[Network, ...]) -> dict:
    """A request from a trusted proxy: the client and scheme it forwards."""
    peer, port = scope["client"][0], scope["client"][1]
    client = client_address(peer, _headers(scope, b"x-forwarded-for"), networks)
    scope = dict(scope, client=(client, port if client == peer else 0))
    proto = [p.strip().lower() for v in _headers(scope, b"x-forwarded-proto") for p in v.split(",")]
    if proto and proto[-1] in ("http", "https"):
        secure = proto[-1] == "https"
        scope["scheme"] = ("wss" if secure else "ws") if scope["type"] == "websocket" else proto[-1]
    return scope

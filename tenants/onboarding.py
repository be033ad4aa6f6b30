"""What a new device needs to connect: the broker's URLs, its user name and
ready-to-run examples (``mosquitto_sub``/``mosquitto_pub`` and a paho-mqtt
snippet). Plain Python, no Django: the views pass the URLs in (from
``MQTT_PUBLIC_URLS`` or the nodes' advertised listeners, ``GET
/api/v1/nodes``) and the templates escape what comes out.

The examples are text to paste into a shell or a Python file, so every value
in them is quoted for that language (``shlex.quote``, ``repr``) whatever it
holds. The secret is shown only on the page that issues it; elsewhere the
examples read it from ``$MQTT_PASSWORD`` (``PASSWORD_VARIABLE``).
"""

from __future__ import annotations

import shlex
import urllib.parse
from dataclasses import dataclass

SCHEMES = ("mqtt", "mqtts", "ws", "wss")            # the order the panel lists them in
LABELS = {"mqtt": "MQTT", "mqtts": "MQTTS (TLS)", "ws": "WebSocket", "wss": "WebSocket (TLS)"}
DEFAULT_PORTS = {"mqtt": 1883, "mqtts": 8883, "ws": 80, "wss": 443}
PASSWORD_VARIABLE = "MQTT_PASSWORD"
# what the examples publish to and subscribe to (the panel says whether the tenant's ACL lets them)
EXAMPLE_TOPIC = "{device}/hello"
EXAMPLE_FILTER = "{device}/#"
WILDCARD_HOSTS = ("", "0.0.0.0", "::")


def parse_url(url: str) -> tuple[str, str, int, str]:
    """``"mqtts://mqtt.example.com:8883"`` -> ``("mqtts", "mqtt.example.com", 8883, "")``;
    ValueError for anything a device could not connect to."""
    parts = urllib.parse.urlsplit(url.strip())
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{url!r}: {exc}") from None
    if parts.scheme not in SCHEMES:
        raise ValueError(f"{url!r}: the scheme must be one of {', '.join(SCHEMES)}")
    if (parts.hostname or "") in WILDCARD_HOSTS:
        raise ValueError(f"{url!r}: no host a device can reach")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ValueError(f"{url!r}: only scheme://host:port (and a path for ws/wss)")
    path = parts.path
    if parts.scheme in ("ws", "wss"):
        path = path or "/mqtt"
    elif path not in ("", "/"):
        raise ValueError(f"{url!r}: only ws:// and wss:// URLs take a path")
    else:
        path = ""
    return parts.scheme, parts.hostname, port or DEFAULT_PORTS[parts.scheme], path


def public_urls(value) -> list[str]:
    """The ``MQTT_PUBLIC_URLS`` setting (comma-separated, or a list) -> its URLs, checked, duplicates dropped."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    urls = []
    for item in (i.strip() for i in items):
        if item:
            try:
                parse_url(item)
            except ValueError as exc:
                raise ValueError(f"MQTT_PUBLIC_URLS: {exc}") from None
            if item not in urls:
                urls.append(item)
    return urls


def advertised_urls(nodes: list[dict]) -> list[str]:
    """The MQTT URLs the cluster's live nodes advertise (``GET /api/v1/nodes``: each node's
    ``mqtt``), duplicates and unreachable ones (a wildcard host) dropped."""
    urls = []
    for node in nodes:
        if node.get("health") != "ok":
            continue
        for url in node.get("mqtt") or ():
            try:
                parse_url(url)
            except ValueError:
                continue
            if url not in urls:
                urls.append(url)
    return urls


@dataclass(frozen=True)
class Endpoint:
    scheme: str
    label: str
    urls: tuple[str, ...]


def endpoints(urls: list[str]) -> list[Endpoint]:
    """The URLs by scheme, in ``SCHEMES`` order (one row of the panel each)."""
    by_scheme: dict[str, list[str]] = {}
    for url in urls:
        by_scheme.setdefault(parse_url(url)[0], []).append(url)
    return [Endpoint(s, LABELS[s], tuple(by_scheme[s])) for s in SCHEMES if s in by_scheme]


def example_url(urls: list[str]) -> str | None:
    """The URL the examples use: TLS first, TCP before WebSocket (mosquitto's clients speak no WebSocket)."""
    for scheme in ("mqtts", "mqtt", "wss", "ws"):
        for url in urls:
            if parse_url(url)[0] == scheme:
                return url
    return None


def example_topics(device: str) -> tuple[str, str]:
    """(the topic the examples publish to, the filter they subscribe to) for ``device``."""
    return EXAMPLE_TOPIC.format(device=device), EXAMPLE_FILTER.format(device=device)


def mosquitto(url: str, username: str, secret: str | None, device: str) -> dict | None:
    """``{"sub": ..., "pub": ...}``: shell commands for ``url``; None for a WebSocket URL."""
    scheme, host, port, _ = parse_url(url)
    if scheme not in ("mqtt", "mqtts"):
        return None
    password = shlex.quote(secret) if secret is not None else f'"${PASSWORD_VARIABLE}"'
    common = f"-h {shlex.quote(host)} -p {port}"
    if scheme == "mqtts":
        common += " --capath /etc/ssl/certs"
    common += f" -u {shlex.quote(username)} -P {password}"
    topic, topic_filter = example_topics(device)
    return {"sub": f"mosquitto_sub {common} -t {shlex.quote(topic_filter)} -v",
            "pub": f"mosquitto_pub {common} -t {shlex.quote(topic)} "
                   f"-m {shlex.quote('hello from ' + device)} -q 1"}


def paho(url: str, username: str, secret: str | None, device: str) -> str:
    """A paho-mqtt (2.x) program that connects as the device and publishes one message."""
    scheme, host, port, path = parse_url(url)
    websocket = scheme in ("ws", "wss")
    lines = ["import paho.mqtt.client as mqtt  # pip install 'paho-mqtt>=2'"]
    if secret is None:
        lines[0:0] = ["import os"]
        password = f"os.environ[{PASSWORD_VARIABLE!r}]"
    else:
        password = repr(secret)
    transport = ', transport="websockets"' if websocket else ""
    lines += ["", f"client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id={device!r}{transport})",
              f"client.username_pw_set({username!r}, {password})"]
    if websocket:
        lines.append(f"client.ws_set_options(path={path!r})")
    if scheme in ("mqtts", "wss"):
        lines.append("client.tls_set()  # the system's CAs; tls_set(ca_certs='ca.crt') for a private CA")
    lines += [f"client.connect({host!r}, {port})",
              "client.loop_start()",
              f"client.publish({example_topics(device)[0]!r}, {'hello from ' + device!r}, qos=1).wait_for_publish()",
              "client.disconnect()",
              "client.loop_stop()"]
    return "\n".join(lines)


def connect_panel(urls: list[str], username: str, device: str, secret: str | None = None) -> dict:
    """What the "Connect this device" panel shows: ``endpoints``, the ``url`` the
    examples use, ``mosquitto`` (sub/pub, or None) and ``paho``; with no URL known,
    only the user name (the examples need a host)."""
    url = example_url(urls)
    panel = {"endpoints": endpoints(urls), "url": url, "username": username, "secret_shown": secret is not None,
             "password_variable": PASSWORD_VARIABLE, "mosquitto": None, "paho": None}
    if url is not None:
        panel["mosquitto"] = mosquitto(url, username, secret, device)
        panel["paho"] = paho(url, username, secret, device)
    return panel

"""A synchronous test client over paho-mqtt (2.x): connect, subscribe,
publish and collect messages with timeouts, for MQTT 3.1.1 and 5.0.

    c = PahoClient("dev1", version=5).connect(broker.port())
    c.subscribe("a/#", qos=1)
    c.publish("a/b", b"x", qos=1)
    msg = c.expect()           # next message or AssertionError after a timeout
"""

import queue
import socket
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

V311 = mqtt.MQTTv311
V5 = mqtt.MQTTv5
V31 = mqtt.MQTTv31

TIMEOUT = 5.0


def props(packet_type, **values) -> Properties:
    """``props(PacketTypes.PUBLISH, MessageExpiryInterval=10, UserProperty=[("k", "v")])``."""
    p = Properties(packet_type)
    for key, value in values.items():
        setattr(p, key, value)
    return p


class PahoClient:
    def __init__(self, client_id: str = "", version: int = V311, clean: bool = True, transport: str = "tcp",
                 username: str | None = None, password: str | None = None, userdata=None):
        self.version = version
        self.clean = clean
        kwargs = {"client_id": client_id, "protocol": version, "transport": transport, "userdata": userdata}
        if version != V5:
            kwargs["clean_session"] = clean
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, **kwargs)
        if username is not None:
            self.client.username_pw_set(username, password)
        self.messages: queue.Queue = queue.Queue()
        self.connack: queue.Queue = queue.Queue()
        self.subacks: dict[int, list] = {}
        self.unsubacks: dict[int, list] = {}
        self.disconnects: queue.Queue = queue.Queue()
        self._cv = threading.Condition()
        self._last_flags = None
        self.disconnected_at: float | None = None    # time.monotonic() of the last disconnect
        c = self.client
        c.on_connect = self._on_connect
        c.on_message = self._on_message
        c.on_subscribe = self._on_subscribe
        c.on_unsubscribe = self._on_unsubscribe
        c.on_disconnect = self._on_disconnect

    # -- callbacks
    def _on_connect(self, client, userdata, flags, reason_code, properties):
        self.connack.put((flags, reason_code, properties))

    def _on_message(self, client, userdata, msg):
        self.messages.put(msg)

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties):
        with self._cv:
            self.subacks[mid] = reason_codes
            self._cv.notify_all()

    def _on_unsubscribe(self, client, userdata, mid, reason_codes, properties):
        with self._cv:
            self.unsubacks[mid] = reason_codes
            self._cv.notify_all()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties):
        self.disconnected_at = time.monotonic()
        self.disconnects.put((reason_code, properties))

    # -- actions
    def connect(self, port: int, host: str = "127.0.0.1", keepalive: int = 60, properties=None,
                will: tuple | None = None, wait: bool = True, clean_start=None) -> "PahoClient":
        """Connect and wait for the CONNACK; raises if it is a refusal (unless wait=False)."""
        if will is not None:
            self.client.will_set(*will)
        kwargs = {"keepalive": keepalive}
        if self.version == V5:
            kwargs["clean_start"] = self.clean if clean_start is None else clean_start
            kwargs["properties"] = properties
        self.client.connect(host, port, **kwargs)
        self.client.loop_start()
        if wait:
            flags, rc, p = self.connack_result()
            self._last_flags = flags
            if rc.is_failure:
                # paho's network thread would otherwise keep reconnecting in the background with
                # this client id (a refused device taking a quota place the test frees for another)
                self.client.disconnect()
                self.client.loop_stop()
                raise ConnectionError(f"CONNACK refused: {rc} ({rc.value:#x})")
        return self

    def connack_result(self, timeout: float = TIMEOUT):
        try:
            return self.connack.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no CONNACK")

    @property
    def session_present(self) -> bool:
        return self._last_flags.session_present

    def subscribe(self, topic, qos: int = 0, options=None, properties=None, timeout: float = TIMEOUT) -> list:
        """Subscribe and return the SUBACK reason codes."""
        if self.version == V5:
            if options is None:
                options = mqtt.SubscribeOptions(qos=qos)
            result, mid = self.client.subscribe(topic, options=options, properties=properties)
        else:
            result, mid = self.client.subscribe(topic, qos)
        assert result == mqtt.MQTT_ERR_SUCCESS, result
        return self._wait(self.subacks, mid, timeout)

    def unsubscribe(self, topic, properties=None, timeout: float = TIMEOUT) -> list:
        if self.version == V5:
            result, mid = self.client.unsubscribe(topic, properties=properties)
        else:
            result, mid = self.client.unsubscribe(topic)
        assert result == mqtt.MQTT_ERR_SUCCESS, result
        return self._wait(self.unsubacks, mid, timeout)

    def _wait(self, table, mid, timeout):
        deadline = time.monotonic() + timeout
        with self._cv:
            while mid not in table:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no acknowledgement for packet {mid}")
                self._cv.wait(left)
            return table.pop(mid)

    def publish(self, topic, payload=b"", qos: int = 0, retain: bool = False, properties=None,
                wait: bool = True, timeout: float = TIMEOUT):
        info = self.client.publish(topic, payload, qos, retain, properties)
        if wait and qos:
            info.wait_for_publish(timeout)
            assert info.is_published(), f"PUBLISH to {topic} not acknowledged"
        return info

    def expect(self, timeout: float = TIMEOUT):
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no message arrived")

    def expect_n(self, n: int, timeout: float = TIMEOUT) -> list:
        deadline = time.monotonic() + timeout
        out = []
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{len(out)} of {n} messages arrived")
            try:
                out.append(self.messages.get(timeout=left))
            except queue.Empty:
                continue
        return out

    def expect_none(self, timeout: float = 0.5):
        try:
            msg = self.messages.get(timeout=timeout)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message on {msg.topic}: {msg.payload!r}")

    def expect_disconnect(self, timeout: float = TIMEOUT):
        try:
            return self.disconnects.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("client was not disconnected")

    def disconnect(self, reasoncode=None, properties=None):
        if self.version == V5:
            self.client.disconnect(reasoncode=reasoncode, properties=properties)
        else:
            self.client.disconnect()
        self.client.loop_stop()

    def drop(self, at_once: bool = False):
        """Close the socket without DISCONNECT (as a network failure would). paho's loop stops
        only once what it sent is acknowledged: ``at_once`` shuts the socket first, for a
        client whose acknowledgements the broker holds back (a rate limit's debt)."""
        sock = self.client.socket()
        if at_once and sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
        self.client.loop_stop()
        if sock is not None:
            sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.client.disconnect()
        finally:
            self.client.loop_stop()


__all__ = ["V5", "V31", "V311", "PacketTypes", "PahoClient", "props"]

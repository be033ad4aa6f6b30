"""The $SYS/broker/... tree: published on --sys-interval, retained, values that move with traffic."""

import threading
import time

import pytest

from .helpers import V5, V311, Client, MosqSub, connect, mosq_pub

REQUIRED = [
    "version", "uptime", "clients/connected", "clients/total", "clients/maximum", "clients/disconnected",
    "messages/received", "messages/sent", "bytes/received", "bytes/sent", "subscriptions/count",
    "retained messages/count", "load/messages/received/1min", "load/messages/sent/1min",
    "load/bytes/received/1min", "load/bytes/sent/5min", "load/connections/15min",
]


class SysWatcher:
    """Keeps the latest value of every $SYS/broker/ topic and the time each was last published."""

    def __init__(self, port, client_id):
        self.values: dict[str, str] = {}
        self.stamps: dict[str, list[float]] = {}
        self.cv = threading.Condition()
        self.c = Client(client_id, V311)
        self.c.client.on_message = self._on_message
        self.c.connect(port)
        self.c.subscribe("$SYS/broker/#", 0)

    def _on_message(self, client, userdata, msg):
        key = msg.topic[len("$SYS/broker/"):]
        with self.cv:
            self.values[key] = msg.payload.decode()
            self.stamps.setdefault(key, []).append(time.monotonic())
            self.cv.notify_all()

    def int(self, key) -> int:
        return int(self.values[key].split()[0])

    def wait(self, predicate, timeout=4.0, what="$SYS condition"):
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                try:
                    if predicate(self):
                        return
                except (KeyError, ValueError):
                    pass
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{what} not met; values: {self.values}")
                self.cv.wait(left)

    def next_publication(self, key="uptime", timeout=3.0) -> None:
        with self.cv:
            n = len(self.stamps.get(key, []))
        self.wait(lambda s: len(s.stamps.get(key, [])) > n, timeout, f"new {key}")

    def close(self):
        self.c.disconnect()


@pytest.fixture
def sysw(broker, client_id):
    w = SysWatcher(broker.port(), client_id + "-sys")
    w.wait(lambda s: all(k in s.values for k in REQUIRED), what="all $SYS topics")
    yield w
    w.close()


def test_sys_tree_has_the_mosquitto_topics(sysw):
    assert sysw.values["version"].startswith("brokerd version ")
    assert sysw.values["uptime"].endswith(" seconds")
    for key in REQUIRED:
        assert key in sysw.values
    for key in ("clients/connected", "clients/total", "messages/received", "bytes/sent", "subscriptions/count",
                "retained messages/count"):
        assert sysw.int(key) >= 0
    float(sysw.values["load/messages/received/1min"])


def test_sys_values_are_retained(broker, client_id):
    with connect(broker.port(), client_id, V5) as late:
        late.subscribe("$SYS/broker/version", 0)
        m = late.expect(timeout=1)
        assert m.retain and m.payload.startswith(b"brokerd version")


def test_sys_published_on_the_interval(sysw):
    """--sys-interval 1: a new publication about every second, uptime increasing."""
    sysw.next_publication()
    t1, u1 = sysw.stamps["uptime"][-1], sysw.int("uptime")
    sysw.next_publication()
    t2, u2 = sysw.stamps["uptime"][-1], sysw.int("uptime")
    assert 0.6 <= t2 - t1 <= 2.0
    assert u2 >= u1


def test_client_counts_move(broker, sysw, client_id):
    sysw.next_publication()
    base = sysw.int("clients/connected")
    total = sysw.int("clients/total")
    extra = [connect(broker.port(), f"{client_id}-{i}", V311) for i in range(3)]
    sysw.wait(lambda s: s.int("clients/connected") >= base + 3 and s.int("clients/total") >= total + 3
              and s.int("clients/maximum") >= base + 3, what="connected, total, maximum +3")
    for c in extra:
        c.disconnect()
    sysw.wait(lambda s: s.int("clients/connected") <= base, what="connected back down")


def test_persistent_session_counts_as_disconnected_client(broker, sysw, client_id):
    c = connect(broker.port(), client_id, V311, clean=False)
    c.disconnect()
    sysw.next_publication()
    sysw.wait(lambda s: s.int("clients/disconnected") >= 1, what="disconnected session")
    connect(broker.port(), client_id, V311, clean=True).disconnect()


def test_message_and_byte_counters_move(broker, sysw, client_id, topic):
    sysw.next_publication()
    before = {k: sysw.int(k) for k in ("messages/received", "messages/sent", "bytes/received", "bytes/sent")}
    with connect(broker.port(), client_id + "s", V311) as sub, connect(broker.port(), client_id + "p", V311) as pub:
        sub.subscribe(topic, 1)
        for _ in range(20):
            pub.publish(topic, b"x" * 100, qos=1)
        sub.expect_n(20)
    sysw.wait(lambda s: s.int("messages/received") >= before["messages/received"] + 20
              and s.int("messages/sent") >= before["messages/sent"] + 20
              and s.int("bytes/received") >= before["bytes/received"] + 2000
              and s.int("bytes/sent") >= before["bytes/sent"] + 2000, what="counters +20 messages")
    sysw.wait(lambda s: float(s.values["load/messages/received/1min"]) > 0, what="load average")


def test_subscription_and_retained_counts_move(broker, sysw, client_id, topic):
    # a round's count is taken before its own values are retained, and the load figures are first
    # published in the second round: the count of a round after the fixture's includes every $SYS topic
    sysw.next_publication("retained messages/count")
    subs = sysw.int("subscriptions/count")
    kept = sysw.int("retained messages/count")
    with connect(broker.port(), client_id, V311) as c:
        for i in range(3):
            c.subscribe(f"{topic}/{i}", 0)
        for i in range(2):
            c.publish(f"{topic}/r{i}", b"keep", qos=1, retain=True)
        sysw.wait(lambda s: s.int("subscriptions/count") >= subs + 3
                  and s.int("retained messages/count") >= kept + 2, what="subs +3, retained +2")
        for i in range(2):
            c.publish(f"{topic}/r{i}", b"", qos=1, retain=True)
    sysw.wait(lambda s: s.int("subscriptions/count") <= subs
              and s.int("retained messages/count") <= kept, what="counts back down")


def test_sys_with_mosquitto_sub(broker):
    sub = MosqSub(broker.port(), "$SYS/broker/version", count=1, wait=5).start(expect_suback=False)
    assert sub.messages(1)[0]["payload"].startswith("brokerd version")
    assert sub.wait() == 0


def test_clients_cannot_spoof_sys_values_for_others(broker, client_id):
    """Publishing to $SYS/broker/... from a client does not stop the broker's own values."""
    mosq_pub(broker.port(), "$SYS/broker/version", "fake", retain=True)
    with connect(broker.port(), client_id, V311) as c:
        c.subscribe("$SYS/broker/version", 0)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            if c.expect(timeout=2).payload.startswith(b"brokerd version"):
                break
        else:
            raise AssertionError("broker's own $SYS value did not come back")


def test_sys_interval_zero_disables(broker_factory, client_id):
    b = broker_factory("--sys-interval", "0")
    with connect(b.port(), client_id, V311) as c:
        c.subscribe("$SYS/#", 0)
        c.expect_none(1.2)


def test_clients_cannot_write_into_sys(broker, client_id):
    """No client publishes into the broker's $SYS tree, as Mosquitto refuses it: with an open ACL (the
    anonymous clients here) a retained "$SYS/broker/version" of "fake" went to every subscriber and
    stood as the broker's value until the next round, and "$SYS/anything" was retained for good."""
    with connect(broker.port(), client_id + "-sub", V5) as sub, connect(broker.port(), client_id, V5) as pub:
        sub.subscribe("$SYS/broker/version", 0)
        sub.expect(timeout=3)                                  # the broker's retained value
        sub.subscribe(f"$SYS/{client_id}/#", 0)
        codes = [pub.publish_result(pub.publish(topic, b"fake", qos=1, retain=True))[0].value
                 for topic in ("$SYS/broker/version", f"$SYS/{client_id}/x", f"$SYS/{client_id}/y")]
        assert codes == [0x87] * 3                             # Not authorized
        deadline = time.monotonic() + 1.5                      # (more than one --sys-interval round)
        while time.monotonic() < deadline:
            m = sub.expect(timeout=2)
            assert m.payload.startswith(b"brokerd version"), (m.topic, m.payload)
    with connect(broker.port(), client_id + "-late", V311) as late:
        late.subscribe(f"$SYS/{client_id}/#", 0)
        late.expect_none(0.5)                                   # nothing of the client's was retained


@pytest.mark.parametrize("version", [V5, V311])
def test_a_will_into_sys_is_refused_at_connect(broker, client_id, version):
    """An anonymous client's will on a $SYS topic was accepted at CONNECT and
    dropped without a word when its connection failed (no client writes into
    $SYS); as Mosquitto, the CONNECT is refused (5.0: 0x87, 3.1.1: 5) and the
    client knows."""
    with pytest.raises(ConnectionError, match="0x87"):             # (paho: 3.1.1's 5 as 0x87)
        Client(client_id, version).connect(broker.port(), will=(f"$SYS/{client_id}/gone", b"x", 1))
    with connect(broker.port(), client_id, version, will=(f"{client_id}/gone", b"x", 1)) as ok:
        assert ok.client.is_connected()

"""What a persistent session keeps across a SIGKILL of brokerd (SQLite store).

Each test starts a real brokerd on a fresh store file, builds some state with
real clients, kills the process with SIGKILL, starts a new one on the same
file and checks what the clients see.
"""

import time

import pytest

from ..integration import raw
from ..integration.raw import PUBLISH, RawClient
from ..mqtt import V5, V311, PacketTypes, PahoClient, props
from ..procs import BrokerProcess


@pytest.fixture
def store(tmp_path):
    return f"sqlite:///{tmp_path}/brokerd.db"


def node(store, *flags):
    return BrokerProcess("--store", store, "--sys-interval", "0", *flags).start()


def session_props(seconds=3600):
    return props(PacketTypes.CONNECT, SessionExpiryInterval=seconds)


def test_retained_messages_survive_sigkill(store):
    b = node(store)
    with PahoClient("ret-pub").connect(b.port()) as pub:
        pub.publish("ret/a", b"kept", qos=1, retain=True)
        pub.publish("ret/b", b"replaced", qos=1, retain=True)
        pub.publish("ret/b", b"latest", qos=1, retain=True)
        pub.publish("ret/c", b"gone", qos=1, retain=True)
        pub.publish("ret/c", b"", qos=1, retain=True)           # cleared
    b.kill()
    b = node(store)
    try:
        with PahoClient("ret-sub").connect(b.port()) as sub:
            sub.subscribe("ret/#", qos=1)
            got = {m.topic: (m.payload, m.retain) for m in sub.expect_n(2)}
            sub.expect_none(0.5)
        assert got == {"ret/a": (b"kept", True), "ret/b": (b"latest", True)}
    finally:
        b.stop()


def test_subscriptions_survive_sigkill(store):
    b = node(store)
    sub = PahoClient("subs-dev", V311, clean=False).connect(b.port())
    sub.subscribe("cmd/+/set", qos=1)
    sub.subscribe("cmd/all", qos=0)
    sub.subscribe("cmd/drop", qos=1)
    sub.unsubscribe("cmd/drop")
    sub.disconnect()
    b.kill()
    b = node(store)
    try:
        sub = PahoClient("subs-dev", V311, clean=False).connect(b.port())
        assert sub.session_present
        with PahoClient("subs-pub").connect(b.port()) as pub:
            pub.publish("cmd/lamp/set", b"on", qos=1)
            pub.publish("cmd/all", b"hello", qos=0)
            pub.publish("cmd/drop", b"no", qos=1)
        got = sorted((m.topic, m.payload, m.qos) for m in sub.expect_n(2))
        sub.expect_none(0.5)
        assert got == [("cmd/all", b"hello", 0), ("cmd/lamp/set", b"on", 1)]
        sub.disconnect()
    finally:
        b.stop()


def test_inflight_message_redelivered_with_dup_and_same_packet_id(store):
    """A QoS 1 message sent but not acknowledged before the crash comes back
    with DUP set and its original packet identifier ([MQTT-4.4.0-1])."""
    b = node(store)
    with RawClient(b.port()) as dev:
        dev.connect("dup-dev", version=4, clean=False)
        dev.subscribe("dup/t", 1)
        with PahoClient("dup-pub").connect(b.port()) as pub:
            pub.publish("dup/t", b"once", qos=1)
        first = dev.expect(PUBLISH)               # not acknowledged
        assert not first.dup
        b.kill()
    b = node(store)
    try:
        with RawClient(b.port()) as dev:
            dev.connect("dup-dev", version=4, clean=False)
            again = dev.expect(PUBLISH)
            assert (again.payload, again.dup, again.pid) == (b"once", True, first.pid)
            dev.ack(raw.PUBACK, again.pid)
    finally:
        b.stop()


@pytest.mark.parametrize("backend", ["sqlite", "hbase"])
def test_queued_messages_never_sent_come_after_restart_without_dup(backend, store, request):
    """A message sent and not acknowledged before the client went away comes back
    after a SIGKILL with DUP and its packet id; the messages queued while it was
    away were never sent, so they come as first deliveries, DUP 0 ([MQTT-3.3.1-1]:
    DUP only on a re-delivery). Was: every restored queue entry was sent with DUP."""
    if backend == "hbase":
        store = request.getfixturevalue("hbase_url")
    b = node(store)
    try:
        with RawClient(b.port()) as dev:
            dev.connect("nodup-dev", version=4, clean=False)
            dev.subscribe("nodup/t", 1)
            with PahoClient("nodup-pub").connect(b.port()) as pub:
                pub.publish("nodup/t", b"sent", qos=1)
            first = dev.expect(PUBLISH)               # not acknowledged
            assert not first.dup
            dev.disconnect()
        time.sleep(0.5)                              # the broker has seen the client go
        with PahoClient("nodup-pub").connect(b.port()) as pub:
            pub.publish("nodup/t", b"queued-1", qos=1)
            pub.publish("nodup/t", b"queued-2", qos=1)
    finally:
        b.kill()
    b = node(store)
    try:
        with RawClient(b.port()) as dev:
            dev.connect("nodup-dev", version=4, clean=False)
            got = [dev.expect(PUBLISH) for _ in range(3)]
            assert [(p.payload, p.dup) for p in got] == [(b"sent", True), (b"queued-1", False),
                                                         (b"queued-2", False)]
            assert got[0].pid == first.pid
            for p in got:
                dev.ack(raw.PUBACK, p.pid)
    finally:
        b.stop()


def test_qos2_exactly_once_across_sigkill(store):
    """The incoming QoS 2 packet id is durable before PUBREC: after a crash, the
    publisher's PUBREL completes the flow and its re-sent PUBLISH (same id)
    is not delivered twice."""
    b = node(store)
    sub = PahoClient("q2-sub", V311, clean=False).connect(b.port())
    sub.subscribe("q2/t", qos=2)
    sub.disconnect()
    with RawClient(b.port()) as pub:
        pub.connect("q2-pub", version=4, clean=False)
        pub.publish("q2/t", b"exactly-once", qos=2, pid=7)
        rec = pub.expect(raw.PUBREC)
        assert rec.pid == 7
        b.kill()
    b = node(store)
    try:
        with RawClient(b.port()) as pub:
            pub.connect("q2-pub", version=4, clean=False)
            pub.publish("q2/t", b"exactly-once", qos=2, pid=7, dup=True)   # as if PUBREC was lost
            assert pub.expect(raw.PUBREC).pid == 7
            pub.ack(raw.PUBREL, 7)
            assert pub.expect(raw.PUBCOMP).pid == 7
        sub = PahoClient("q2-sub", V311, clean=False).connect(b.port())
        assert sub.expect().payload == b"exactly-once"
        sub.expect_none(0.7)
        sub.disconnect()
    finally:
        b.stop()


def test_session_expiry_applies_to_stored_sessions(store):
    b = node(store)
    c = PahoClient("exp-dev", V5, clean=False).connect(b.port(), properties=session_props(2))
    c.subscribe("exp/t", qos=1)
    c.disconnect()
    time.sleep(0.3)        # the disconnect time is written behind; a kill right away keeps the session longer
    b.kill()
    time.sleep(2.5)
    b = node(store)
    try:
        c = PahoClient("exp-dev", V5, clean=False).connect(b.port(), properties=session_props(60))
        assert not c.session_present
        c.disconnect()
    finally:
        b.stop()


def test_message_expiry_applies_to_stored_queue(store):
    b = node(store)
    c = PahoClient("mexp-dev", V5, clean=False).connect(b.port(), properties=session_props())
    c.subscribe("mexp/t", qos=1)
    c.disconnect()
    with PahoClient("mexp-pub", V5).connect(b.port()) as pub:
        pub.publish("mexp/t", b"short", qos=1, properties=props(PacketTypes.PUBLISH, MessageExpiryInterval=1))
        pub.publish("mexp/t", b"long", qos=1, properties=props(PacketTypes.PUBLISH, MessageExpiryInterval=300))
    b.kill()
    time.sleep(1.5)
    b = node(store)
    try:
        c = PahoClient("mexp-dev", V5, clean=False).connect(b.port(), properties=session_props())
        m = c.expect()
        assert m.payload == b"long"
        assert 290 <= m.properties.MessageExpiryInterval <= 300
        c.expect_none(0.5)
        c.disconnect()
    finally:
        b.stop()


def test_queue_bound_applies_to_stored_queue(store):
    """--max-queued 3 with the drop policy: the dropped messages are gone from
    the store too, so a restart does not bring them back."""
    b = node(store, "--max-queued", "3")
    c = PahoClient("bound-dev", V311, clean=False).connect(b.port())
    c.subscribe("bound/t", qos=1)
    c.disconnect()
    with PahoClient("bound-pub").connect(b.port()) as pub:
        for i in range(6):
            pub.publish("bound/t", b"%d" % i, qos=1)
    b.kill()
    b = node(store, "--max-queued", "3")
    try:
        c = PahoClient("bound-dev", V311, clean=False).connect(b.port())
        got = [m.payload for m in c.expect_n(3)]
        c.expect_none(0.5)
        assert got == [b"3", b"4", b"5"]
        c.disconnect()
    finally:
        b.stop()


def test_will_of_client_connected_at_crash_is_published_after_restart(store):
    """The node died with the client connected: its network connection is gone,
    so its will is published when the node comes back."""
    b = node(store)
    watcher = PahoClient("will-watch", V311, clean=False).connect(b.port())
    watcher.subscribe("will/status", qos=1)
    watcher.disconnect()
    dev = PahoClient("will-dev", V311, clean=False)
    dev.connect(b.port(), will=("will/status", b"offline", 1, False))
    time.sleep(0.3)        # the session record (with its will) is written behind the CONNACK
    b.kill()
    dev.drop()
    b = node(store)
    try:
        watcher = PahoClient("will-watch", V311, clean=False).connect(b.port())
        assert watcher.expect().payload == b"offline"
        watcher.disconnect()
    finally:
        b.stop()


def test_clean_shutdown_then_restart_keeps_everything(store):
    b = node(store)
    c = PahoClient("clean-dev", V311, clean=False).connect(b.port())
    c.subscribe("clean/t", qos=1)
    c.disconnect()
    with PahoClient("clean-pub").connect(b.port()) as pub:
        for i in range(50):
            pub.publish("clean/t", b"%d" % i, qos=1)
    assert b.stop() == 0
    b = node(store)
    try:
        c = PahoClient("clean-dev", V311, clean=False).connect(b.port())
        assert [m.payload for m in c.expect_n(50)] == [b"%d" % i for i in range(50)]
        c.disconnect()
    finally:
        b.stop()


def test_unwritable_store_path_is_a_clear_startup_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = BrokerProcess("--store", f"sqlite:///{blocker}/sub/brokerd.db")
    with pytest.raises(RuntimeError) as exc:
        proc.start()
    assert "cannot open the session store" in str(exc.value)


def _unsubscribe_packet(pid: int, topic: str) -> bytes:
    body = pid.to_bytes(2, "big") + len(topic).to_bytes(2, "big") + topic.encode()
    return bytes([0xA2, len(body)]) + body


def test_an_unsuback_means_the_unsubscribe_survives_a_sigkill(hbase_url, hbase_double):
    """A SUBSCRIBE and an UNSUBSCRIBE of the same filter back to back, on a store whose every call takes
    0.3 s: the unsubscribe is written in the batch after the subscribe's. Killed the moment the
    UNSUBACK arrives, the node must have stored it (it was sent before, and the subscription came back)."""
    b = node(hbase_url)
    try:
        with RawClient(b.port()) as dev:
            dev.connect("unsub-dev", version=4, clean=False)
            dev.subscribe("u/keep", 1)
            hbase_double.control("latency", "300")
            try:
                dev.send(raw.subscribe_packet(2, [("u/drop", 1)], 4))
                dev.send(_unsubscribe_packet(3, "u/drop"))
                dev.expect(raw.SUBACK, timeout=10)
                dev.expect(raw.UNSUBACK, timeout=10)
                b.kill()
            finally:
                hbase_double.control("latency", "0")
    finally:
        b.kill()
    b = node(hbase_url)
    try:
        sub = PahoClient("unsub-dev", V311, clean=False).connect(b.port())
        assert sub.session_present
        with PahoClient("unsub-pub").connect(b.port()) as pub:
            pub.publish("u/drop", b"no", qos=1)
            pub.publish("u/keep", b"yes", qos=1)
        assert [(m.topic, m.payload) for m in sub.expect_n(1)] == [("u/keep", b"yes")]
        sub.expect_none(0.5)
        sub.disconnect()
    finally:
        b.stop()


def _take_all(dev, wait=1.0) -> list:
    """Every PUBLISH the node sends, acknowledged: [(payload, dup)]."""
    got = []
    while True:
        try:
            p = dev.expect(PUBLISH, timeout=wait)
        except Exception:
            return got
        got.append((p.payload, p.dup))
        dev.ack(raw.PUBACK, p.pid)


@pytest.mark.parametrize("how", ["disconnected", "connected"])
def test_a_restart_drops_no_unacknowledged_delivery_for_the_queue_bound(store, how):
    """--max-queued 3: messages sent to the subscriber and not acknowledged are in its window, not
    in its queue, and a full queue does not push them out. A restart put them into the queue with
    the rest, and the bound dropped the oldest -- messages the publisher had been acknowledged and
    that the node, had it not restarted, would have sent again. Now they come back, with DUP."""
    flags = ("--max-queued", "3", "--max-inflight", "2")
    b = node(store, *flags)
    try:
        dev = RawClient(b.port())
        dev.connect("window-dev", version=4, clean=False)
        dev.subscribe("window/t", 1)
        with PahoClient("window-pub").connect(b.port()) as pub:
            pub.publish("window/t", b"a", qos=1)
            pub.publish("window/t", b"b", qos=1)
            assert [dev.expect(PUBLISH).payload for _ in range(2)] == [b"a", b"b"]    # not acknowledged
            if how == "disconnected":
                dev.disconnect()
                dev.close()
                time.sleep(0.5)                  # the broker has seen the client go
            for payload in (b"c", b"d", b"e"):
                pub.publish("window/t", payload, qos=1)
        time.sleep(0.3)
    finally:
        b.kill()
    dev.close()
    b = node(store, *flags)
    try:
        with RawClient(b.port()) as dev:
            dev.connect("window-dev", version=4, clean=False)
            got = _take_all(dev)
        assert [p for p, _ in got] == [b"a", b"b", b"c", b"d", b"e"]
        assert got[0][1] and got[1][1]
        if how == "disconnected":
            assert [dup for _, dup in got[2:]] == [False, False, False]
    finally:
        b.stop()


def test_what_a_session_expired_while_the_node_was_down_owed_a_shared_group_goes_to_another_member(store):
    """Two persistent members of $share/g, offline, one with Session Expiry 2 s; four QoS 1
    messages, two queued for each. A running node gives the expired member's two to the other
    member when its session ends; a node that was down when it expired deleted the session with
    them at restart -- messages acknowledged to their publisher, lost with a member still there."""
    b = node(store)
    try:
        for cid, expiry in (("share-keep", 3600), ("share-short", 2)):
            c = PahoClient(cid, V5, clean=False).connect(b.port(), properties=session_props(expiry))
            c.subscribe("$share/g/share/t", qos=1)
            c.disconnect()
        with PahoClient("share-pub", V5).connect(b.port()) as pub:
            for i in range(4):
                pub.publish("share/t", b"%d" % i, qos=1)
        time.sleep(0.3)            # the disconnect times are written behind
    finally:
        b.kill()
    time.sleep(2.5)
    b = node(store)
    try:
        c = PahoClient("share-keep", V5, clean=False).connect(b.port(), properties=session_props())
        assert c.session_present
        got = sorted(m.payload for m in c.expect_n(4))
        c.expect_none(0.5)
        assert got == [b"0", b"1", b"2", b"3"]
        c.disconnect()
    finally:
        b.stop()


def test_messages_a_lowered_queue_bound_drops_at_restart_are_counted(store):
    """Four QoS 1 messages queued under --max-queued 4; restarted with --max-queued 2, the node keeps
    the newest two, as its drop policy does -- and counts the other two in
    $SYS/broker/publish/messages/dropped, as any drop of a full queue. They were deleted unseen."""
    b = node(store, "--max-queued", "4")
    try:
        c = PahoClient("lower-dev", V311, clean=False).connect(b.port())
        c.subscribe("lower/t", qos=1)
        c.disconnect()
        with PahoClient("lower-pub").connect(b.port()) as pub:
            for i in range(4):
                pub.publish("lower/t", b"%d" % i, qos=1)
    finally:
        b.stop()
    b = node(store, "--max-queued", "2", "--sys-interval", "1")
    try:
        with PahoClient("lower-sys").connect(b.port()) as watch:
            watch.subscribe("$SYS/broker/publish/messages/dropped", qos=0)
            assert watch.expect(timeout=5).payload == b"2"
        c = PahoClient("lower-dev", V311, clean=False).connect(b.port())
        assert [m.payload for m in c.expect_n(2)] == [b"2", b"3"]
        c.expect_none(0.5)
        c.disconnect()
    finally:
        b.stop()


def test_a_qos2_message_sent_before_a_restart_is_sent_again_after_its_expiry_not_dropped(store):
    """A QoS 2 message (Message Expiry Interval 1 s) reached its subscriber, whose PUBREC was lost
    with its connection: the subscriber holds the packet id until a PUBREL. The node restarts after
    the message expired, and dropped it as expired -- although its delivery had started -- freeing
    the id; the next message went under it, and the subscriber took it for the first one again and
    never delivered it ([MQTT-4.3.3-10]). A message whose delivery started is sent again (DUP)."""
    from .test_acked_when_durable import _Qos2Receiver

    v5 = {raw.SESSION_EXPIRY_INTERVAL: 3600}
    rx = _Qos2Receiver()
    b = node(store)
    try:
        with RawClient(b.port()) as dev:
            dev.connect("exp2-dev", version=5, clean=False, props=v5)
            dev.subscribe("exp2/t", 2)
            with PahoClient("exp2-pub", V5).connect(b.port()) as pub:
                pub.publish("exp2/t", b"first", qos=2, properties=props(PacketTypes.PUBLISH, MessageExpiryInterval=1))
            p = dev.expect(PUBLISH)
            rx.delivered.append(p.payload)           # delivered; its PUBREC is lost with the connection
            rx.awaiting.add(p.pid)
        time.sleep(0.5)                              # (the disconnect is written)
    finally:
        b.kill()
    time.sleep(1.2)                                  # the message expires
    b = node(store)
    try:
        with RawClient(b.port()) as dev:
            dev.connect("exp2-dev", version=5, clean=False, props=v5)
            with PahoClient("exp2-pub", V5).connect(b.port()) as pub:
                pub.publish("exp2/t", b"second", qos=2)
            rx.run(dev, 1.5)
        assert rx.delivered == [b"first", b"second"]
        assert not rx.awaiting
    finally:
        b.stop()


def test_a_session_connected_at_a_crash_expires_and_wills_once_across_further_restarts(store):
    """A client (Session Expiry 4 s, a will) was connected when the node died. The first restart
    starts its expiry and publishes its will -- but wrote neither: the store still said
    "connected", so a second restart 2 s later published the will again and started the expiry
    over, and the session was still there after its 4 s."""
    b = node(store)
    try:
        watcher = PahoClient("once-watch", V311, clean=False).connect(b.port())
        watcher.subscribe("once/status", qos=1)
        watcher.disconnect()
        dev = PahoClient("once-dev", V5, clean=False)
        dev.connect(b.port(), properties=session_props(4), will=("once/status", b"offline", 1, False))
        time.sleep(0.3)                             # (the session record is written behind the CONNACK)
    finally:
        b.kill()
    dev.drop()
    b = node(store)                                 # the expiry starts, the will goes
    try:
        time.sleep(1.5)
    finally:
        b.kill()
    b = node(store)
    try:
        watcher = PahoClient("once-watch", V311, clean=False).connect(b.port())
        assert [m.payload for m in watcher.expect_n(1)] == [b"offline"]
        watcher.expect_none(0.5)
        watcher.disconnect()
        time.sleep(2.5)                             # 4 s after the first restart
        dev = PahoClient("once-dev", V5, clean=False).connect(b.port(), properties=session_props(60))
        assert not dev.session_present
        dev.disconnect()
    finally:
        b.stop()


def test_a_lowered_max_session_expiry_holds_for_the_sessions_stored_before(store):
    """An operator lowers --max-session-expiry (here from forever to 2 s) and restarts: the
    sessions stored before kept the interval they were stored with -- a 3.1.1 device's
    persistent session, and a v5 one asking for an hour, stayed for ever / an hour, and their
    queues with them. Now the restore holds them to the setting, as a CONNECT now would be."""
    b = node(store)
    try:
        old = PahoClient("cap-old", V311, clean=False).connect(b.port())
        old.subscribe("cap/t", qos=1)
        old.disconnect()
        v5 = PahoClient("cap-v5", V5, clean=False).connect(b.port(), properties=session_props(3600))
        v5.subscribe("cap/t", qos=1)
        v5.disconnect()
        with PahoClient("cap-pub").connect(b.port()) as pub:
            pub.publish("cap/t", b"queued", qos=1)
    finally:
        b.stop()
    b = node(store, "--max-session-expiry", "2")
    try:
        time.sleep(2.5)
        old = PahoClient("cap-old", V311, clean=False).connect(b.port())
        assert not old.session_present
        old.expect_none(0.3)
        old.disconnect()
        v5 = PahoClient("cap-v5", V5, clean=False).connect(b.port(), properties=session_props(60))
        assert not v5.session_present
        v5.disconnect()
    finally:
        b.stop()

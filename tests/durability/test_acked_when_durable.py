"""Review of the durable path: an acknowledgement a client gets means the store has
what it acknowledges, also for the acks that answer a packet sent again.

A real brokerd on a real SQLite file. The store is held up by another process's
write transaction on the file (``BEGIN EXCLUSIVE``: "database is locked" for the
broker's batches, the state of a store that cannot take writes): while it is held,
nothing the broker is given can become durable, so an acknowledgement that arrives
meanwhile was sent for something not in the store. The broker is then SIGKILLed,
the lock let go, the broker started again on the file, and the clients do what their
acknowledgements tell them to.
"""

import sqlite3
import time

import pytest

from ..integration import raw
from ..integration.raw import RawClient
from ..mqtt import V311, PahoClient
from ..procs import BrokerProcess


def node(store):
    return BrokerProcess("--store", store, "--sys-interval", "0").start()


def crash_and_restart(b, lock, store):
    """SIGKILL the node while ``lock`` keeps its writes out of the file, let go of the lock -> a new node."""
    b.kill()
    lock.execute("ROLLBACK")
    lock.close()
    return node(store)


def test_a_qos2_publish_sent_again_is_not_acknowledged_before_its_first_copy_is_stored(tmp_path):
    """A QoS 2 PUBLISH whose PUBREC has not come yet (its write waits for the store) is
    sent again, DUP set, on a new connection of the same persistent session. Its packet
    id is already in the session's ids awaiting PUBREL (in memory: taken when the first
    copy was routed), so the copy is not routed again -- but its PUBREC must still wait
    until the first copy's write is durable. Sent at once, a crash before that commit
    loses the message: the publisher, told PUBREC, sends PUBREL and never the message
    again; the restarted node has neither the message nor the id."""
    path = tmp_path / "brokerd.db"
    store = f"sqlite:///{path}"
    b = node(store)
    lock = None
    try:
        sub = PahoClient("dup-sub", V311, clean=False).connect(b.port())
        sub.subscribe("dup/t", qos=2)
        sub.disconnect()
        lock = sqlite3.connect(path, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")                 # the store takes no write from here on
        with RawClient(b.port()) as pub:
            pub.connect("dup-pub", version=4, clean=False)
            pub.publish("dup/t", b"exactly-once", qos=2, pid=7)
        # (connection lost before its PUBREC: the client connects again and sends it again)
        got_pubrec = False
        with RawClient(b.port()) as pub:
            pub.connect("dup-pub", version=4, clean=False)
            pub.publish("dup/t", b"exactly-once", qos=2, pid=7, dup=True)
            try:
                got_pubrec = pub.expect(raw.PUBREC, timeout=1.5).pid == 7
            except TimeoutError:
                pass
        b, lock = crash_and_restart(b, lock, store), None     # nothing of the above was committed
        with RawClient(b.port()) as pub:
            pub.connect("dup-pub", version=4, clean=False)
            if not got_pubrec:
                # not acknowledged: the client still owns the message and sends it again
                pub.publish("dup/t", b"exactly-once", qos=2, pid=7, dup=True)
                assert pub.expect(raw.PUBREC).pid == 7
            pub.ack(raw.PUBREL, 7)
            assert pub.expect(raw.PUBCOMP).pid == 7
        sub = PahoClient("dup-sub", V311, clean=False).connect(b.port())
        assert sub.expect(timeout=5).payload == b"exactly-once", "an acknowledged QoS 2 message was lost"
        sub.expect_none(0.5)
        sub.disconnect()
    finally:
        if lock is not None:
            lock.close()
        b.stop()


class _Qos2Receiver:
    """A QoS 2 receiver as MQTT specifies it (method B, [MQTT-4.3.3-8..11]): a PUBLISH is
    delivered to the application unless its packet id awaits PUBREL; PUBREL frees the id
    (after which a PUBLISH with that id is a new message)."""

    def __init__(self):
        self.delivered: list = []
        self.awaiting: set = set()

    def publish(self, c: RawClient, p) -> None:
        if p.pid not in self.awaiting:
            self.delivered.append(p.payload)
            self.awaiting.add(p.pid)
        c.ack(raw.PUBREC, p.pid)

    def pubrel(self, c: RawClient, p) -> None:
        self.awaiting.discard(p.pid)
        c.ack(raw.PUBCOMP, p.pid)

    def run(self, c: RawClient, wait: float) -> None:
        """Answer what the server sends until it is quiet for ``wait`` seconds."""
        while True:
            try:
                p = c.recv(wait)
            except TimeoutError:
                return
            if p.type == raw.PUBLISH:
                self.publish(c, p)
            elif p.type == raw.PUBREL:
                self.pubrel(c, p)


def test_a_qos2_delivery_is_not_sent_again_after_its_pubrel_completed_it(tmp_path):
    """A stored QoS 2 delivery: its subscriber's PUBREC makes PUBREL owed, a change of the
    stored row's state. PUBREL must wait until that change is durable: sent at once, the
    subscriber completes the flow (PUBCOMP, its packet id freed) while the row still says
    "PUBLISH owed" -- and after a crash the restarted node sends the PUBLISH again, which
    the subscriber can only take for a new message: delivered twice."""
    path = tmp_path / "brokerd.db"
    store = f"sqlite:///{path}"
    b = node(store)
    lock = None
    rx = _Qos2Receiver()
    try:
        with RawClient(b.port()) as sub:
            sub.connect("rel-sub", version=4, clean=False)
            sub.subscribe("rel/t", qos=2)
            with PahoClient("rel-pub", V311).connect(b.port()) as pub:
                pub.publish("rel/t", b"exactly-once", qos=2)
            p = sub.expect(raw.PUBLISH)
            assert p.qos == 2 and p.payload == b"exactly-once"
            lock = sqlite3.connect(path, isolation_level=None)
            lock.execute("BEGIN EXCLUSIVE")             # the store takes no write from here on
            rx.publish(sub, p)                          # -> PUBREC
            rx.run(sub, 1.5)                            # PUBREL -> PUBCOMP, if the server sends it
        b, lock = crash_and_restart(b, lock, store), None     # nothing since the lock was committed
        with RawClient(b.port()) as sub:
            sub.connect("rel-sub", version=4, clean=False)
            rx.run(sub, 1.5)
        assert rx.delivered == [b"exactly-once"], "a QoS 2 message was delivered twice"
        assert not rx.awaiting, "the QoS 2 flow did not complete"
    finally:
        if lock is not None:
            lock.close()
        b.stop()


def _file_size_limit(pid: int, limit: int) -> None:
    """The broker process's RLIMIT_FSIZE: past it a write fails with EFBIG (Python ignores
    SIGXFSZ), which SQLite reports as a full disk or an I/O error and undoes the batch --
    the file cannot grow, as on a full filesystem. ``resource.RLIM_INFINITY`` lifts it."""
    import resource
    hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)[1]
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, hard))     # (the soft limit: no privilege needed)


def test_a_qos2_id_refused_for_the_store_is_not_left_in_it(tmp_path):
    """A v5 QoS 2 PUBLISH whose batch failed (the disk full) is answered PUBREC 0x83: the flow
    is over and its packet id free for the client's next message. The broker forgets the id
    -- but the batch's writes are retried, the id's row with them, and once the disk has room
    it is in the file for good. After a restart the session's ids awaiting PUBREL are read
    from the file, so the client's next QoS 2 message under that id is taken for a copy of
    one already received: PUBREC 0, PUBCOMP -- and never delivered."""
    path = tmp_path / "brokerd.db"
    store = f"sqlite:///{path}"
    b = node(store)
    v5 = {raw.SESSION_EXPIRY_INTERVAL: 3600}
    try:
        sub = PahoClient("orphan-sub", V311, clean=False).connect(b.port())
        sub.subscribe("orphan/t", qos=2)
        sub.disconnect()
        with RawClient(b.port()) as pub:
            pub.connect("orphan-pub", version=5, clean=False, props=v5)
            _file_size_limit(b.proc.pid, 1)                   # the disk is full
            try:
                pub.publish("orphan/t", b"refused", qos=2, pid=7)
                rec = pub.expect(raw.PUBREC, timeout=30)
                assert rec.pid == 7 and rec.code == 0x83
            finally:
                import resource
                _file_size_limit(b.proc.pid, resource.RLIM_INFINITY)     # room again
            # the store is back: a message under another id is stored and acknowledged
            for _ in range(100):                              # (refused until the retry got through)
                pub.publish("orphan/t", b"after", qos=2, pid=8)
                rec = pub.expect(raw.PUBREC, timeout=30)
                assert rec.pid == 8
                if rec.code == 0:
                    break
                time.sleep(0.1)
            assert rec.code == 0
            pub.ack(raw.PUBREL, 8)
            assert pub.expect(raw.PUBCOMP).pid == 8
        b.stop()
        b = node(store)
        with RawClient(b.port()) as pub:
            pub.connect("orphan-pub", version=5, clean=False, props=v5)
            pub.publish("orphan/t", b"new", qos=2, pid=7)     # id 7 is free: its flow ended with 0x83
            assert pub.expect(raw.PUBREC).code == 0
            pub.ack(raw.PUBREL, 7)
            assert pub.expect(raw.PUBCOMP).pid == 7
        sub = PahoClient("orphan-sub", V311, clean=False).connect(b.port())
        got = []
        while b"new" not in got:
            got.append(sub.expect(timeout=5).payload)        # (the refused one may come: at least once)
        assert set(got) <= {b"refused", b"after", b"new"}, got
        sub.disconnect()
    finally:
        b.stop()


@pytest.mark.parametrize("version", [4, 5])
def test_a_subscription_the_store_did_not_take_is_not_acknowledged_as_granted(tmp_path, version):
    """A persistent session subscribes while the disk is full: the store refuses the batch (it is
    retried). The SUBACK granted the subscription all the same; the node then died before the
    retry got through, and after the restart the session had no such subscription -- the client,
    told it was subscribed, never got the messages published to it. Now the SUBACK says the
    subscription failed (MQTT 5: 0x83; 3.1.1: 0x80); one it grants survives the crash."""
    path = tmp_path / "brokerd.db"
    store = f"sqlite:///{path}"
    props = {raw.SESSION_EXPIRY_INTERVAL: 3600} if version == 5 else None
    b = node(store)
    try:
        with RawClient(b.port()) as dev:
            dev.connect("full-dev", version=version, clean=False, props=props)
            time.sleep(0.3)                                   # (its session row is written)
            _file_size_limit(b.proc.pid, 1)                   # the disk is full
            dev.send(raw.subscribe_packet(1, [("full/t", 1)], version))
            codes = dev.expect(raw.SUBACK, timeout=30).codes
            b.kill()                                          # before the store had room again
    finally:
        b.kill()
    delivered = _delivered_after_a_restart(store, "full", version, props)
    assert codes[0] >= 0x80 or delivered, f"SUBACK {codes} granted a subscription lost in a crash"
    assert codes == [0x83 if version == 5 else 0x80]


def _delivered_after_a_restart(store, name: str, version: int, props) -> bool:
    """A node started again on ``store``: whether the session ``{name}-dev``, taken back, gets a
    message published to ``{name}/t``."""
    b = node(store)
    try:
        with RawClient(b.port()) as dev:
            dev.connect(f"{name}-dev", version=version, clean=False, props=props)
            with PahoClient(f"{name}-pub", V311).connect(b.port()) as pub:
                pub.publish(f"{name}/t", b"published after the restart", qos=1)
            try:
                return dev.expect(raw.PUBLISH, timeout=1.5).payload == b"published after the restart"
            except TimeoutError:
                return False
    finally:
        b.stop()


def _unsubscribe_packet(pid: int, topic: str, version: int) -> bytes:
    body = pid.to_bytes(2, "big") + (b"\x00" if version == 5 else b"") + len(topic).to_bytes(2, "big") + topic.encode()
    return bytes([0xA2, len(body)]) + body


@pytest.mark.parametrize("version", [4, 5])
def test_an_unsubscribe_the_store_did_not_take_is_not_acknowledged(tmp_path, version):
    """The same for UNSUBSCRIBE: acknowledged while the disk was full, then a crash, and the
    subscription was back after the restart. Now MQTT 5 gets UNSUBACK 0x83; 3.1.1, whose
    UNSUBACK has no reason code, is disconnected (as for a PUBACK the store could not give)."""
    path = tmp_path / "brokerd.db"
    store = f"sqlite:///{path}"
    props = {raw.SESSION_EXPIRY_INTERVAL: 3600} if version == 5 else None
    b = node(store)
    try:
        with RawClient(b.port()) as dev:
            dev.connect("unfull-dev", version=version, clean=False, props=props)
            dev.send(raw.subscribe_packet(1, [("unfull/t", 1)], version))
            dev.expect(raw.SUBACK)
            time.sleep(0.3)
            _file_size_limit(b.proc.pid, 1)                   # the disk is full
            dev.send(_unsubscribe_packet(2, "unfull/t", version))
            try:
                unsuback = dev.expect(raw.UNSUBACK, timeout=30)
                acked = version == 4 or unsuback.codes[0] < 0x80
            except raw.Closed:
                acked = False
            b.kill()
    finally:
        b.kill()
    delivered = _delivered_after_a_restart(store, "unfull", version, props)
    assert not (acked and delivered), "an acknowledged UNSUBSCRIBE came undone in a crash"
    assert not acked

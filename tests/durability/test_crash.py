"""A brokerd process killed with SIGKILL loses nothing it acknowledged.

A persistent-session subscriber (QoS 1) is offline while a publisher sends
5,000 numbered QoS 1 messages; brokerd is killed in the middle of the stream
and restarted on the same store; the subscriber reconnects and must receive
every message whose PUBACK the publisher got, in publish order, duplicates
only with DUP set. Run for the SQLite store and for the HBase store through
the Thrift gateway double (tests/hbase_double.py).
"""

import queue
import threading
import time

import paho.mqtt.client as mqtt
import pytest

from ..mqtt import V5, V311, PacketTypes, PahoClient
from ..mqtt import props as mkprops
from ..procs import BrokerProcess

TOTAL = 5000


class Publisher:
    """Publishes numbered QoS 1 messages and records which were acknowledged.

    No lock of ours is held around paho calls: paho runs on_publish while
    holding its own mutex, which ``publish`` also takes (a lock-order
    deadlock otherwise). Message ids (< 65536 here) map acks to numbers.
    """

    def __init__(self, port: int, topic: str, version=V311):
        self.topic = topic
        self.sent = 0
        self._mids: dict[int, int] = {}
        self._acked_mids: set[int] = set()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"crash-pub-{time.time_ns()}",
                                  protocol=version)
        self.client.max_inflight_messages_set(200 if version != V5 else 32)    # MQTT 5: brokerd's Receive Maximum
        self.client.max_queued_messages_set(0)
        self.client.on_publish = self._on_publish
        self.client.reconnect_delay_set(60, 60)      # do not come back on the new process
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _on_publish(self, client, userdata, mid, reason_code, properties):
        if not reason_code.is_failure:
            self._acked_mids.add(mid)

    @property
    def acked(self) -> set[int]:
        while True:          # the publishing thread may add to _mids meanwhile: copy until it held still
            try:
                mids = dict(self._mids)
                acked = set(self._acked_mids)
                break
            except RuntimeError:
                continue
        return {n for mid, n in mids.items() if mid in acked}

    def publish_all(self, stop: threading.Event) -> None:
        for n in range(TOTAL):
            if stop.is_set():
                return
            info = self.client.publish(self.topic, b"%05d" % n, qos=1)
            if info.rc != mqtt.MQTT_ERR_SUCCESS:
                return
            self._mids[info.mid] = n
            self.sent = n + 1
            if n % 50 == 0:
                time.sleep(0.002)     # let the broker take them in several batches

    def close(self):
        self.client.loop_stop()
        self.client.disconnect()


def received_in_order(msgs) -> list[int]:
    """The numbers received, checking the rules: increasing, repeats only with DUP."""
    seen: list[int] = []
    for m in msgs:
        n = int(m.payload)
        if seen and n <= seen[-1]:
            assert m.dup, f"message {n} arrived again after {seen[-1]} without DUP"
            continue
        seen.append(n)
    return seen


def drain(client: PahoClient, idle: float = 3.0, limit: float = 60.0) -> list:
    out = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            out.append(client.messages.get(timeout=idle))
        except Exception:
            break
    return out


def drain_until(client, numbers, idle: float = 3.0, quiet: float = 0.5, limit: float = 60.0) -> list:
    """``drain``, which ends after ``idle`` seconds without a message, but once each of
    ``numbers`` (payloads) has come it ends after ``quiet`` seconds without one: a stream that is whole
    is not waited on for seconds more (what is still missing is waited for as long as before)."""
    out = []
    wanted = set(numbers)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            m = client.messages.get(timeout=quiet if not wanted else idle)
        except queue.Empty:
            break
        out.append(m)
        wanted.discard(int(m.payload))
    return out


def crash_and_check(store_url: str, version=V311, pub_version=V311, min_acked=TOTAL // 3) -> dict:
    topic = f"crash/{time.time_ns()}"
    sub_id = f"crash-sub-{time.time_ns()}"
    node = BrokerProcess("--store", store_url, "--max-queued", str(TOTAL * 2)).start()
    try:
        sub = PahoClient(sub_id, version, clean=False)
        props = None
        if version == V5:
            props = mkprops(PacketTypes.CONNECT, SessionExpiryInterval=3600)
        sub.connect(node.port(), properties=props)
        sub.subscribe(topic, qos=1)
        sub.disconnect()
        pub = Publisher(node.port(), topic, pub_version)
        stop = threading.Event()
        t = threading.Thread(target=pub.publish_all, args=(stop,), daemon=True)
        t.start()
        deadline = time.monotonic() + 30
        while len(pub.acked) < min_acked and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(pub.acked) >= min_acked, "publisher got too few acks before the kill"
        node.kill()                                  # SIGKILL, mid-stream
        stop.set()
        t.join(5)
        acked = set(pub.acked)
        pub.client.loop_stop()
    finally:
        node.kill()
    restarted = BrokerProcess("--store", store_url, "--max-queued", str(TOTAL * 2)).start()
    try:
        sub = PahoClient(sub_id, version, clean=False)
        sub.connect(restarted.port(), properties=props)
        assert sub.session_present
        got = received_in_order(drain(sub))
        sub.disconnect()
    finally:
        restarted.stop()
    missing = sorted(acked - set(got))
    assert not missing, f"{len(missing)} acknowledged messages lost, first {missing[:10]}"
    return {"acked": len(acked), "received": len(got), "sent": pub.sent}


@pytest.mark.slow
def test_sigkill_loses_no_acknowledged_message_sqlite(tmp_path):
    result = crash_and_check(f"sqlite:///{tmp_path}/brokerd.db")
    assert result["acked"] < TOTAL       # the kill really happened mid-stream


@pytest.mark.slow
def test_sigkill_loses_no_acknowledged_message_sqlite_v5(tmp_path):
    crash_and_check(f"sqlite:///{tmp_path}/brokerd.db", version=V5)


@pytest.mark.slow
def test_sigkill_loses_no_acknowledged_message_hbase(hbase_url):
    result = crash_and_check(hbase_url)
    assert result["acked"] < TOTAL


@pytest.mark.slow
def test_sigkill_with_faults_between_rows_of_batches_hbase(tmp_path):
    """HBase applies the rows of a batch one by one: here every 4th multi-row
    ``mutateRows`` fails halfway through its rows (the double's --fault-rows,
    delete markers on), the writer retries, publishers (MQTT 5) get negative
    acks meanwhile -- and then brokerd is SIGKILLed mid-stream. Every message
    acknowledged is delivered after the restart, in order, repeats only with DUP."""
    from ..hbase_double import HBaseDoubleProcess

    with HBaseDoubleProcess(tmp_path / "hbase.db", delete_markers=True, fault_rows=4) as gateway:
        # (refused while the store retries: fewer acks before the kill than without faults)
        result = crash_and_check(f"hbase://{gateway.address}?table_prefix=faults", pub_version=V5,
                                 min_acked=TOTAL // 20)
        assert result["acked"] < TOTAL
        assert gateway.calls()["row_faults"] > 0, "no batch failed between its rows"


@pytest.mark.slow
def test_sigkill_with_pipelined_batches_and_faults_between_rows_hbase(tmp_path):
    """The same with write batches pipelined -- up to 4 in flight (``pipeline=4``),
    the gateway 3 ms a call away so that they overlap -- and every 4th multi-row
    ``mutateRows`` failing halfway: a failed batch fails the batches in flight
    after it (their publishers get negative acks too) and all are written again
    in order. After the SIGKILL every acknowledged message is delivered, in
    order, repeats only with DUP."""
    from ..hbase_double import HBaseDoubleProcess

    with HBaseDoubleProcess(tmp_path / "hbase.db", delete_markers=True, fault_rows=4, latency_ms=3) as gateway:
        result = crash_and_check(f"hbase://{gateway.address}?table_prefix=pipe&pipeline=4", pub_version=V5,
                                 min_acked=TOTAL // 20)
        assert result["acked"] < TOTAL
        assert gateway.calls()["row_faults"] > 0, "no batch failed between its rows"

"""HBase has no transaction across rows: a write batch lands row by row, table by table, and a
crash in the middle leaves part of it. Whatever part that is, a QoS 2 message must not be lost.

Its batch holds the incoming packet id (the publisher's session row: "received, do not route a
copy again") and the message's queue rows. The PUBREC waits for the whole batch, so after a crash
mid-batch the publisher sends the PUBLISH again -- and a node that finds the id stored takes the
copy for one it already routed. Written before the queue rows, a crash between the two lost the
message: PUBREC and PUBCOMP to the publisher, nothing ever to the subscriber.
"""

import threading
import time

from ..hbase_double import HBaseDouble
from ..integration import raw
from ..integration.raw import RawClient
from ..mqtt import V311, PahoClient
from ..procs import BrokerProcess


def test_a_crash_between_the_rows_of_a_qos2_publish_batch_loses_no_message(tmp_path):
    double = HBaseDouble(tmp_path / "hbase.db", delete_markers=True).start()
    url = f"hbase://{double.address}?table_prefix=partial&timeout=3000"
    handler = double.handler
    real = handler.mutateRows
    stalled = threading.Event()
    armed = []

    def mutate_rows(table, batches, attributes=None):
        if armed and table.endswith(b"queue"):
            # this call never lands: the node dies while it is on its way
            stalled.set()
            time.sleep(2)
            raise OSError("the node died meanwhile")
        return real(table, batches, attributes)

    handler.mutateRows = mutate_rows
    b = BrokerProcess("--store", url, "--sys-interval", "0").start()
    try:
        sub = PahoClient("partial-sub", V311, clean=False).connect(b.port())
        sub.subscribe("partial/t", qos=2)
        sub.disconnect()
        with RawClient(b.port()) as pub:
            pub.connect("partial-pub", version=4, clean=False)
            time.sleep(0.3)                               # (its session row is written)
            armed.append(True)
            pub.publish("partial/t", b"exactly-once", qos=2, pid=7)
            assert stalled.wait(5), "the queue rows were never written"
            b.kill()                                      # mid-batch: the queue rows not written
    finally:
        b.kill()
    armed.clear()
    time.sleep(2.2)                                       # (the stalled call has given up)
    b = BrokerProcess("--store", url, "--sys-interval", "0").start()
    try:
        with RawClient(b.port()) as pub:
            pub.connect("partial-pub", version=4, clean=False)
            pub.publish("partial/t", b"exactly-once", qos=2, pid=7, dup=True)    # no PUBREC came
            assert pub.expect(raw.PUBREC).pid == 7
            pub.ack(raw.PUBREL, 7)
            assert pub.expect(raw.PUBCOMP).pid == 7
        sub = PahoClient("partial-sub", V311, clean=False).connect(b.port())
        assert [m.payload for m in sub.expect_n(1)] == [b"exactly-once"]
        sub.expect_none(0.5)
        sub.disconnect()
    finally:
        b.stop()
        double.stop()

"""A node's MQTT port answers only once the node is part of the cluster.

A node binds its listeners before it joins (the other nodes learn its addresses from the join), and it
used to accept on them at once: a device that reached it in that window (a fleet reconnecting to a node
that is restarting, its port polled) was let in as if on a node of its own -- no claim of its client id
in the cluster, so the same id stayed connected on another node too (two live sessions of one device,
each taking half of its messages). The listeners now accept only after the node attached the cluster;
a device that comes earlier is refused (or waits in the listen backlog) until then, and then connects
like any other."""

import socket
import threading
import time

from ..integration.helpers import connect
from ..mqtt import V5
from ..procs import BrokerProcess, free_port
from .conftest import wait_until


def _connect_packet(client_id: str) -> bytes:
    """An MQTT 3.1.1 CONNECT, clean session, keep alive 60."""
    cid = client_id.encode()
    body = b"\x00\x04MQTT\x04\x02\x00\x3c" + len(cid).to_bytes(2, "big") + cid
    return bytes([0x10, len(body)]) + body


def _hammer(port: int, client_id: str, out: dict, stop: threading.Event) -> None:
    """Connect to ``port`` as soon as anything accepts there; send a CONNECT, read the CONNACK."""
    while not stop.is_set():
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=0.2)
        except OSError:
            time.sleep(0.002)
            continue
        out["accepted_at"] = time.monotonic()
        s.settimeout(20)
        s.sendall(_connect_packet(client_id))
        try:
            out["connack"] = s.recv(4)
        except OSError as exc:
            out["error"] = repr(exc)
        out["sock"] = s
        return


def test_a_device_reaching_a_starting_node_takes_over_its_session_on_another_node(cluster, tag):
    (n1,) = cluster.start(1)
    old = connect(n1.port(), f"{tag}-dev", V5)
    port = free_port()
    out: dict = {}
    stop = threading.Event()
    hammer = threading.Thread(target=_hammer, args=(port, f"{tag}-dev", out, stop), daemon=True)
    hammer.start()
    try:
        cluster._n += 1
        name = f"n{cluster._n}"
        n2 = BrokerProcess("--node-id", name, "--store", cluster.store, "--cluster", cluster.url(),
                           listen=(f"mqtt://127.0.0.1:{port}",),
                           env={"BROKERD_CLUSTER_SECRET": cluster.secret})
        cluster.nodes.append(n2)
        cluster.names[id(n2)] = name
        n2.start()
        hammer.join(20)
    finally:
        stop.set()
    assert out.get("connack", b"")[:4] == b"\x20\x02\x00\x00", f"no CONNACK: {out}\n{n2.log}"
    # the id's session on n1 ends: it was taken over, as from any other node
    reason, _ = old.expect_disconnect(timeout=10)
    assert reason.value == 0x8E, f"n1's connection ended with {reason}"
    wait_until(lambda: "joined the cluster" in n2.log)
    out["sock"].close()

"""A client that connects again to the same node stays registered in the
cluster as that node's, so a CONNECT of its client id on another node takes
it over from there. Before, two cases lost the registration. The old
connection's disconnect let go of the id after the new one had claimed it:
when the new CONNECT took the old connection over, and when a client closed
and connected again at once. The id was then connected on two nodes."""

import socket
import time

from ..integration.helpers import connect, wait_until
from ..integration.raw import CONNACK, RawClient, connect_packet, disconnect_packet
from ..mqtt import V5, V311


def owner(redis_server, cid: str) -> bytes | None:
    r = redis_server.client()
    for key in r.scan_iter(match="*clients:*"):
        value = r.hget(key, cid)
        if value is not None:
            return value
    return None


def taken_over(client, version, message: str) -> None:
    if version == V5:
        code, _ = client.expect_disconnect(timeout=5)
        assert code.value == 0x8E, message
    else:
        wait_until(lambda: not client.client.is_connected(), timeout=5, message=message)


def test_a_connect_that_takes_over_a_connection_on_the_same_node_keeps_the_id_registered(cluster, redis_server,
                                                                                          tag):
    n1, n2 = cluster.start(2)
    for version in (V5, V311):
        cid = f"{tag}-dev-{version}"
        first = connect(n1.port(), cid, version)
        second = connect(n1.port(), cid, version)          # the same node takes the first over
        taken_over(first, version, "the first was not taken over")
        time.sleep(0.5)                                     # the first's disconnect reached Redis by now
        assert owner(redis_server, cid) == b"n1"
        third = connect(n2.port(), cid, version)            # another node: takes it over from node 1
        taken_over(second, version, f"{cid} is connected on two nodes")
        third.disconnect()


def test_clients_that_close_and_connect_again_at_once_stay_registered(cluster, redis_server, tag):
    n1, = cluster.start(1)
    cids = [f"{tag}-c{i}" for i in range(30)]
    socks = []
    for cid in cids:
        raw = RawClient(n1.port())
        raw.send(connect_packet(cid, 4))
        raw.expect(CONNACK)
        socks.append(raw)
    again = []
    for raw, cid in zip(socks, cids, strict=True):
        raw.send(disconnect_packet(4))                      # closes, and at once the same id connects again
        s = socket.create_connection(("127.0.0.1", n1.port()), timeout=5)
        s.sendall(connect_packet(cid, 4))
        again.append(s)
    for s in again:
        RawClient(0, sock=s, timeout=10).expect(CONNACK)
    time.sleep(0.5)
    assert [cid for cid in cids if owner(redis_server, cid) != b"n1"] == []
    for s in again:
        s.close()


def wills(redis_server, cid: str) -> list[bytes]:
    """The wills the cluster keeps for ``cid`` (published by a survivor should its node die)."""
    r = redis_server.client()
    return [blob for key in r.scan_iter(match="*wills:*") for member, blob in r.hgetall(key).items()
            if member.endswith(b"\0" + cid.encode())]


def test_a_connect_that_takes_over_on_the_same_node_leaves_its_own_will_registered(cluster, redis_server, tag):
    n1, = cluster.start(1)
    cid = f"{tag}-dev"
    first = connect(n1.port(), cid, V311, will=(f"{tag}/will", b"first gone", 1, False))
    wait_until(lambda: wills(redis_server, cid), timeout=5, message="the first will was not registered")
    second = connect(n1.port(), cid, V311, will=(f"{tag}/will", b"second gone", 1, False))
    taken_over(first, V311, "the first was not taken over")
    time.sleep(0.5)
    got = wills(redis_server, cid)
    assert len(got) == 1 and b"second gone" in got[0], got
    third = connect(n1.port(), cid, V311)                   # no will
    taken_over(second, V311, "the second was not taken over")
    time.sleep(0.5)
    assert wills(redis_server, cid) == []
    assert owner(redis_server, cid) == b"n1"
    third.disconnect()


def test_a_client_that_connects_and_leaves_at_once_leaves_no_client_id_registered(cluster, redis_server, tag):
    """CONNECT and DISCONNECT in one write: the connection closes while its own claim is still being
    finished. Its clean session is over, so its id must not stay registered as the node's."""
    n1, = cluster.start(1)
    cids = [f"{tag}-brief{i}" for i in range(20)]
    socks = []
    for cid in cids:
        s = socket.create_connection(("127.0.0.1", n1.port()), timeout=5)
        s.sendall(connect_packet(cid, 4) + disconnect_packet(4))
        socks.append(s)
    for s in socks:
        s.settimeout(5)
        while s.recv(4096):                                 # CONNACK, then the broker closes
            pass
        s.close()
    time.sleep(0.5)
    assert [cid for cid in cids if owner(redis_server, cid) is not None] == []


"""The link protocol's pure parts: frames split from any cut of a stream,
bounded from their header, and the handshake's proofs (no sockets)."""

import os

import pytest

from brokerd.cluster import frames, handshake


def stream() -> tuple[bytes, list[tuple]]:
    parts = [
        frames.hello("n1", b"\x01" * frames.NONCE),
        frames.auth(b"\x02" * 32),
        frames.publish(7, 1, 1, 30, b"acme", b"a/b", b"", b"payload" * 100),
        frames.ack(7, 0),
        frames.takeover(8, "acme", "dev-1"),
        frames.takeover(10, "acme", "dev-2", frames.LIVE_ONLY),
        frames.ping(),
        frames.handoff(9, '{"filters": ["a/#"]}'),
    ]
    expected = [
        (frames.HELLO, "n1", b"\x01" * frames.NONCE),
        (frames.AUTH, b"\x02" * 32),
        (frames.PUBLISH, 7, 1, 1, 30, "acme", "a/b", b"", b"payload" * 100, "", ""),
        (frames.ACK, 7, 0),
        (frames.TAKEOVER, 8, "acme", "dev-1", 0),
        (frames.TAKEOVER, 10, "acme", "dev-2", frames.LIVE_ONLY),
        (frames.PING,),
        (frames.HANDOFF, 9, '{"filters": ["a/#"]}'),
    ]
    return b"".join(parts), expected


def test_frames_from_a_stream_cut_anywhere():
    data, expected = stream()
    for cut in range(1, len(data)):
        reader = frames.FrameReader(64 * 1024)
        assert reader.feed(data[:cut]) + reader.feed(data[cut:]) == expected


def test_frames_fed_a_byte_at_a_time():
    data, expected = stream()
    reader = frames.FrameReader(64 * 1024)
    got = [f for i in range(len(data)) for f in reader.feed(data[i:i + 1])]
    assert got == expected
    assert reader.buffered == 0


def test_a_big_frame_in_small_pieces_is_kept_in_pieces_until_whole():
    """Linear: the pieces are joined once, when the frame is complete."""
    frame = frames.publish(0, 0, 0, -1, b"t", b"x", b"", bytes(1_000_000))
    reader = frames.FrameReader(2_000_000)
    pieces = [frame[i:i + 1000] for i in range(0, len(frame), 1000)]
    for piece in pieces[:-1]:
        assert reader.feed(piece) == []
    assert reader.buffered == len(frame) - len(pieces[-1])
    assert len(reader._parts) == len(pieces) - 1
    (got,) = reader.feed(pieces[-1])
    assert got[-3] == bytes(1_000_000)


def test_a_frame_over_the_limit_fails_from_its_header():
    reader = frames.FrameReader(frames.PREAUTH_FRAME)
    with pytest.raises(frames.FrameError):
        reader.feed(frames.publish(0, 0, 0, -1, b"t", b"x", b"", bytes(2000))[:5])


def test_a_hello_of_another_version_is_refused():
    body = frames.hello("n1", os.urandom(frames.NONCE))
    old = bytearray(body)
    old[5] = frames.VERSION + 1
    with pytest.raises(frames.FrameError):
        frames.FrameReader(1024).feed(bytes(old))


def test_a_proof_binds_both_ids_and_both_nonces():
    secret = b"s" * 32
    na, nb = os.urandom(32), os.urandom(32)
    p = handshake.proof(secret, "a", "b", nb, na)
    assert handshake.check(secret, p, "a", "b", nb, na)
    assert not handshake.check(b"t" * 32, p, "a", "b", nb, na)          # another secret
    assert not handshake.check(secret, p, "b", "a", na, nb)              # reflected back at its maker
    assert not handshake.check(secret, p, "a", "c", nb, na)              # to another node
    assert not handshake.check(secret, p, "a", "b", os.urandom(32), na)  # a recorded exchange, replayed
    assert handshake.proof(None, "a", "b", nb, na) == b""


@pytest.mark.parametrize("qos, retain", [(0, False), (1, True)])
def test_a_message_a_rule_made_is_one_on_the_next_node_too(qos, retain):
    """A rule's republish (``RulePublish``) raises no ``$events/delivery_dropped`` where its delivery
    is dropped: forwarded to another node, it is still one there (the frame's ``RULE`` flag, also on
    the 3.x QoS 0 wire form), and a client's message is not -- else a rule republishing that event
    on two nodes could feed itself from one to the other for ever."""
    from types import SimpleNamespace

    from brokerd.cluster.forwarding import Forwarder
    from brokerd.protocol.packets import Publish, RulePublish

    got = []
    receiver = Forwarder.__new__(Forwarder)
    receiver.clock = lambda: 100.0
    receiver.fence = SimpleNamespace(fenced=False)
    receiver._moving = False
    receiver.broker = SimpleNamespace(store_refusing=lambda: False, writes_pending=lambda: 0,
                                      forwarded=lambda tenant, msg, group, gfilter, now: got.append(msg) or 1)
    ns = SimpleNamespace(name="acme")
    for cls in (RulePublish, Publish):
        msg = cls("alerts/x", b"dropped", qos, retain)
        if not qos:
            msg.enc3 = b"\x30\x11\x00\x08alerts/xdropped"       # its 3.x wire form: sent as it is (RAW)
        data = frames.publish(0, *Forwarder._parts(ns, msg, 100.0))
        [frame] = frames.FrameReader(64 * 1024).feed(data)
        receiver.on_publish(None, *frame[1:])
    assert [(m.__class__, m.topic, m.payload, m.qos, m.retain) for m in got] == [
        (RulePublish, "alerts/x", b"dropped", qos, retain), (Publish, "alerts/x", b"dropped", qos, retain)]

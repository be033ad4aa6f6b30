"""A node SIGKILLed and started again at once under the same node id (a service manager's restart,
within the 5 s the others take to see a node gone): nobody else adopts what its former run held, so
the new run takes it up -- its stored sessions go on receiving messages (refused meanwhile, never
acknowledged for nobody), its clients' wills are published. Before, the others dropped the former
run's routes at the new one's "reset" and nothing loaded its sessions until each client came back:
their QoS 1 messages were acknowledged (0x10) and lost, and the wills of its clients never went."""

from ..integration.helpers import Client, connect
from ..mqtt import V5, PacketTypes, props
from .conftest import PacedPublisher, settle, wait_until


def test_a_node_restarted_at_once_under_its_id_loses_no_message_for_its_stored_sessions(cluster, tag):
    n1, n2 = cluster.start(2, "--max-queued", "10000")
    p = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    s = connect(n1.port(), f"{tag}-s", V5, clean=False, properties=p)
    s.subscribe(f"{tag}/t", qos=1)
    watch = connect(n2.port(), f"{tag}-watch", V5)
    watch.subscribe(f"{tag}/will", qos=1)
    settle(connect(n1.port(), f"{tag}-probe1", V5), f"{tag}/will", watch)
    settle(connect(n2.port(), f"{tag}-probe2", V5), f"{tag}/t", s)
    s.disconnect()
    dev = Client(f"{tag}-dev", V5).connect(n1.port(), will=(f"{tag}/will", b"dev gone", 1, False, None))
    assert dev is not None
    total = 1600
    stream = PacedPublisher(n2.port(), f"{tag}/t", total=total, rate=200).start()
    stream.wait_acked(200)
    n1.kill()
    n1.start()
    wait_until(lambda: "joined the cluster" in n1.log, timeout=15)
    stream.finish(timeout=60)
    acked = stream.acked
    assert watch.expect(timeout=10).payload == b"dev gone", "the will of the former run's client never went"
    again = connect(n2.port(), f"{tag}-s", V5, clean=False, properties=p)
    assert again.session_present
    got = set()
    # until every acknowledged number came (not as many numbers as were acknowledged: a message refused
    # to its publisher (0x83) may still have reached the session -- at least once -- and counting it made
    # the loop stop one short, the stream's last message "lost" about one run in ten under load)
    while not acked <= got:
        try:
            payload = again.expect(timeout=5).payload
        except Exception:
            break
        if payload.isdigit():
            got.add(int(payload))
    missing = sorted(acked - got)
    assert not missing, f"{len(missing)} acknowledged messages lost: {missing[:20]}; codes {stream.by_code()}"
    assert max(acked) > total - 100, f"the stream did not go on: {stream.by_code()}"

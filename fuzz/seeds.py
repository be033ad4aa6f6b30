"""Hand-made seeds, ``fuzz/corpus/synthetic-*.bin``, for states the captures do not reach.

The real-client captures (``fuzz/capture.py``) are well-behaved; these use the
harness's mode byte (see ``fuzz/harness.py``) to start libFuzzer next to the
deeper paths: Receive Maximum exceeded, a session resumed with messages in
flight, retained delivery on SUBSCRIBE, failed PUBRECs, topic aliases, refused
CONNECTs. ``.venv/bin/python fuzz/seeds.py`` rewrites them.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from brokerd.protocol import properties as P
from brokerd.protocol.codec import encode
from brokerd.protocol.packets import (
    MQTT5,
    MQTT31,
    Connect,
    Disconnect,
    Pingreq,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Subscribe,
    SubscriptionRequest,
    Unsubscribe,
    Will,
)

V3, V5 = 1, 2            # prelude kinds (mode bits 0-1)
V5_SUB = 3
PIECES_8 = 5 << 2        # cut into 8-byte pieces
SMALL = 0x20             # max packet size 128
PEER = 0x40              # a second client publishes to 'fuzz/peer' after every piece
RESUME = 0x80            # persistent session, reconnect after the stream


def e5(*pkts):
    return b"".join(encode(p, MQTT5) for p in pkts)


def e3(*pkts):
    return b"".join(encode(p) for p in pkts)


SEEDS = {
    "receive-maximum-exceeded": bytes([V5]) + e5(*(Publish("a", b"x", 2, packet_id=i) for i in range(1, 7))),
    "qos2-reuse-and-unknown-pubrel": bytes([V5]) + e5(
        Publish("a", b"1", 2, packet_id=7), Publish("a", b"1", 2, dup=True, packet_id=7), Pubrel(7), Pubrel(7),
        Pubrel(9), Puback(3), Pubrec(4), Pubcomp(5)),
    "resume-inflight-v3": bytes([V3 | RESUME | PEER | PIECES_8]) + e3(
        Subscribe(1, [SubscriptionRequest("fuzz/#", 2)]), Pingreq(), Pingreq(), Pingreq(), Pubrec(1), Pingreq(),
        Pingreq()),
    "resume-inflight-v5": bytes([V5 | RESUME | PEER | PIECES_8]) + e5(
        Subscribe(1, [SubscriptionRequest("fuzz/#", 2)], {P.SUBSCRIPTION_IDENTIFIER: 3}), Pingreq(), Pingreq(),
        Pubrec(1), Pubrec(2, 0x80), Pingreq(), Pingreq()),
    "retained-then-subscribe": bytes([V5_SUB]) + e5(
        Publish("r/1", b"kept", 1, retain=True, packet_id=2), Publish("r/2", b"kept2", 2, retain=True, packet_id=3),
        Pubrel(3), Subscribe(4, [SubscriptionRequest("r/+", 2, retain_handling=0)]), Pubrec(1, 0x80), Puback(2),
        Pubrec(3), Pubcomp(3), Unsubscribe(5, ["r/+", "nope"])),
    "topic-aliases": bytes([V5_SUB]) + e5(
        Publish("al/1", b"a", 0, properties={P.TOPIC_ALIAS: 1}), Publish("", b"b", 1, packet_id=9,
                                                                          properties={P.TOPIC_ALIAS: 1}),
        Publish("al/2", b"c", 0, properties={P.TOPIC_ALIAS: 2}), Publish("", b"d", 0, properties={P.TOPIC_ALIAS: 3})),
    "v5-props-and-disconnect": bytes([V5]) + e5(
        Publish("p", b"\xff", 1, packet_id=1, properties={P.PAYLOAD_FORMAT_INDICATOR: 1}),
        Publish("p", b"ok", 0, properties={P.MESSAGE_EXPIRY_INTERVAL: 0, P.USER_PROPERTY: [("k", "v")]}),
        Disconnect(0, {P.SESSION_EXPIRY_INTERVAL: 10})),
    "oversize-small-max": bytes([V5 | SMALL]) + e5(Publish("big", b"x" * 200, 1, packet_id=1)),
    "v3-will-wildcard": e3(Connect("w", will=Will("w/+", b"x"))),
    "v5-will-not-utf8": e5(Connect("w", protocol_level=MQTT5,
                                   will=Will("w", b"\xff", 1, True, {P.PAYLOAD_FORMAT_INDICATOR: 1,
                                                                      P.WILL_DELAY_INTERVAL: 5}))),
    "v31-long-client-id": encode(Connect("x" * 30, protocol_level=MQTT31, protocol_name="MQIsdp")),
    "v5-connect-limits": e5(Connect("c", keepalive=0, protocol_level=MQTT5, properties={
        P.SESSION_EXPIRY_INTERVAL: 0xFFFFFFFF, P.RECEIVE_MAXIMUM: 1, P.MAXIMUM_PACKET_SIZE: 40,
        P.TOPIC_ALIAS_MAXIMUM: 1, P.REQUEST_RESPONSE_INFORMATION: 1, P.REQUEST_PROBLEM_INFORMATION: 0}),
        Subscribe(1, [SubscriptionRequest("#", 1)]), Publish("x/" + "y" * 40, b"z", 1, packet_id=1),
        Publish("x", b"z", 1, packet_id=2), Publish("x", b"z", 1, packet_id=3)),
}


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, f"synthetic-{name}.bin"), "wb") as f:
            f.write(data)
    print(f"{len(SEEDS)} seeds written to {out}")


if __name__ == "__main__":
    main()

"""Bugs found while fuzzing the protocol core (tests/protocol/test_fuzz_stateful.py,
fuzz/fuzz_broker.py), each with the behaviour the spec (and Mosquitto) asks for."""

from brokerd.protocol import properties as P
from brokerd.protocol import reason as rc
from brokerd.protocol.channel import CLOSED
from brokerd.protocol.packets import Connect

from .harness import MQTT5


def test_connack_above_the_clients_maximum_packet_size_is_not_sent(net):
    """[MQTT-3.1.2-24]: the CONNACK (with Assigned Client Identifier, Receive Maximum,
    Topic Alias Maximum...) is larger than the 20 bytes the client accepts: the server
    closes without sending it, as Mosquitto does, instead of sending it anyway."""
    c = net.client(MQTT5)
    got = c.send(Connect("", protocol_level=MQTT5, properties={P.MAXIMUM_PACKET_SIZE: 20}))
    assert got == []
    assert c.closed and c.channel.state == CLOSED
    assert c.channel.close_reason[0] == rc.PACKET_TOO_LARGE
    assert net.broker.connected == 0
    # a client with room for it connects as before
    d = net.client(MQTT5)
    ack = d.connect("", properties={P.MAXIMUM_PACKET_SIZE: 200})
    assert len(ack.properties[P.ASSIGNED_CLIENT_IDENTIFIER]) > 0


def test_connack_that_fits_exactly_is_sent(net):
    from brokerd.protocol.codec import encode
    from brokerd.protocol.packets import Connack

    probe = net.client(MQTT5)
    ack = probe.connect("p", properties={P.MAXIMUM_PACKET_SIZE: 1000})
    size = len(encode(Connack(False, 0, ack.properties), MQTT5))
    c = net.client(MQTT5)
    assert c.connect("q", properties={P.MAXIMUM_PACKET_SIZE: size}).reason_code == 0

from .mqtt import V5, V311, PahoClient


def test_pubsub_v311_and_v5(broker, client_id):
    with PahoClient(client_id + "s", V5).connect(broker.port()) as sub, \
         PahoClient(client_id + "p", V311).connect(broker.port()) as pub:
        assert [rc.value for rc in sub.subscribe("smoke/#", qos=1)] == [1]
        pub.publish("smoke/a", b"hi", qos=1)
        msg = sub.expect()
        assert (msg.topic, msg.payload, msg.qos) == ("smoke/a", b"hi", 1)

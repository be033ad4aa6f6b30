"""The channel's declared collaborators (brokerd.protocol.ports) are all it
uses, and the broker provides all of them: read from the code, so that a
new reach into the broker from the channel fails here, not in review."""

import ast
import inspect
from pathlib import Path

from brokerd.broker import Broker
from brokerd.protocol import channel, ports

CHANNEL = Path(channel.__file__)


def _port_methods(cls) -> set[str]:
    return {name for name, value in vars(cls).items() if inspect.isfunction(value) and not name.startswith("_")}


def _uses_of(attribute: str) -> set[str]:
    """Names the channel reads on ``self.<attribute>``."""
    tree = ast.parse(CHANNEL.read_text())
    used = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                and node.value.attr == attribute and isinstance(node.value.value, ast.Name)
                and node.value.value.id == "self"):
            used.add(node.attr)
    return used


def test_the_channel_uses_nothing_of_the_broker_but_its_port():
    used = _uses_of("broker")
    declared = _port_methods(ports.ChannelBroker) | set(ports.ChannelBroker.__annotations__)
    assert used <= declared, f"the channel reaches into the broker beyond ChannelBroker: {sorted(used - declared)}"


def test_the_channel_uses_nothing_of_the_transport_but_its_hooks():
    used = _uses_of("hooks")
    declared = _port_methods(ports.TransportHooks)
    assert used <= declared, f"the channel reaches into the transport beyond TransportHooks: {sorted(used - declared)}"


def test_the_broker_implements_the_whole_port_with_its_signatures():
    for name in _port_methods(ports.ChannelBroker):
        impl = getattr(Broker, name, None)
        assert callable(impl), f"Broker has no {name}"
        want = list(inspect.signature(getattr(ports.ChannelBroker, name)).parameters)
        got = list(inspect.signature(impl).parameters)
        assert len(got) == len(want), f"Broker.{name}{tuple(got)} vs the port's {tuple(want)}"

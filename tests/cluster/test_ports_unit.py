"""The cluster's collaborators are declared in ``brokerd/cluster/ports.py``:
the real ones and the unit tests' fakes both have everything a Protocol
names -- so that moving a method (the broker's block of cluster queries, a
bus call) breaks here, not in a three-node test or in production."""

import asyncio

import pytest

from brokerd.broker import Broker
from brokerd.cluster.bus import Bus
from brokerd.cluster.node import ClusterNode
from brokerd.cluster.peers import LinkOwner, LinkSettings, Peers
from brokerd.cluster.ports import Cluster, ClusterBroker, ClusterBus, NodeAddresses, SessionStore, StoreDrain
from brokerd.server import Server
from brokerd.store.base import Store
from brokerd.store.writer import StoreWriter

from .fakes import BusState, FakeBroker, FakeBus, FakeClock, FakePeers, FakeStore, FakeWriter, Wire


def members(proto) -> set[str]:
    """The names a Protocol declares (methods and annotated attributes), its bases' too."""
    names: set[str] = set()
    for cls in proto.__mro__:
        if cls.__module__ in ("typing", "builtins", "abc"):
            continue
        names |= {n for n in vars(cls) if not n.startswith("_")}
        names |= {n for n in getattr(cls, "__annotations__", {}) if not n.startswith("_")}
    return names


CASES = [
    (ClusterBroker, lambda: Broker()),
    (ClusterBroker, lambda: FakeBroker(FakeStore())),
    (ClusterBus, lambda: Bus("redis://127.0.0.1:1/0", "n1")),
    (ClusterBus, lambda: FakeBus(BusState(FakeClock()), "n1")),
    (SessionStore, lambda: Store),
    (SessionStore, lambda: FakeStore()),
    (StoreDrain, lambda: StoreWriter),
    (StoreDrain, lambda: FakeWriter()),
    (NodeAddresses, lambda: Server),
    (LinkOwner, lambda: Peers("n1", LinkSettings("127.0.0.1", 0, b"s" * 32), None, FakeClock(), None, None)),
]


@pytest.mark.parametrize(("proto", "make"), CASES, ids=lambda x: getattr(x, "__name__", None))
def test_implementations_have_what_their_protocol_names(proto, make):
    impl = make()
    missing = sorted(n for n in members(proto) if not hasattr(impl, n))
    assert not missing, f"{getattr(impl, '__name__', type(impl).__name__)} lacks {missing} of {proto.__name__}"


def test_the_node_has_what_the_rest_of_brokerd_calls():
    async def go():
        node = ClusterNode("n1", FakeBus(BusState(FakeClock()), "n1"), FakeBroker(FakeStore()),
                           loop=asyncio.get_running_loop(), clock=FakeClock(), peers=FakePeers(Wire(), "n1"))
        missing = sorted(n for n in members(Cluster) if not hasattr(node, n))
        assert not missing, f"ClusterNode lacks {missing}"

    asyncio.run(go())

"""A tenant's connection quota holds for the whole cluster: devices of one
tenant spread over nodes count together (the nodes share their counts
through the cluster bus every second)."""

import time

import pytest

from ..controlplane import ControlPlane
from ..mqtt import V5, PahoClient
from .conftest import Cluster, wait_until


@pytest.fixture
def plane(tmp_path):
    (tmp_path / "console").mkdir()
    return ControlPlane(tmp_path / "console")


def test_connection_quota_counts_devices_on_every_node(redis_server, tmp_path, plane, tag):
    secrets = plane.provision([{"slug": "acme", "default_acl": "allow", "quota": {"max_connections": 3},
                                "devices": ["d1", "d2", "d3", "d4"]}])
    c = Cluster(redis_server, tmp_path, env=plane.env)
    devs = []
    try:
        n1, n2 = c.start(2)

        def dev(i):
            return PahoClient(f"{tag}-d{i}", version=V5, username=f"acme/d{i}", password=secrets[f"acme/d{i}"])

        devs = [dev(1).connect(n1.port()), dev(2).connect(n1.port())]
        devs.append(dev(3).connect(n2.port()))
        time.sleep(2.5)                                  # two rounds of count sharing
        late = dev(4)
        with pytest.raises(ConnectionError, match="0x97"):
            late.connect(n2.port())
        with pytest.raises(ConnectionError, match="0x97"):
            dev(4).connect(n1.port())
        # one leaves on n1: a place is free on n2 once the counts have gone round
        devs.pop(0).disconnect()

        def joined():
            try:
                devs.append(dev(4).connect(n2.port()))
                return True
            except ConnectionError:
                return False
        wait_until(joined, timeout=15, interval=0.5, message="the freed place was not seen by the other node")
    finally:
        for d in devs:
            d.disconnect()
        c.stop_all()

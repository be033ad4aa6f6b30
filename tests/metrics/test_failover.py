"""The console survives any node (issue 16): three brokerd nodes on a real
Redis (tests/cluster's ``Cluster``, each with ``--admin 127.0.0.1:0``), the
console knowing them from ``BROKERD_ADMIN_URL`` -- all three listed, or only
the first, the others learned from ``GET /api/v1/nodes``. The node the
console asks first is SIGKILLed: the live dashboard (the hub, over the real
ASGI websocket) goes on with the survivors' numbers, a kick through the
console still disconnects its client, and the node-down alarm names the
killed node and no other. A node that hangs instead (SIGSTOP) is alarmed
alone too, the dashboard resuming from a survivor."""

import asyncio
import time

import paho.mqtt.client as mqtt
import pytest
from channels.db import database_sync_to_async

from core.brokerd_client import admin_nodes, admin_urls
from metrics.models import Alarm

from ..cluster.conftest import cluster, redis_server  # noqa: F401  (fixtures)
from ..integration.helpers import Client as Paho
from ..procs import sigstop
from .conftest import TOKEN, receive_until, run, socket

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def ok(msg) -> bool:
    return msg.get("type") == "update" and msg.get("state") == "ok"


def health(msg) -> dict:
    return {n["node"]: n["health"] for n in msg.get("nodes", [])}


def nodes_down(msg) -> set:
    return {a["subject"] for a in msg.get("alarms", []) if a["kind"] == "node_down"}


@pytest.mark.parametrize("known", ["listed", "learned"])
def test_the_dashboard_and_a_kick_survive_the_death_of_the_node_the_console_used(cluster, settings,  # noqa: F811
                                                                               browsers, known):
    # added to what Cluster gives its nodes (whatever else it sets stays): the console's token
    cluster.env = {**(cluster.env or {}), "BROKERD_ADMIN_TOKEN": TOKEN}
    nodes = cluster.start(3, "--admin", "127.0.0.1:0", "--sys-interval", "0")
    first, second, third = (cluster.name(n) for n in nodes)
    settings.BROKERD_ADMIN_URL = (",".join(n.admin_url for n in nodes) if known == "listed"
                                  else nodes[0].admin_url)
    settings.BROKERD_ADMIN_TOKEN = TOKEN
    settings.METRICS_POLL_INTERVAL = 0.25
    settings.BROKERD_ADMIN_DISCOVERY_INTERVAL = 0.5
    endpoints = admin_nodes(admin_urls(settings.BROKERD_ADMIN_URL))
    cid = f"kickme-{time.monotonic_ns()}"
    device = Paho(cid, version=mqtt.MQTTv5).connect(nodes[1].port())        # anonymous: tenant "default"
    root = browsers["root"]

    async def scenario():
        comm = socket("/ws/metrics/", root)
        connected, _ = await comm.connect()
        assert connected
        await receive_until(comm, lambda m: ok(m) and health(m) == {first: "ok", second: "ok", third: "ok"},
                            timeout=10)
        if known == "learned":
            deadline = time.monotonic() + 5
            while set(endpoints.learned) != {nodes[1].admin_url, nodes[2].admin_url}:
                assert time.monotonic() < deadline, f"the hub learned {endpoints.learned} only"
                await asyncio.sleep(0.05)
        assert endpoints.current == nodes[0].admin_url          # the node the console used first
        nodes[0].kill()
        # a kick through the console, right away
        kick = await database_sync_to_async(root.post)(f"/tenants/default/clients/{cid}/kick/", {})
        # the dashboard goes on: the survivors' numbers, the dead node not ok
        after = await receive_until(comm, lambda m: ok(m) and health(m).get(second) == "ok"
                                    and health(m).get(third) == "ok" and health(m).get(first) != "ok", timeout=5)
        alarmed = await receive_until(comm, lambda m: ok(m) and nodes_down(m), timeout=10)
        later = [await receive_until(comm, ok, timeout=3) for _ in range(8)]        # 2 s more
        await comm.disconnect()
        return kick, after, alarmed, later

    kick, after, alarmed, later = run(scenario)
    assert kick.status_code == 302, kick.content.decode()[-2000:]
    reason, _ = device.expect_disconnect()
    assert reason.value == 0x98                                     # Administrative action
    assert after["nodes_ok"] == 2
    assert nodes_down(alarmed) == {first}
    assert all(nodes_down(m) == {first} and health(m)[second] == health(m)[third] == "ok" for m in later)
    (alarm,) = Alarm.objects.filter(kind="node_down", cleared_at__isnull=True)
    assert alarm.subject == first and first in alarm.message
    assert endpoints.current in (nodes[1].admin_url, nodes[2].admin_url)
    # the live pages read the cluster through a survivor
    page = root.get("/clients/").content.decode()
    assert "brokerd's admin API is unreachable" not in page


def test_a_hung_node_is_the_only_one_alarmed_and_the_dashboard_resumes_from_a_survivor(cluster, settings,  # noqa: F811
                                                                                     browsers):
    """SIGSTOP: the node the console used accepts connections and never answers;
    the survivors themselves wait up to 5 s for it when they gather the
    cluster's numbers, so the dashboard pauses (about 7 s here) and resumes
    from a survivor with only the stopped node down -- never "unreachable"."""
    cluster.env = {**(cluster.env or {}), "BROKERD_ADMIN_TOKEN": TOKEN}
    nodes = cluster.start(3, "--admin", "127.0.0.1:0", "--sys-interval", "0")
    first, second, third = (cluster.name(n) for n in nodes)
    settings.BROKERD_ADMIN_URL = ",".join(n.admin_url for n in nodes)
    settings.BROKERD_ADMIN_TOKEN = TOKEN
    settings.METRICS_POLL_INTERVAL = 0.25
    cid = f"kickme-{time.monotonic_ns()}"
    device = Paho(cid, version=mqtt.MQTTv5).connect(nodes[2].port())
    root = browsers["root"]

    async def scenario():
        comm = socket("/ws/metrics/", root)
        connected, _ = await comm.connect()
        assert connected
        await receive_until(comm, lambda m: ok(m) and health(m) == {first: "ok", second: "ok", third: "ok"},
                            timeout=10)
        sigstop(nodes[0].proc.pid)
        seen = [await receive_until(comm, lambda m: m.get("type") == "update", timeout=15)]
        while not nodes_down(seen[-1]):
            seen.append(await receive_until(comm, lambda m: m.get("type") == "update", timeout=15))
        kick = await database_sync_to_async(root.post)(f"/tenants/default/clients/{cid}/kick/", {})
        seen += [await receive_until(comm, lambda m: m.get("type") == "update", timeout=5) for _ in range(8)]
        await comm.disconnect()
        return seen, kick

    try:
        seen, kick = run(scenario)
    finally:
        nodes[0].kill()                 # SIGKILL ends a stopped process too
    assert [m["state"] for m in seen] == ["ok"] * len(seen)
    assert all(health(m).get(second) == health(m).get(third) == "ok" and health(m).get(first) != "ok"
               for m in seen)
    assert {s for m in seen for s in nodes_down(m)} == {first}
    assert kick.status_code == 302, kick.content.decode()[-2000:]
    assert device.expect_disconnect()[0].value == 0x98

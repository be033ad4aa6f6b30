"""Alarms raised and cleared by the hub from a real brokerd: a tenant at its
connection quota, a node that stops answering. Both also reach the sockets
and the database (open, then kept as history)."""

import asyncio
import signal
import threading
import time

import pytest

from metrics.models import Alarm

from ..procs import sigstop
from .conftest import TOKEN, receive_until, run, socket

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def ok(msg):
    return msg.get("type") == "update" and msg.get("state") == "ok"


def quota_alarms(msg):
    return [a for a in msg.get("alarms", []) if a["kind"] == "quota" and a["subject"] == "tiny:max_connections"]


def test_tenant_at_its_connection_quota_raises_and_clearing_follows(live, browsers, device):
    """tiny may hold 2 connections: 2 devices connected -> alarm (100% >= 90%);
    one disconnects -> cleared, kept as history."""
    a = device("tiny/t0")

    async def scenario():
        comm = socket("/ws/metrics/tenants/tiny/", browsers["tina"])
        connected, _ = await comm.connect()
        assert connected
        first = await receive_until(comm, lambda m: ok(m) and m["totals"]["connections"] == 1)
        assert quota_alarms(first) == []
        b = await asyncio.to_thread(device, "tiny/t1")
        raised = await receive_until(comm, lambda m: ok(m) and quota_alarms(m), timeout=5)
        await asyncio.to_thread(b.disconnect)
        cleared = await receive_until(comm, lambda m: ok(m) and not quota_alarms(m), timeout=5)
        await comm.disconnect()
        return first, raised, cleared

    first, raised, cleared = run(scenario)
    assert first["quota"]["max_connections"] == 2
    (alarm,) = quota_alarms(raised)
    assert alarm["tenant"] == "tiny"
    assert "2 connections of its quota of 2 (100%, max_connections)" in alarm["message"]
    assert cleared["totals"]["connections"] == 1
    row = Alarm.objects.get(kind="quota", subject="tiny:max_connections")
    assert row.cleared_at is not None and row.cleared_at > row.raised_at
    assert row.tenant.slug == "tiny" and row.tenant_slug == "tiny"
    a.disconnect()


def test_tenant_alarm_not_sent_to_other_tenants(live, browsers, device):
    device("tiny/t0")
    device("tiny/t1")

    async def scenario():
        tiny = socket("/ws/metrics/tenants/tiny/", browsers["tina"])
        acme = socket("/ws/metrics/tenants/acme/", browsers["alice"])
        await tiny.connect()
        await acme.connect()
        await receive_until(tiny, lambda m: ok(m) and quota_alarms(m))
        other = await receive_until(acme, ok)
        await tiny.disconnect()
        await acme.disconnect()
        return other

    assert run(scenario)["alarms"] == []


def test_node_that_stops_answering_raises_node_down_and_clears_when_back(settings, browsers, plane, secrets):
    """A second node of its own (SIGSTOP: the process is there, nothing answers)."""
    settings.METRICS_POLL_INTERVAL = 0.25
    settings.METRICS_ALARM_NODE_DOWN_AFTER = 1
    node = plane.broker("--admin", "127.0.0.1:0", "--node-id", "frozen1")
    settings.BROKERD_ADMIN_URL = node.admin_url
    settings.BROKERD_ADMIN_TOKEN = TOKEN

    def down(m):
        return m.get("type") == "update" and any(a["kind"] == "node_down" and a["subject"] == "frozen1"
                                                 for a in m.get("alarms", []))

    try:
        async def scenario():
            comm = socket("/ws/metrics/", browsers["root"])
            await comm.connect()
            await receive_until(comm, ok)
            sigstop(node.proc.pid)
            unreachable = await receive_until(comm, down, timeout=10)
            node.proc.send_signal(signal.SIGCONT)
            back = await receive_until(comm, lambda m: ok(m) and not down(m), timeout=10)
            await comm.disconnect()
            return unreachable, back

        unreachable, back = run(scenario)
    finally:
        node.proc.send_signal(signal.SIGCONT)
        node.stop()
    assert unreachable["state"] == "unreachable"
    (alarm,) = [a for a in unreachable["alarms"] if a["kind"] == "node_down"]
    assert "node frozen1 does not answer" in alarm["message"]
    assert back["nodes"][0]["health"] == "ok"
    row = Alarm.objects.get(kind="node_down", subject="frozen1")
    assert row.cleared_at is not None and row.tenant is None


def test_drops_rising_raised_while_a_device_keeps_being_denied_then_cleared(live, settings, browsers, device):
    """strict allows only ok/#: a device publishing elsewhere ~40 times a second
    is dropped (ACL denied) -> "drops rising" after 1 s at >= 5/s; quiet -> cleared."""
    settings.METRICS_ALARM_DROPS_RATE = 5
    settings.METRICS_ALARM_DROPS_FOR = 1
    settings.METRICS_ALARM_DROPS_CLEAR_FOR = 1
    from metrics.hub import get_hub

    get_hub().reset()                              # the thresholds above
    d = device("strict/s0")
    stop = threading.Event()

    def deny_forever():
        while not stop.is_set():
            d.publish("forbidden/x", b"x", qos=0)
            time.sleep(0.025)

    def drops(m):
        return [a for a in m.get("alarms", []) if a["kind"] == "drops" and a["subject"] == "strict"]

    async def scenario():
        comm = socket("/ws/metrics/tenants/strict/", browsers["root"])
        await comm.connect()
        await receive_until(comm, ok)
        thread = threading.Thread(target=deny_forever, daemon=True)
        thread.start()
        raised = await receive_until(comm, lambda m: ok(m) and drops(m), timeout=8)
        stop.set()
        await asyncio.to_thread(thread.join, 5)
        cleared = await receive_until(comm, lambda m: ok(m) and not drops(m), timeout=8)
        await comm.disconnect()
        return raised, cleared

    raised, cleared = run(scenario)
    (alarm,) = drops(raised)
    assert "messages dropped per second" in alarm["message"] and "acl denied" in alarm["message"]
    assert raised["rates"]["drops_by_reason"]["acl_denied"] >= 5
    assert cleared["rates"]["drops"] < 5
    row = Alarm.objects.get(kind="drops", subject="strict")
    assert row.cleared_at is not None and row.tenant_slug == "strict"

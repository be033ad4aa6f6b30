"""End to end with real processes: paho devices publish to a running brokerd,
the console's hub polls its admin API (once a second, the default), the
tenant's websocket shows the message count rising within 2 seconds, and
brokerd's Prometheus exposition (``GET /metrics``) has the same counters."""

import asyncio
import re
import threading
import time
import urllib.request

import pytest

from .conftest import TOKEN, receive_until, run, socket

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def prometheus(node) -> str:
    req = urllib.request.Request(node.admin_url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.read().decode()


def prom_sum(text: str, name: str, **labels) -> float:
    """The sum of a metric's samples whose labels include ``labels``."""
    total, found = 0.0, False
    for line in text.splitlines():
        m = re.match(r"^(\w+)\{(.*)\} (\S+)$", line)
        if m and m.group(1) == name:
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            if all(got.get(k) == v for k, v in labels.items()):
                total += float(m.group(3))
                found = True
    assert found, f"no sample {name}{labels}"
    return total


def ok(msg):
    return msg.get("type") == "update" and msg.get("state") == "ok"


def test_published_messages_show_on_the_tenants_socket_within_2_s_and_in_prometheus(live, settings, browsers,
                                                                                   device):
    settings.METRICS_POLL_INTERVAL = 1.0          # as deployed
    sub = device("acme/d0")
    sub.subscribe("e2e/#", qos=1)
    pub = device("acme/d1")
    stop = threading.Event()
    sent = []

    def publish_for_a_while():
        i = 0
        while not stop.is_set():
            for _ in range(20):
                pub.publish("e2e/x", b"%d" % i, qos=1)
                i += 1
            sent.append((time.monotonic(), i))
            time.sleep(0.1)

    async def scenario():
        comm = socket("/ws/metrics/tenants/acme/", browsers["alice"])
        connected, _ = await comm.connect()
        assert connected
        base = (await receive_until(comm, ok))["totals"]["msgs_in"]
        thread = threading.Thread(target=publish_for_a_while, daemon=True)
        started = time.monotonic()
        thread.start()
        first = await receive_until(comm, lambda m: ok(m) and m["totals"]["msgs_in"] > base, timeout=2.0)
        seen_after = time.monotonic() - started
        counts = [first["totals"]["msgs_in"]]
        rates = [first["rates"]["msgs_in"]]
        while len(counts) < 4:
            m = await receive_until(comm, ok, timeout=3.0)
            counts.append(m["totals"]["msgs_in"])
            rates.append(m["rates"]["msgs_in"])
        stop.set()
        await asyncio.to_thread(thread.join, 5)
        # quiet now: the next updates settle on the final count; compare with Prometheus
        await asyncio.sleep(1.5)
        text = await asyncio.to_thread(prometheus, live)
        settled = await receive_until(comm, ok, timeout=3.0)
        await comm.disconnect()
        return seen_after, base, counts, rates, settled, text

    seen_after, base, counts, rates, settled, text = run(scenario)
    assert seen_after < 2.0
    assert counts == sorted(counts) and counts[-1] > counts[0] > base          # rising
    assert max(rates[1:]) > 50                                                # ~200 msg/s published
    total_sent = sent[-1][1]
    assert settled["totals"]["msgs_in"] - base == total_sent
    # the same counters in brokerd's Prometheus exposition, tenant as a label
    assert prom_sum(text, "brokerd_messages_received_total", tenant="acme") == settled["totals"]["msgs_in"]
    assert prom_sum(text, "brokerd_messages_received_total", tenant="acme", qos="1") == \
        settled["totals"]["msgs_in_qos"][1]
    assert prom_sum(text, "brokerd_messages_sent_total", tenant="acme") == settled["totals"]["msgs_out"]
    assert prom_sum(text, "brokerd_bytes_received_total", tenant="acme") == settled["totals"]["bytes_in"]
    assert prom_sum(text, "brokerd_connections", tenant="acme") == settled["totals"]["connections"] == 2
    print(f"\nfirst rise on the socket {seen_after:.2f} s after publishing began; "
          f"{total_sent} messages; peak rate {max(rates):.0f} msg/s")

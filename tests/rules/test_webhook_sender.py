"""The webhook sender's own rules, without a network: which destinations the
allowance accepts (on resolved addresses), and the byte bounds of its buffer
(drop-oldest, per tenant and per node). The end-to-end behaviour is in
test_webhook_e2e.py."""

import asyncio
import socket
import ssl

import pytest
import trustme

from brokerd.config import ConfigError, load
from brokerd.integrations.webhook import Allowance, Refused, WebhookSender
from brokerd.rules.actions import WebhookRequest


class State:
    """A rule's counters, as the sender sees them (RuleState's fields)."""

    def __init__(self):
        self.sent = self.retried = self.dropped = self.failed = 0
        self.last_error = None

    def fail(self, error, wall):
        self.failed += 1
        self.last_error = error


def request(body: bytes, host="hooks.example.com", port=80) -> WebhookRequest:
    return WebhookRequest("POST", "http", host, port, "/", (), body, 5.0, 0)


@pytest.mark.parametrize("address, ok", [
    ("93.184.216.34", True), ("2606:2800:220:1::1", True),
    ("127.0.0.1", False), ("10.1.2.3", False), ("172.16.0.1", False), ("192.168.1.1", False),
    ("169.254.169.254", False), ("100.64.0.1", False), ("0.0.0.0", False), ("224.0.0.1", False),
    ("::1", False), ("fc00::1", False), ("fe80::1", False), ("::ffff:127.0.0.1", False), ("::ffff:10.0.0.1", False),
])
def test_by_default_only_public_addresses_are_allowed(address, ok):
    allowance = Allowance("public")
    if ok:
        allowance.check("hooks.example.com", 443, address)
    else:
        with pytest.raises(Refused, match="is not an allowed destination"):
            allowance.check("hooks.example.com", 443, address)


def test_listed_addresses_names_and_the_nodes_own_ports():
    allowance = Allowance("10.1.0.0/16, 127.0.0.1 hooks.internal .corp.example", own_ports=[1883, 8081],
                          own_hosts=["127.0.0.1", "10.1.0.9"])
    allowance.check("x", 80, "10.1.200.7")                       # in the CIDR
    allowance.check("x", 8080, "127.0.0.1")
    allowance.check("hooks.internal", 80, "192.168.5.5")         # a listed name: its private address too
    allowance.check("a.b.corp.example", 80, "172.16.1.1")        # a listed domain's subdomain
    for host, port, address, says in [
        ("x", 80, "93.184.216.34", "not an allowed destination"),     # no 'public' in this list
        ("evil.example", 80, "192.168.5.5", "not an allowed destination"),   # the address of a listed name, another name
        ("hooks.internal", 80, "169.254.169.254", "not an allowed destination"),   # a name never reaches metadata
        ("hooks.internal", 80, "127.0.0.5", "not an allowed destination"),          # ... nor loopback
        ("corp.example", 80, "172.16.1.1", "not an allowed destination"),   # '.corp.example': subdomains only
        ("x", 1883, "127.0.0.1", "this node's own port"),             # allowed address, the node's own port
        ("x", 8081, "10.1.0.9", "this node's own port"),
    ]:
        with pytest.raises(Refused, match=says):
            allowance.check(host, port, address)
    with pytest.raises(Refused):
        Allowance("").check("x", 80, "93.184.216.34")                # an empty list: nowhere


def test_every_resolved_address_is_checked():
    seen = []

    async def resolve(host, port):
        seen.append(host)
        return [(2, 1, 6, "", ("93.184.216.34", port)), (2, 1, 6, "", ("10.0.0.1", port))]

    sender = WebhookSender(Allowance("public"), 1 << 20, 1 << 16, 1, resolve=resolve)
    with pytest.raises(Refused, match=r"10\.0\.0\.1"):       # a name may not mix an allowed address with others
        asyncio.run(sender._send(request(b"{}")))
    assert seen == ["hooks.example.com"]


def test_https_with_a_trusted_certificate_is_sent_with_the_host_name_verified():
    from .test_webhook_e2e import Hook

    ca = trustme.CA()
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("hooks.test").configure_cert(server_side)
    hook = Hook(tls=server_side)

    async def resolve(host, port):                 # hooks.test is 127.0.0.1 here
        return [(2, 1, 6, "", ("127.0.0.1", port))]

    async def send(host):
        sender = WebhookSender(Allowance("127.0.0.1"), 1 << 20, 1 << 16, 1, resolve=resolve)
        sender._ssl = ssl.create_default_context()
        ca.configure_trust(sender._ssl)            # the node's trust store, with the test CA in it
        req = WebhookRequest("POST", "https", host, hook.port, "/t?x=1", (("X-A", "b"),), b"{}", 5.0, 0)
        return await sender._send(req)

    try:
        assert asyncio.run(send("hooks.test")) == 200
        method, path, headers, body = hook.next()
        assert (method, path, headers["X-A"], headers["Host"], body) == (
            "POST", "/t?x=1", "b", f"hooks.test:{hook.port}", b"{}")
        with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
            asyncio.run(send("other.test"))        # the certificate is checked against the URL's host
    finally:
        hook.close()


def test_the_settings_come_from_flags_environment_and_are_checked():
    cfg = load([], environ={"BROKERD_RULES_WEBHOOK_ALLOW": "127.0.0.1,hooks.internal",
                            "BROKERD_RULES_WEBHOOK_BUFFER": "1048576", "BROKERD_RULES_WEBHOOK_TENANT_BUFFER": "65536",
                            "BROKERD_RULES_WEBHOOK_CONCURRENCY": "4"})
    assert (cfg.rules_webhook_allow, cfg.rules_webhook_buffer, cfg.rules_webhook_tenant_buffer,
            cfg.rules_webhook_concurrency) == ("127.0.0.1,hooks.internal", 1048576, 65536, 4)
    default = load([], environ={})
    assert (default.rules_webhook_allow, default.rules_webhook_buffer, default.rules_webhook_tenant_buffer,
            default.rules_webhook_concurrency) == ("public", 16 << 20, 1 << 20, 16)
    for argv, says in [(["--rules-webhook-allow", "not a host!"], "--rules-webhook-allow"),
                       (["--rules-webhook-tenant-buffer", "2048", "--rules-webhook-buffer", "1024"], "at most"),
                       (["--rules-webhook-concurrency", "0"], "1..1024")]:
        with pytest.raises(ConfigError, match=says):
            load(argv, environ={})


def test_the_buffer_is_bounded_in_bytes_and_drops_the_oldest():
    async def scenario():
        sender = WebhookSender(Allowance("public"), node_bytes=4000, tenant_bytes=2000, concurrency=1)
        a, b, c = State(), State(), State()
        for i in range(10):                                  # 10 x ~600 bytes into a 2000-byte tenant buffer
            sender.submit("acme", request(b"%03d" % i + b"x" * 533), a)
        assert sender.queued["acme"] <= 2000 and sender.total == sender.queued["acme"]
        kept = [bytes(j.item.body[:3]) for j in sender.queues["acme"]]
        assert kept == [b"007", b"008", b"009"]              # the newest kept, the oldest dropped
        assert (a.dropped, a.failed, sender.dropped) == (7, 7, 7)
        assert a.last_error == "dropped: the tenant's webhook buffer was full (oldest dropped)"
        for _ in range(3):
            sender.submit("globex", request(b"x" * 536), b)
        assert sender.total <= 4000
        sender.submit("initech", request(b"y" * 536), c)     # the node is full: the biggest tenant pays
        assert sender.total <= 4000 and c.dropped == 0 and len(sender.queues["initech"]) == 1
        assert a.dropped + b.dropped == 8
        sender.submit("initech", request(b"z" * 5000), c)    # larger than any buffer: dropped at once
        assert c.dropped == 1 and c.last_error == "dropped: larger than the webhook buffer"
        await sender.close()

    asyncio.run(scenario())


def test_one_tenant_holds_at_most_half_the_workers():
    async def scenario():
        sender = WebhookSender(Allowance("public"), 1 << 20, 1 << 16, concurrency=4)
        release = asyncio.Event()
        busy: list = []

        async def deliver(job):                     # an endpoint that hangs until released
            busy.append(job.tenant)
            await release.wait()

        sender._deliver = deliver
        state = State()
        for _ in range(5):
            sender.submit("acme", request(b"{}"), state)
        sender.submit("globex", request(b"{}"), state)
        for _ in range(10):
            await asyncio.sleep(0)
        assert sorted(busy) == ["acme", "acme", "globex"]     # acme waits at 2 of 4, globex is served
        assert len(sender.queues["acme"]) == 3
        release.set()
        for _ in range(20):
            await asyncio.sleep(0)
        assert busy.count("acme") == 5 and not sender.queues and not sender.inflight
        await sender.close()

    asyncio.run(scenario())


def host_address() -> str | None:
    """An address of this host that is not loopback (a socket is bound to it; nothing is sent)."""
    import socket
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))                  # picks the outgoing interface; sends nothing
            address = s.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


def test_a_node_listening_on_every_address_refuses_its_own_ports_on_each_of_them():
    """A node bound to 0.0.0.0 takes its MQTT, admin and link ports on
    every address of its host. Its own ports were refused on loopback only:
    with private addresses allowed (--rules-webhook-allow 10.0.0.0/8, for
    internal services), a tenant's webhook could call the node's admin API
    or link port on the host's own private address. Only deciding: no
    request is made."""
    mine = host_address()
    if mine is None:
        pytest.skip("this host has no address but loopback")
    allowance = Allowance(f"{mine}/32, 203.0.113.0/24", own_ports=[1883, 8081], own_hosts=["0.0.0.0"])
    for port in (1883, 8081):
        with pytest.raises(Refused, match="this node's own port"):
            allowance.check("node.internal", port, mine)
    allowance.check("node.internal", 8443, mine)                   # another service of the host: allowed
    allowance.check("hooks.internal", 1883, "203.0.113.7")          # another host's port 1883: allowed
    only_loopback = Allowance(f"{mine}/32", own_ports=[1883], own_hosts=["127.0.0.1"])
    only_loopback.check("node.internal", 1883, mine)               # the node is not on that address


class _Listening:
    """Listening sockets, as a server's ``sockets``, closed by ``close()``."""

    def __init__(self, *addresses):
        self.sockets = []
        for host in addresses:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sock.listen(1)
            self.sockets.append(sock)

    def port(self, i: int = 0) -> int:
        return self.sockets[i].getsockname()[1]

    def close(self):
        for sock in self.sockets:
            sock.close()


def _node(allowance, mqtt, admin=None, links=None):
    from types import SimpleNamespace

    return SimpleNamespace(
        servers=[mqtt], admin=admin and SimpleNamespace(sockets=lambda: admin.sockets),
        cluster=links and SimpleNamespace(peers=SimpleNamespace(sockets=lambda: links.sockets)),
        webhooks=SimpleNamespace(allowance=allowance))


def test_the_node_link_port_is_refused_as_bound_not_as_configured():
    """--cluster-listen 0.0.0.0:0 (port 0, any: the default's) listens on a
    port the OS picks, but the node's own ports were taken from the setting:
    port 0, so none -- with private addresses allowed, a tenant's webhook
    could call the node's link port on the host's own address (or on
    loopback with 127.0.0.0/8 allowed). Only deciding: no request is made."""
    from brokerd.server import Server

    allowance = Allowance("127.0.0.0/8")
    mqtt, links = _Listening("127.0.0.1"), _Listening("0.0.0.0")
    try:
        Server._own_ports(_node(allowance, mqtt, links=links))
        for port in (mqtt.port(), links.port()):
            with pytest.raises(Refused, match="this node's own port"):
                allowance.check("node.internal", port, "127.0.0.1")
        allowance.check("hooks.internal", 8080, "127.0.0.1")       # another service of the host: allowed
        mine = host_address()
        if mine is not None:
            with pytest.raises(Refused, match="this node's own port"):
                Allowance(f"{mine}/32", own_ports=allowance.own_ports, own_hosts=["0.0.0.0"]).check(
                    "n", links.port(), mine)
    finally:
        mqtt.close()
        links.close()


def test_listeners_named_by_host_name_and_a_workers_shared_admin_port_are_the_nodes_own():
    """The node's own addresses were the settings' host strings, and a host
    name is no address: a node listening on ``mqtt://node.internal:1883``
    (the host's private address) had its ports refused on loopback only, so
    with private addresses allowed a tenant's webhook could call its MQTT,
    admin or link port on that address. And a worker's admin API listens on
    the host's shared port and on one of its own: only its own was refused,
    the shared one (the one users reach) was allowed on loopback with
    127.0.0.0/8 allowed. Now the listening sockets' addresses and ports are
    taken, whatever the settings name. Only deciding: no request is made."""
    from brokerd.server import Server

    mine = host_address()
    if mine is None:
        pytest.skip("this host has no address but loopback")
    allowance = Allowance(f"{mine}/32, 127.0.0.0/8")
    mqtt, admin = _Listening(mine), _Listening("127.0.0.1", "127.0.0.1")   # admin: shared port, own port
    try:
        Server._own_ports(_node(allowance, mqtt, admin=admin))
        with pytest.raises(Refused, match="this node's own port"):
            allowance.check("node.internal", mqtt.port(), mine)
        for i in (0, 1):
            with pytest.raises(Refused, match="this node's own port"):
                allowance.check("localhost", admin.port(i), "127.0.0.1")
        allowance.check("hooks.internal", 8080, mine)               # another service of the host: allowed
    finally:
        mqtt.close()
        admin.close()

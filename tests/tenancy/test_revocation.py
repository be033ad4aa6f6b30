"""A device's rights taken away in the console while it is connected (its secret
rotated, the device disabled or deleted, its tenant suspended) and a device that
takes over its own connection at the tenant's connection quota: what the device
and the rest of its tenant see, on a real node."""

import time

import pytest

from ..mqtt import V5, V311, PacketTypes, PahoClient, props
from .test_enforcement import connack_code, wait_until

ALLOW = [{"topic": "#", "action": "both", "allow": True}]


def client(secrets, who, version=V5, client_id=None, clean=True, secret=None):
    return PahoClient(client_id or f"{who.replace('/', '-')}-{time.monotonic_ns()}", version, clean=clean,
                      username=who, password=secret if secret is not None else secrets[who])


@pytest.fixture
def acme(control_plane):
    secrets = control_plane.provision([{"slug": "acme", "acl": ALLOW, "devices": ["watcher", "dev2"]},
                                       {"slug": "small", "acl": ALLOW, "devices": ["d"],
                                        "quota": {"max_connections": 1}}])
    node = control_plane.broker()
    yield control_plane, node, secrets
    node.stop()


def test_rotating_a_secret_disconnects_the_client_that_used_the_old_one(acme):
    """``devices rotate``: "the old one stops working at commit" -- the connection made with it too
    (a leaked secret is rotated to shut its holder out; Mosquitto's dynsec kicks on a new password)."""
    cp, node, secrets = acme
    port = node.port()
    old = client(secrets, "acme/dev2").connect(port)
    new_secret = cp.manage("devices", "rotate", "acme", "dev2").stdout.strip().splitlines()[-1]
    reason, _ = old.expect_disconnect(timeout=5)
    assert reason.value == 0x87
    assert connack_code(client(secrets, "acme/dev2"), port) == 0x86
    assert connack_code(client(secrets, "acme/dev2", secret=new_secret), port) == 0
    # a device on the new secret stays through a later change
    with client(secrets, "acme/dev2", secret=new_secret).connect(port) as fresh:
        cp.manage("acl", "add", "acme", "--deny", "--action", "publish", "--topic", "nothing/here")
        fresh.expect_none(1.5)
        assert fresh.disconnects.empty()


def _mtls(cp, tmp_path, cn: str):
    """A node of ``cp`` with a mutual-TLS listener, and a certificate of the listener's CA with CN
    ``cn``: -> (node, its fingerprint, cam(username=None) making a client presenting it)."""
    import hashlib
    import ssl

    import trustme

    from ..pki import write_cert
    from ..procs import BrokerProcess

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    server, server_key = write_cert(ca.issue_cert("127.0.0.1"), tmp_path, "server")
    issued = ca.issue_cert(cn, common_name=cn)
    cert, key = write_cert(issued, tmp_path, "cam")
    der = ssl.PEM_cert_to_DER_cert(issued.cert_chain_pems[0].bytes().decode())
    node = BrokerProcess("--sys-interval", "0", "--tls-cert", server, "--tls-key", server_key,
                         "--tls-ca", str(tmp_path / "ca.pem"), "--tls-verify-client", "required",
                         listen=("mqtts://127.0.0.1:0",), anonymous=False, env=cp.env)

    def cam(username=None):
        c = PahoClient(f"cam-{time.monotonic_ns()}", V5, username=username)
        c.client.tls_set(ca_certs=str(tmp_path / "ca.pem"), certfile=cert, keyfile=key)
        return c

    return node, hashlib.sha256(der).hexdigest(), cam


def test_a_device_whose_certificate_is_replaced_in_the_console_is_disconnected(control_plane, tmp_path):
    """A device on a mutual-TLS listener, matched by its certificate's fingerprint (no user name) or
    by its CN (user name, no password): the console gives the device another certificate -- the old
    one lost or leaked -- and the connection made with the old one goes, as a revoked secret's does."""
    cp = control_plane
    node, fp, cam = _mtls(cp, tmp_path, "cam-1.example")
    cp.provision([{"slug": "acme", "acl": ALLOW, "devices": ["watcher"]}])
    cp.manage_each(("devices", "create", "acme", "cam", "--cert-fingerprint", fp),     # (one Django start-up)
                   ("devices", "create", "acme", "cam2", "--cert-cn", "cam-1.example"))
    node.start()
    try:
        port = node.port("mqtts")
        by_fp, by_cn = cam().connect(port), cam("acme/cam2").connect(port)
        cp.shell("from tenants import services, queries\n"
                 "t = queries.get_tenant('acme')\n"
                 "services.update_device(queries.get_device(t, 'cam'), cert_fingerprint='ab' * 32)\n"
                 "services.update_device(queries.get_device(t, 'cam2'), cert_cn='cam-2.example')\n")
        for c in (by_fp, by_cn):
            reason, _ = c.expect_disconnect(timeout=5)
            assert reason.value == 0x87
        assert connack_code(cam(), port) == 0x86
        assert connack_code(cam("acme/cam2"), port) == 0x86
    finally:
        node.stop()


def test_a_certificate_cn_names_one_device_on_the_platform(control_plane, tmp_path):
    """The listener's CA is every tenant's. Two tenants whose devices named the same CN ("gateway-1"
    is a likely name) were each a certificate away from the other's device: the holder of globex's
    certificate logged in as acme's device by its user name. The console now refuses a CN another
    device has (as it refuses a fingerprint), and a CN two devices still name from before
    identifies neither: a node lets neither in by it."""
    cp = control_plane
    node, _, cam = _mtls(cp, tmp_path, "gateway-1")
    cp.provision([{"slug": "acme", "acl": ALLOW, "devices": []}, {"slug": "globex", "acl": ALLOW, "devices": []}])
    cp.manage("devices", "create", "acme", "gw", "--cert-cn", "gateway-1")
    refused = cp.manage("devices", "create", "globex", "gw", "--cert-cn", "gateway-1", check=False)
    assert refused.returncode != 0 and "certificate CN already in use by a device of another tenant" in refused.stderr
    node.start()
    try:
        port = node.port("mqtts")
        cam("acme/gw").connect(port).disconnect()                 # the CN's one device
        # a duplicate from before the console refused them (written past the service's check)
        cp.shell("from tenants import policy_snapshot, queries\n"
                 "from tenants.models import Device\n"
                 "t = queries.get_tenant('globex')\n"
                 "Device.objects.create(tenant=t, name='gw', cert_cn='gateway-1')\n"
                 "policy_snapshot.publish_devices(t, ['gw'])\n")
        # (its own device asked first: refusals count towards the address's failed-login throttle)
        wait_until(lambda: connack_code(cam("acme/gw"), port) == 0x86, 5)   # not its own device ...
        assert connack_code(cam("globex/gw"), port) == 0x86                # ... nor the other tenant's
    finally:
        node.stop()


@pytest.mark.parametrize("change", [("devices", "disable", "acme", "dev2"), ("devices", "delete", "acme", "dev2")])
def test_the_will_of_a_device_disconnected_for_its_revoked_rights_is_not_published(acme, change):
    """As Mosquitto's dynsec kicks a deleted or disabled client: without its will. The will is the
    device's PUBLISH, and the device may publish nothing any more."""
    cp, node, secrets = acme
    port = node.port()
    with client(secrets, "acme/watcher").connect(port) as watcher:
        watcher.subscribe("dev2/#", 1)
        dev2 = client(secrets, "acme/dev2").connect(port, will=("dev2/status", b"offline", 1))
        cp.manage(*change)
        reason, _ = dev2.expect_disconnect(timeout=5)
        assert reason.value == 0x87
        watcher.expect_none(1.0)


def test_a_delayed_will_of_a_device_disabled_meanwhile_is_not_published(acme):
    cp, node, secrets = acme
    port = node.port()
    with client(secrets, "acme/watcher").connect(port) as watcher:
        watcher.subscribe("dev2/#", 1)
        dev2 = client(secrets, "acme/dev2")
        dev2.client.will_set("dev2/status", b"offline", 1,
                             properties=props(PacketTypes.WILLMESSAGE, WillDelayInterval=8))
        dev2.connect(port, properties=props(PacketTypes.CONNECT, SessionExpiryInterval=60))
        dev2.drop()                                      # the will is due in 8 s
        due = time.monotonic() + 8
        cp.manage("devices", "disable", "acme", "dev2")
        # the node has the device disabled (a busy machine's manage.py and poll can take seconds; the
        # will must still be pending then for the test to mean anything) ...
        wait_until(lambda: connack_code(client(secrets, "acme/dev2", client_id="probe"), port) == 0x87, 6)
        assert time.monotonic() < due - 1, "the device was disabled too late to test its delayed will"
        watcher.expect_none(due - time.monotonic() + 1.5)    # ... and its will, due meanwhile, never comes


def test_the_will_of_a_suspended_tenants_device_is_not_published(acme):
    """A stored session of the tenant would have queued it and had it at the resume."""
    cp, node, secrets = acme
    port = node.port()
    cid = f"watcher-{time.monotonic_ns()}"
    stored = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    watcher = client(secrets, "acme/watcher", client_id=cid, clean=False).connect(port, properties=stored)
    watcher.subscribe("dev2/#", 1)
    watcher.disconnect()
    dev2 = client(secrets, "acme/dev2").connect(port, will=("dev2/status", b"offline", 1))
    cp.manage("tenants", "suspend", "acme")
    reason, _ = dev2.expect_disconnect(timeout=5)
    assert reason.value == 0x87
    cp.manage("tenants", "resume", "acme")
    back = client(secrets, "acme/watcher", client_id=cid, clean=False)
    wait_until(lambda: connack_code(client(secrets, "acme/watcher"), port) == 0, what="resume")
    with back.connect(port, properties=stored):
        assert back.session_present
        back.expect_none(1.0)


@pytest.mark.parametrize("version", [V5, V311])
def test_a_device_taking_over_its_own_connection_at_the_connection_quota_is_let_in(acme, version):
    """max_connections 1, the device's connection half-open (it reconnects before the node saw the old
    one die): its new CONNECT with the same client id replaces the old connection -- the tenant's
    count does not grow -- so it is taken over (0x8E), not refused 0x97 until the keepalive ends."""
    cp, node, secrets = acme
    port = node.port()
    cid = f"d-{time.monotonic_ns()}"
    old = client(secrets, "small/d", version, client_id=cid)
    old.client.reconnect_delay_set(60, 120)          # (paho would come back and take the id over again)
    old.connect(port)
    new = client(secrets, "small/d", version, client_id=cid).connect(port)
    try:
        if version == V5:
            reason, _ = old.expect_disconnect(timeout=5)
            assert reason.value == 0x8E
        # still one connection: another client id is over the quota
        assert connack_code(client(secrets, "small/d", version), port) in (0x97, 3)
    finally:
        new.disconnect()
        old.disconnect()
    wait_until(lambda: connack_code(client(secrets, "small/d", version), port) == 0, what="room again")


def test_a_quota_lowered_in_the_console_holds_for_connected_clients(acme):
    """max_payload and max_subscriptions lowered while a device is connected: its next SUBSCRIBE
    over the new count is refused 0x97 (those it has stay), its next PUBLISH over the new size
    gets DISCONNECT 0x95."""
    cp, node, secrets = acme
    port = node.port()
    c = client(secrets, "acme/dev2").connect(port)
    assert [x.value for x in c.subscribe("a", 1)] == [1]
    assert [x.value for x in c.subscribe("b", 1)] == [1]
    c.publish("dev2/t", b"x" * 50, qos=1)
    cp.manage("tenants", "quota", "acme", "--max-payload", "10", "--max-subscriptions", "1")
    n = iter(range(1000))
    wait_until(lambda: c.subscribe(f"c{next(n)}", 1)[0].value == 0x97, timeout=5, what="the new quota")
    assert [x.value for x in c.subscribe("a", 0)] == [0]           # one it has: replaced, not a new one
    c.client.publish("dev2/t", b"x" * 50, qos=1)
    reason, _ = c.expect_disconnect(timeout=5)
    assert reason.value == 0x95


def test_changes_to_a_tenants_policy_do_not_refill_its_tenant_rate(control_plane):
    """tenant_msgs_in 10/s: 100 QoS 1 messages take about 9 s, whatever else the tenant's
    administrators change meanwhile (here its max_delayed, 4 times a second). Every change used to
    give the tenant's shared buckets a full second's worth again (and forgive their debt)."""
    import subprocess
    import sys

    from ..procs import ROOT

    secrets = control_plane.provision([{"slug": "acme", "default_acl": "allow", "devices": ["d"],
                                        "quota": {"tenant_msgs_in": 10}}])
    node = control_plane.broker()
    churn = subprocess.Popen(
        [sys.executable, "manage.py", "shell", "-c",
         "import sys, time\nfrom tenants import services, queries\nt = queries.get_tenant('acme')\n"
         "print('READY', flush=True)\nsys.stdin.readline()\n"
         "for i in range(24):\n    services.update_quota(t, max_delayed=1000 + i)\n    time.sleep(0.25)\n"],
        cwd=ROOT, env=control_plane.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        while churn.stdout.readline().strip() != "READY":
            assert churn.poll() is None, "the console's shell ended"
        with client(secrets, "acme/d").connect(node.port()) as sub, client(secrets, "acme/d").connect(
                node.port()) as pub:
            sub.subscribe("t", 1)
            churn.stdin.write("go\n")
            churn.stdin.flush()
            t0 = time.monotonic()
            for i in range(100):
                pub.client.publish("t", b"%d" % i, qos=1)
            time.sleep(4.0 - (time.monotonic() - t0))
            got = sub.messages.qsize()
        # 10 at once, then 10 a second (and the subscription's own message or two in flight)
        assert got <= 10 + 10 * 4 + 5, f"{got} messages through in 4 s at 10/s"
    finally:
        churn.kill()
        churn.wait()
        node.stop()


def test_expired_retained_messages_do_not_use_up_the_retained_quota(control_plane):
    """max_retained 2, and the tenant's devices retain status messages that expire (MQTT 5 Message
    Expiry Interval): once they have expired -- no subscriber gets them any more -- they leave room
    for others."""
    secrets = control_plane.provision([{"slug": "acme", "default_acl": "allow", "devices": ["d"],
                                        "quota": {"max_retained": 2}}])
    node = control_plane.broker()
    try:
        with client(secrets, "acme/d").connect(node.port()) as c:
            got = {}
            c.client.on_publish = lambda cl, u, mid, rc, p: got.setdefault(mid, rc.value)

            def retain(topic, **kw):
                mid = c.client.publish(topic, b"up", qos=1, retain=True,
                                       properties=props(PacketTypes.PUBLISH, **kw) if kw else None).mid
                wait_until(lambda: mid in got, what="PUBACK")
                return got[mid]

            assert retain("s/1", MessageExpiryInterval=1) in (0, 0x10)
            assert retain("s/2", MessageExpiryInterval=1) in (0, 0x10)
            assert retain("s/3") == 0x97                        # full while they live
            time.sleep(2.2)
            with client(secrets, "acme/d").connect(node.port()) as late:
                late.subscribe("s/#", 1)
                late.expect_none(0.5)                           # expired: nobody gets them
            assert retain("s/3") in (0, 0x10)
            assert retain("s/4") in (0, 0x10)
            assert retain("s/5") == 0x97
    finally:
        node.stop()


def test_a_credential_that_expires_while_its_device_is_connected_ends_the_connection(acme):
    """A credential with an expiry: at that time its connection is disconnected (0x87, without its
    will: its rights ended) and the secret is refused (0x86); the device's other credential goes on.
    (It expires 8 s after it is made: 4 s were not always enough, under a whole suite's load, for the
    policy to reach the node and the device to connect before it ran out. Under load, the refusals
    before the credential reached the node and paho's reconnects after the expiry could add up to
    the lock-out: the last CONNECT was refused 0x9F.)"""
    cp, node, secrets = acme
    port = node.port()
    out = cp.shell("import datetime\nfrom django.utils import timezone\nfrom tenants import services, queries\n"
                   "d = queries.get_device(queries.get_tenant('acme'), 'dev2')\n"
                   "c, secret = services.create_credential(d, expires_at=timezone.now() + "
                   "datetime.timedelta(seconds=8))\nprint('SECRET', secret)\n")
    short = [ln.split(" ", 1)[1] for ln in out.splitlines() if ln.startswith("SECRET ")][-1]
    with client(secrets, "acme/watcher").connect(port) as watcher:
        watcher.subscribe("dev2/#", 1)
        # each refusal until the node has the credential counts towards the lock-out of the user name
        # (FAIL_LIMIT, 10): tried at the node's poll interval, not every 50 ms
        wait_until(lambda: connack_code(client(secrets, "acme/dev2", secret=short), port) == 0 or time.sleep(0.5),
                   timeout=7, what="the credential")
        dev2 = client(secrets, "acme/dev2", secret=short).connect(port, will=("dev2/status", b"offline", 1))
        lasting = client(secrets, "acme/dev2").connect(port)
        reason, _ = dev2.expect_disconnect(timeout=14)
        assert reason.value == 0x87
        dev2.disconnect()        # paho's thread would reconnect with the expired secret: more refusals
        watcher.expect_none(1.0)
        assert lasting.disconnects.empty()
        lasting.disconnect()
        assert connack_code(client(secrets, "acme/dev2", secret=short), port) == 0x86

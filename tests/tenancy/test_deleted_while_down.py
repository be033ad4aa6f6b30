"""A tenant deleted while a node is down (or holds none of its clients): what the
node's store kept of it -- persistent sessions with their queues, retained
messages -- goes when the node starts, and never reaches a tenant created
later under the same name. (Deleted and created again while the node was
down, the slug is the same tenant to it: the snapshot names no incarnation.)"""

import time

from ..mqtt import V311, PahoClient

RULES = [{"topic": "t/#", "action": "both", "allow": True}]


def _made_again(control_plane, node, client):
    """Tenant acme created again (a device "dev", topics t/#) and its device connected as soon as the
    new policy reaches ``node``: ``client(secret)`` makes the (not yet connected) client."""
    out = control_plane.manage_each(("tenants", "create", "acme"), ("devices", "create", "acme", "dev"),
                                    ("acl", "add", "acme", "--allow", "--action", "both", "--topic", "t/#"))
    secret = out[1].strip().splitlines()[-1]
    deadline = time.monotonic() + 10
    while True:
        try:
            return client(secret).connect(node.port())
        except (ConnectionError, AssertionError):
            assert time.monotonic() < deadline, "the new tenant's device was never let in"
            time.sleep(0.2)


def test_a_tenant_deleted_while_the_node_was_down_leaves_nothing_to_its_successor(control_plane, tmp_path):
    """Before: the restarted node restored the deleted tenant's sessions and
    retained messages from its store into the slug's namespace, and kept
    them: a tenant created afterwards under the same name got the old
    tenant's retained message on its first subscription, and its device of
    the same name and client id resumed the old device's persistent session."""
    secrets = control_plane.provision([{"slug": "acme", "acl": RULES, "devices": ["dev"]}])
    store = f"sqlite:///{tmp_path}/s.db"

    def client(who, secret, **kw):
        return PahoClient("dev-kept", V311, username=who, password=secret, **kw)

    node = control_plane.broker("--store", store)
    try:
        old = client("acme/dev", secrets["acme/dev"], clean=False).connect(node.port())
        old.subscribe("t/q", qos=1)
        old.publish("t/secret", b"the old tenant's", qos=1, retain=True)
        old.publish("t/q", b"queued for the old device", qos=1)
        assert old.expect().payload == b"queued for the old device"
        old.drop()
        time.sleep(0.5)                                   # the disconnect is written behind
    finally:
        node.kill()
    control_plane.manage("tenants", "delete", "acme")
    node = control_plane.broker("--store", store)          # learns of the deletion as it starts
    try:
        new = _made_again(control_plane, node, lambda secret: client("acme/dev", secret, clean=False))
        assert not new.session_present, "the new tenant's device resumed the old tenant's session"
        new.subscribe("t/#", qos=1)
        new.expect_none(1.0)                              # no retained message, no queued one of the old tenant
        new.disconnect()
    finally:
        node.stop()
    assert "2 sessions and retained messages of deleted tenants removed" in node.log, node.log[-2000:]


def test_a_tenant_made_again_under_a_deleted_ones_name_starts_its_counters_at_zero(control_plane):
    """A node keeps a tenant's counters (messages, bytes, connects, drops, auth failures, the highest
    number of connections) on the slug's namespace, which outlives the tenant: a tenant made again
    under the name of a deleted one took them over -- its dashboard's "in all" figures, its $SYS
    figures and the admin API's counted the deleted customer's traffic as its own."""
    from ..admin.conftest import Http
    from ..procs import BrokerProcess

    secrets = control_plane.provision([{"slug": "acme", "acl": RULES, "devices": ["dev"]}])
    token = control_plane.issue_token("acme-reader", "read")
    node = BrokerProcess("--sys-interval", "0", "--admin", "127.0.0.1:0", env=control_plane.env).start()
    api = Http(node.admin_url)

    def figures():
        _, _, body = api("GET", "/api/v1/metrics?local=1", token)
        return body["tenants"].get("acme") or {}

    try:
        old = PahoClient("dev-old", V311, username="acme/dev", password=secrets["acme/dev"]).connect(node.port())
        for i in range(7):
            old.publish("t/x", b"the old customer's %d" % i, qos=1)
        old.disconnect()
        deadline = time.monotonic() + 10
        while figures().get("messages_in", {}).get("1") != 7:
            assert time.monotonic() < deadline, figures()
            time.sleep(0.1)
        old_bytes = figures()["bytes_in"]
        control_plane.manage("tenants", "delete", "acme")
        new = _made_again(control_plane, node,
                          lambda secret: PahoClient("dev-new", V311, username="acme/dev", password=secret))
        new.publish("t/x", b"the new customer's", qos=1)
        new.disconnect()
        deadline = time.monotonic() + 10
        while figures().get("disconnects", 0) < 1 or figures().get("connections"):
            assert time.monotonic() < deadline, figures()
            time.sleep(0.1)
        mine = figures()
        assert mine["messages_in"] == {"0": 0, "1": 1, "2": 0}, mine
        assert mine["connects"] == 1 and mine["disconnects"] == 1 and mine["connections_max"] == 1, mine
        assert mine["bytes_in"] < old_bytes, mine          # one publish of its own, not eight
    finally:
        node.stop()


def test_a_slug_deleted_and_made_again_between_two_polls_is_another_tenant(control_plane):
    """A node polls the snapshots every 0.5 s and the table keeps the newest row of a slug: a tenant
    deleted and made again under its name in between (a script, the console's API) reached the node
    as a change of the same tenant -- the deleted customer's connections stayed, its retained
    messages, sessions and counters went to the new one. Snapshots now name their tenant's
    incarnation (its id): a new one is the old one deleted, then the new one made."""
    import json

    secrets = control_plane.provision([{"slug": "acme", "acl": RULES, "devices": ["dev"]}])
    node = control_plane.broker()
    try:
        old = PahoClient("dev-old", V311, username="acme/dev", password=secrets["acme/dev"]).connect(node.port())
        old.publish("t/kept", b"the old customer's", qos=1, retain=True)
        [(version, data)] = control_plane.query("SELECT version, data FROM tenants_policysnapshot "
                                                "WHERE tenant_slug = 'acme'")
        doc = json.loads(data)
        assert isinstance(doc["incarnation"], int)
        doc["incarnation"] += 1000             # the same policy, devices and secrets: another tenant
        top = control_plane.newest_version()
        control_plane.query("UPDATE tenants_policysnapshot SET version = ?, data = ? WHERE tenant_slug = 'acme'",
                            (top + 1, json.dumps(doc)))
        control_plane.query("UPDATE tenants_devicepolicy SET version = ?, incarnation = ? WHERE tenant_slug = 'acme'",
                            (top + 2, doc["incarnation"]))
        reason, _ = old.expect_disconnect(timeout=10)          # the old tenant's connection ends
        new = PahoClient("dev-new", V311, username="acme/dev", password=secrets["acme/dev"]).connect(node.port())
        new.subscribe("t/#", qos=1)
        new.expect_none(1.0)                                   # no retained message of the old customer's
    finally:
        node.stop()

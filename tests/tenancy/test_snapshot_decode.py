"""How a node reads the console's snapshots (brokerd/tenancy/source.py): a large document is decoded a
piece at a time (``json.loads`` held the interpreter for the whole of a 31 MB document, ~0.4 s, and
every client of the node waited; tests/tenancy/test_policy_scale.py shows the node serving through
it), into the same policy as before; a snapshot the node cannot read is refused on its own."""

import json
import sqlite3

import pytest

from brokerd.tenancy.control import TenantControl
from brokerd.tenancy.policy import DevicePolicy, device_from
from brokerd.tenancy.source import PIECEWISE_BYTES, PolicyDatabase, decode


def _document(n: int, **extra) -> dict:
    return {"schema": 1, "tenant": "big", "status": "active", "default_acl": "deny",
            "devices": {f"d{i}": {"enabled": i % 3 != 0, "cert_fingerprint": "AB:CD" if i == 7 else None,
                                  "cert_cn": "gw \u00e9\"\\" if i == 5 else None,
                                  "credentials": [{"id": i, "hash": "sha256$" + "ab" * 32, "enabled": True,
                                                   "expires_at": 1.5e9 if i % 2 else None}]}
                        for i in range(n)},
            "acl": [{"id": 1, "position": 0, "who": "all", "action": "both", "topic": "t/#", "allow": True}],
            "quota": {"max_queued": 5}, "sys": {"enabled": True, "interval": 10, "parts": ["clients"]},
            "rules": [], "autosub": [], **extra}


@pytest.mark.parametrize("dumps", [dict(), dict(separators=(",", ":")), dict(indent=2)], ids=["spaced", "compact",
                                                                                           "indented"])
def test_a_large_document_decodes_piecewise_to_the_same_policy(dumps):
    text = json.dumps(_document(6000), **dumps)
    assert len(text) > PIECEWISE_BYTES
    assert decode(text) == json.loads(text)
    piecewise = TenantControl.build("big", 1, decode(text, device_from))
    whole = TenantControl.build("big", 1, json.loads(text))
    assert piecewise == whole
    assert whole.devices["d7"] == DevicePolicy("d7", True, whole.devices["d7"].credentials, "abcd", None)


@pytest.mark.parametrize("text", ['{"devices": {"a": 1,}}', '{"devices": {"a": 1}} x', '{"devices": {"a" 1}}',
                                  '[1]', '{"a": 1', '{"devices": {"a": {"b": [1, 2}}}'])
def test_malformed_json_is_refused_as_json_loads_refuses_it(text):
    padded = text + " " * PIECEWISE_BYTES if not text.endswith("x") else text.replace(" x", " " * PIECEWISE_BYTES + "x")
    with pytest.raises(json.JSONDecodeError):
        decode(padded)


def test_a_snapshot_with_an_unreadable_device_is_refused_alone(tmp_path):
    path = tmp_path / "console.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE tenants_policysnapshot (id INTEGER PRIMARY KEY, tenant_slug TEXT, version "
                   "INTEGER, data TEXT)")
        bad = _document(3000)
        bad["devices"]["d9"] = {"credentials": [{"hash": "no id"}]}
        db.execute("INSERT INTO tenants_policysnapshot (tenant_slug, version, data) VALUES (?, ?, ?)",
                   ("big", 1, json.dumps(bad)))
        db.execute("INSERT INTO tenants_policysnapshot (tenant_slug, version, data) VALUES (?, ?, ?)",
                   ("small", 2, json.dumps(dict(_document(2), tenant="small"))))
    rows, devices = PolicyDatabase(f"sqlite:///{path}").fetch(0)     # (a console without device rows)
    assert devices == []
    assert [(slug, version) for slug, version, _ in rows] == [("big", 1), ("small", 2)]
    with pytest.raises(KeyError):
        TenantControl.build("big", 1, rows[0][2])
    assert TenantControl.build("small", 2, rows[1][2]).devices["d1"].enabled


@pytest.mark.parametrize("data", ['{"schema": 1, "tenant": "broken", "devices": {', "[" * 100_000 + "]" * 100_000,
                                  '{"schema": 1, "tenant": "broken", "status": "active", "devices": {}, '
                                  '"quota": {"max_connections": 1e400}}'],
                         ids=["cut", "nested", "overflow"])
def test_a_snapshot_row_the_node_cannot_read_stops_no_other_tenants_change(control_plane, data):
    """A row of one tenant that is no JSON document (cut short, nested past the decoder's depth) or
    whose figures are no numbers a node takes failed every poll: the node logged the control plane
    "unreachable" and took no tenant's change again. Now that row is refused alone (logged), and a
    change of another tenant made after it is enforced."""
    from ..mqtt import V5, PahoClient

    secrets = control_plane.provision([{"slug": "acme", "default_acl": "allow", "devices": ["d1"]}])
    node = control_plane.broker()
    try:
        with sqlite3.connect(control_plane.dir / "console.sqlite3") as db:
            db.execute("UPDATE tenants_policycounter SET value = value + 1 WHERE id = 1")
            (version,) = db.execute("SELECT value FROM tenants_policycounter WHERE id = 1").fetchone()
            db.execute("INSERT INTO tenants_policysnapshot (tenant_slug, version, data) VALUES (?, ?, ?)",
                       ("broken", version, data))
        c = PahoClient("d1-live", V5, username="acme/d1", password=secrets["acme/d1"]).connect(node.port())
        control_plane.manage("devices", "disable", "acme", "d1")
        reason, _ = c.expect_disconnect(timeout=10)
        assert reason.value == 0x87
        assert "policy snapshot of tenant 'broken'" in node.log and "unreachable" not in node.log
    finally:
        node.stop()

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
    rows = PolicyDatabase(f"sqlite:///{path}").fetch(0)
    assert [(slug, version) for slug, version, _ in rows] == [("big", 1), ("small", 2)]
    with pytest.raises(KeyError):
        TenantControl.build("big", 1, rows[0][2])
    assert TenantControl.build("small", 2, rows[1][2]).devices["d1"].enabled

#!/usr/bin/env python3
"""What applying one tenant's policy change costs a node's event loop (``Enforcement.policy_changed``),
with N of the tenant's devices connected: a change of one device (a credential given an expiry), which
leaves every other connection as it was, and a change of the tenant's ACL, which every connection's rights
depend on. In process, on the pure broker (tests/protocol/harness.py: no sockets), 20 ACL rules; the
best of ``--runs``.

    .venv/bin/python bench/policy_change.py --clients 20000
"""

import argparse
import copy
import hashlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from brokerd.tenancy.control import TenantControl  # noqa: E402
from tests.protocol.harness import Net  # noqa: E402

SECRET = b"s3cret"


def snapshot(n: int, acl_topic: str = "out/#") -> dict:
    cred = {"id": 1, "hash": "sha256$" + hashlib.sha256(SECRET).hexdigest(), "enabled": True}
    acl = [{"id": i, "position": i, "who": "all", "action": "both", "topic": f"r{i}/{{device}}/#", "allow": True}
           for i in range(19)]
    acl.append({"id": 99, "position": 99, "who": "all", "action": "both", "topic": acl_topic, "allow": True})
    return {"schema": 1, "tenant": "big", "status": "active", "default_acl": "deny",
            "devices": {f"d{i}": {"enabled": True, "credentials": [dict(cred, id=i + 1)]} for i in range(n)},
            "acl": acl, "quota": {"client_msgs_in": 1000}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    net = Net(allow_anonymous=False)
    control = TenantControl()
    net.broker.auth = control
    data = snapshot(args.clients)
    version = 1
    control.apply("big", version, data)
    for i in range(args.clients):
        c = net.client()
        c.connect(f"c{i}", username=f"big/d{i}", password=SECRET)
        c.subscribe(f"r1/d{i}/cmd", qos=1)
    best: dict[str, float] = {}
    for run in range(args.runs):
        for name in ("one device changed", "the ACL changed"):
            data = copy.deepcopy(data)
            if name == "one device changed":       # a connected device's credential given an expiry
                data["devices"][f"d{run}"]["credentials"][0]["expires_at"] = net.now + 3600
            else:
                data["acl"][-1]["topic"] = f"out{run}/#"
            version += 1
            # (the poller's thread; a revision before TenantControl.prepare only builds there)
            built = getattr(control, "prepare", control.build)("big", version, data)
            t0 = time.perf_counter()
            old, new = control.apply("big", version, data, built, net.now)
            net.broker.policy_changed("big", old, new, net.now, net.now)
            best[name] = min(best.get(name, 1e9), time.perf_counter() - t0)
    connected = sum(1 for c in net.clients if not c.closed)
    print(f"clients: {args.clients} (connected at the end: {connected})")
    for name, seconds in best.items():
        print(f"{name}: {seconds * 1000:.1f} ms of the loop")


if __name__ == "__main__":
    main()

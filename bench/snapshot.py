#!/usr/bin/env python3
"""What one change of a big tenant costs the control plane: the console writing it (a device's row,
or the tenant's snapshot), and each node reading it in its poller's thread -- beside what schema 1
cost, where every change rebuilt the tenant's whole document, devices included, and every node read
it again (``json.loads`` holds the interpreter: the node's event loop waits).

A tenant of N devices, one credential each, in a fresh SQLite console database (``--keep DIR``
keeps it for the next run); each figure the best of ``--runs``:

    .venv/bin/python bench/snapshot.py --devices 150000
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MEASURE = r"""
import json, sys, time
from django.conf import settings
from django.db import transaction
from tenants import policy_snapshot, services
from tenants.models import Credential, Device, Tenant
from brokerd.tenancy.control import TenantControl
from brokerd.tenancy.source import PolicySource

n, runs = int(sys.argv[1]), int(sys.argv[2])
t = Tenant.objects.filter(slug="big").first()
if t is None or t.devices.count() != n:
    if t is not None:
        services.delete_tenant(t)
    t = services.create_tenant("big", name="Big")
    Device.objects.bulk_create([Device(tenant=t, name=f"d{i:06d}") for i in range(n)], batch_size=5000)
    Credential.objects.bulk_create([Credential(device=d, secret_hash="sha256$" + "ab" * 32)
                                    for d in Device.objects.filter(tenant=t)], batch_size=5000)
    with transaction.atomic():
        policy_snapshot.publish_devices(t, [d.name for d in Device.objects.filter(tenant=t)])
best = {}
def timed(name, fn):
    t0 = time.perf_counter()
    out = fn()
    best[name] = min(best.get(name, 1e9), time.perf_counter() - t0)
    return out
url = "sqlite:///" + str(settings.DATABASES["default"]["NAME"])
device = Device.objects.filter(tenant=t).order_by("name").first()
for i in range(runs):
    # before schema 2: every change of the tenant rebuilt and every node read its whole document
    with transaction.atomic():
        doc = timed("schema 1: console build, devices included", lambda: dict(policy_snapshot.build(t), schema=1,
                                                                               devices=policy_snapshot._devices(t)))
    data = timed("schema 1: console json.dumps", lambda: json.dumps(doc, separators=(",", ":")))
    parsed = timed("schema 1: node json.loads", lambda: json.loads(data))
    timed("schema 1: node TenantControl.build (poller thread)", lambda: TenantControl.build("big", 1, parsed))
    # schema 2: a tenant's document, and a row per device
    source = PolicySource(url, TenantControl(), broker=None, loop=None)
    rows, newest = timed("schema 2: node first read of the tenant (poller thread)", lambda: source._fetch(0))
    source.control.apply("big", newest, rows[0][2], rows[0][3])
    source.control.version = newest
    timed("schema 2: console, one device's change (its service call, committed)",
          lambda: (services.disable_device if i % 2 == 0 else services.enable_device)(device))
    rows, newest = timed("schema 2: node, one device's change (poller thread)",
                         lambda: source._fetch(source.control.version))
    assert len(rows) == 1 and rows[0][3].changed_devices == frozenset({device.name}), rows
    timed("schema 2: console, the tenant's change (its service call, committed)",
          lambda: services.update_tenant(t, default_acl="allow" if i % 2 == 0 else "deny"))
    timed("schema 2: node, the tenant's change (poller thread)", lambda: source._fetch(newest))
print(f"devices: {n}, schema 1 document: {len(data) / 1e6:.1f} MB")
for name, seconds in best.items():
    print(f"{name}: {seconds * 1000:.1f} ms")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=150_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", help="the console database's directory (kept; reused by the next run)")
    args = ap.parse_args()
    directory = args.keep or tempfile.mkdtemp(prefix="snapshot-bench-")
    os.makedirs(directory, exist_ok=True)
    env = dict(os.environ, DATABASE_URL=f"sqlite:///{os.path.abspath(directory)}/console.sqlite3")
    py = sys.executable
    subprocess.run([py, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    subprocess.run([py, "manage.py", "shell", "-c", f"import sys; sys.argv = ['x', '{args.devices}', '{args.runs}']\n"
                    + MEASURE], cwd=ROOT, env=env, check=True)
    if not args.keep:
        subprocess.run(["rm", "-rf", directory], check=False)


if __name__ == "__main__":
    main()

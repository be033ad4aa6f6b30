#!/usr/bin/env python3
"""What one change of a big tenant costs the control plane: the console rebuilding the tenant's
policy snapshot (inside the publishing transaction, the policy counter's row lock held, so every
tenant's changes wait for it), and each node reading it (``json.loads`` in the poller's thread holds
the interpreter: the node's event loop waits; ``TenantControl.build`` in that thread does not).

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
from django.db import transaction
from tenants import policy_snapshot, services
from tenants.models import Credential, Device, Tenant
from brokerd.tenancy.control import TenantControl

n, runs = int(sys.argv[1]), int(sys.argv[2])
t = Tenant.objects.filter(slug="big").first()
if t is None or t.devices.count() != n:
    if t is not None:
        services.delete_tenant(t)
    t = services.create_tenant("big", name="Big")
    Device.objects.bulk_create([Device(tenant=t, name=f"d{i:06d}") for i in range(n)], batch_size=5000)
    Credential.objects.bulk_create([Credential(device=d, secret_hash="sha256$" + "ab" * 32)
                                    for d in Device.objects.filter(tenant=t)], batch_size=5000)
best = {}
def timed(name, fn):
    t0 = time.perf_counter()
    out = fn()
    best[name] = min(best.get(name, 1e9), time.perf_counter() - t0)
    return out
for _ in range(runs):
    with transaction.atomic():
        doc = timed("console build", lambda: policy_snapshot.build(t))
    data = timed("console json.dumps", lambda: json.dumps(doc, separators=(",", ":")))
    parsed = timed("node json.loads (holds the loop)", lambda: json.loads(data))
    timed("node TenantControl.build (poller thread)", lambda: TenantControl.build("big", 1, parsed))
print(f"devices: {n}, snapshot: {len(data) / 1e6:.1f} MB")
for name, seconds in best.items():
    print(f"{name}: {seconds:.3f} s")
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

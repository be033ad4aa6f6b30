#!/usr/bin/env python3
"""The control plane's costs, measured (issue #4).

``storm``: authenticated CONNECTs per second on one node -- N distinct
devices of one tenant (each with its own generated secret) connect at once,
disconnect, and reconnect (the reconnect wave); the same with anonymous
clients on a node without a control plane, for comparison.

``acl``: the publish throughput cost of ACL checks -- ``pairs`` QoS 0 with
every client authenticated as a device of a tenant that has 20 ACL rules
(the one that allows the benchmark topics last), against the same load on a
node with ``--allow-anonymous`` and no control plane.

Broker on CPU 0, generator on CPU 1 (``taskset``); loopback only.

    python bench/tenancy.py storm --devices 2000
    python bench/tenancy.py acl --runs 3
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import mqttbench_load  # noqa: E402
from run import DEFAULT_MQTTBENCH, free_port, wait_port  # noqa: E402

PROVISION = r"""
import json, sys
from django.db import transaction
from tenants import policy_snapshot, services
from tenants.hashing import generate_secret, hash_secret
from tenants.models import Credential, Device
spec = json.loads(sys.stdin.read())
tenant = services.create_tenant(spec["slug"], default_acl="deny")
for rule in spec["rules"]:
    services.add_acl_rule(tenant, **rule)
secrets = {}
with transaction.atomic():            # many devices, one version of their rows
    for i in range(spec["devices"]):
        device = Device.objects.create(tenant=tenant, name=f"d{i}")
        secret = generate_secret()
        Credential.objects.create(device=device, secret_hash=hash_secret(secret))
        secrets[f"d{i}"] = secret
    policy_snapshot.publish_devices(tenant, list(secrets))
print("SECRETS " + json.dumps(secrets))
"""


def console(tmp: Path, spec: dict) -> tuple[dict, dict]:
    env = dict(os.environ, DATABASE_URL=f"sqlite:///{tmp}/console.sqlite3", VAR_DIR=str(tmp))
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    out = subprocess.run([sys.executable, "manage.py", "shell", "-c", PROVISION], cwd=ROOT, env=env, check=True,
                         input=json.dumps(spec), capture_output=True, text=True).stdout
    line = [ln for ln in out.splitlines() if ln.startswith("SECRETS ")][-1]
    return json.loads(line[8:]), env


def start_broker(env: dict | None, flags: list[str]) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = ["taskset", "-c", "0", sys.executable, "-m", "brokerd", "--log-level", "warning", "--sys-interval", "0",
           "--listen", f"mqtt://127.0.0.1:{port}", *flags]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env or dict(os.environ), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_port(port)
    time.sleep(0.5)
    return proc, port


def stop(proc):
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()


# ------------------------------------------------------------ connect storm

async def wave(port: int, creds: list[tuple[str, str | None, str | None]], concurrency: int) -> tuple[float, int]:
    """Connect everyone (bounded concurrency), wait for each CONNACK; -> (seconds, refused)."""
    pkt_connect = mqttbench_load.load(mqttbench_load.default_path()).pkt_connect    # the shared generator's
    sem = asyncio.Semaphore(concurrency)
    refused = 0
    conns = []

    async def one(cid, user, pw):
        nonlocal refused
        async with sem:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(pkt_connect(cid, 60, True, user or None, pw or None, False))   # 3.1.1, clean
            ack = await reader.readexactly(4)
            if ack[3] != 0:
                refused += 1
            conns.append(writer)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(*c) for c in creds))
    elapsed = time.perf_counter() - t0
    for w in conns:
        w.write(b"\xe0\x00")
        w.close()
    await asyncio.sleep(1.0)
    return elapsed, refused


def storm(args) -> dict:
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        secrets, env = console(Path(tmp), {"slug": "storm", "devices": args.devices,
                                           "rules": [{"topic": "{device}/#", "action": "both", "allow": True}]})
        creds = [(f"c{i}", f"storm/{name}", secret) for i, (name, secret) in enumerate(secrets.items())]
        for label, env_, flags, cred in (
                ("authenticated", env, [], creds),
                ("anonymous (no control plane)", {k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
                 ["--allow-anonymous", "--control-plane", "none"], [(c, None, None) for c, _, _ in creds])):
            proc, port = start_broker(env_, flags)
            try:
                first, refused1 = asyncio.run(wave(port, cred, args.concurrency))
                second, refused2 = asyncio.run(wave(port, cred, args.concurrency))
            finally:
                stop(proc)
            results[label] = {"first_wave_connects_per_s": round(len(cred) / first),
                              "reconnect_wave_connects_per_s": round(len(cred) / second),
                              "refused": refused1 + refused2}
            print(label, results[label], flush=True)
    return results


# ---------------------------------------------------------------- ACL cost

def run_pairs(port: int, pid: int, mqttbench: str, username=None, password=None) -> dict:
    cmd = ["taskset", "-c", "1", sys.executable, mqttbench, "pairs", "--port", str(port), "--clients", "1000",
           "--qos", "0", "--payload", "1024", "--rate", "0", "--window", "8", "--duration", "15",
           "--broker-pid", str(pid), "--json", "--topic-prefix", "bench"]
    if username:
        cmd += ["--username", username, "--password", password]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600).stdout
    return json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])


def acl(args) -> dict:
    rules = [{"topic": f"other/{i}/#", "action": "both", "allow": i % 2 == 0} for i in range(19)]
    rules.append({"topic": "bench/#", "action": "both", "allow": True})
    rates = {"anonymous": [], "20 ACL rules": []}
    with tempfile.TemporaryDirectory() as tmp:
        secrets, env = console(Path(tmp), {"slug": "bench", "devices": 1, "rules": rules})
        for _ in range(args.runs):
            proc, port = start_broker({k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
                                      ["--allow-anonymous", "--control-plane", "none"])
            try:
                rates["anonymous"].append(run_pairs(port, proc.pid, args.mqttbench)["recv_rate"])
            finally:
                stop(proc)
            proc, port = start_broker(env, [])
            try:
                res = run_pairs(port, proc.pid, args.mqttbench, "bench/d0", secrets["d0"])
                rates["20 ACL rules"].append(res["recv_rate"])
            finally:
                stop(proc)
            print({k: v[-1] for k, v in rates.items()}, flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    med["ratio"] = round(med["20 ACL rules"] / med["anonymous"], 3)
    print(med)
    return med


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("storm")
    s.add_argument("--devices", type=int, default=2000)
    s.add_argument("--concurrency", type=int, default=200)
    a = sub.add_parser("acl")
    a.add_argument("--runs", type=int, default=3)
    a.add_argument("--mqttbench", default=os.environ.get("MQTTBENCH", str(DEFAULT_MQTTBENCH)))
    args = ap.parse_args()
    result = storm(args) if args.what == "storm" else acl(args)
    out = ROOT / "var" / "bench" / f"tenancy-{args.what}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

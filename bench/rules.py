#!/usr/bin/env python3
"""What a tenant's rules cost the publish path (issue 19).

``pairs`` QoS 0 (1,000 clients, 1 KiB payloads, window 8, 15 s), every client
authenticated as a device of one of three tenants of the same console
database, identical but for their rules:

- ``no rules``      -- the publish path pays one dict lookup that misses;
- ``10 rules, none match`` -- ten rules on other topics: each PUBLISH tests
  ten topic filters and runs nothing;
- ``1 rule, republish`` -- one rule matching every message,
  ``SELECT clientid, topic, timestamp``, republished to ``out/${clientid}``
  (nobody subscribes there: the cost of evaluating and publishing, not of
  delivering twice);
- ``1 rule, republish with payload`` -- the same with ``payload`` selected
  too: the 1 KiB payload goes into the JSON row (JSON-encoding 1 KiB is most
  of its extra cost);
- ``1 rule, store`` -- ``SELECT clientid, topic, timestamp`` stored to the
  tenant's telemetry dataset ``bench`` (queued on the publish path, written
  every 5 s under ``--usage-dir`` by a thread).

Every broker runs with ``--usage-dir`` (a temporary directory: the store
action writes there, and every case pays the usage log's counting alike).

One brokerd per run (CPU 0, the generator on CPU 1, ``taskset``), the three
alternating each round; prints the medians of messages received per second
and the ratios to ``no rules``. Loopback only; not part of the test suite.
Hold the exclusive bench lock while it runs:

    flock -x /work/notes/bench.lock .venv/bin/python bench/rules.py --runs 3
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from run import DEFAULT_MQTTBENCH  # noqa: E402
from tenancy import run_pairs, start_broker, stop  # noqa: E402

PROVISION = r"""
import json, sys
from tenants import rules, services
plan = json.loads(sys.stdin.read())
out = {}
for slug, sqls in plan.items():
    tenant = services.create_tenant(slug, default_acl="deny")
    services.add_acl_rule(tenant, topic="bench/#", action="both", allow=True)
    services.add_acl_rule(tenant, topic="out/#", action="both", allow=True)
    for sql in sqls:
        if sql.startswith("STORE "):
            rules.add_rule(tenant, sql=sql[6:], action="store", config={"dataset": "bench"})
        else:
            rules.add_rule(tenant, sql=sql, action="republish", config={"topic": "out/${clientid}"})
    device, credential, secret = services.provision_device(tenant, "d0")
    out[slug] = secret
print("SECRETS " + json.dumps(out))
"""

CASES = {
    "no rules": ("norules", []),
    "10 rules, none match": ("ten", [f'SELECT * FROM "other/{i}/#"' for i in range(10)]),
    "1 rule, republish": ("one", ['SELECT clientid, topic, timestamp FROM "bench/#"']),
    "1 rule, republish with payload": ("onep", ['SELECT payload, topic, clientid FROM "bench/#"']),
    "1 rule, store": ("store", ['STORE SELECT clientid, topic, timestamp FROM "bench/#"']),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mqttbench", default=os.environ.get("MQTTBENCH", str(DEFAULT_MQTTBENCH)))
    args = ap.parse_args()
    rates: dict[str, list] = {label: [] for label in CASES}
    cpu: dict[str, list] = {label: [] for label in CASES}
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, DATABASE_URL=f"sqlite:///{tmp}/console.sqlite3", VAR_DIR=tmp)
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
        out = subprocess.run([sys.executable, "manage.py", "shell", "-c", PROVISION], cwd=ROOT, env=env, check=True,
                             input=json.dumps(dict(CASES.values())), capture_output=True, text=True).stdout
        secrets = json.loads([ln for ln in out.splitlines() if ln.startswith("SECRETS ")][-1][8:])
        for _ in range(args.runs):
            for label, (slug, _sqls) in CASES.items():
                proc, port = start_broker(env, ["--usage-dir", f"{tmp}/usage"])
                try:
                    res = run_pairs(port, proc.pid, args.mqttbench, f"{slug}/d0", secrets[slug])
                finally:
                    stop(proc)
                rates[label].append(res["recv_rate"])
                if res.get("broker_cpu_pct"):
                    cpu[label].append(res["broker_cpu_pct"] / 100.0 / res["recv_rate"] * 1e6)
                print(label, round(res["recv_rate"]), flush=True)
    base = statistics.median(rates["no rules"])
    result = {label: {"msgs_per_s": round(statistics.median(v)), "ratio": round(statistics.median(v) / base, 3),
                      "broker_cpu_us_per_msg": round(statistics.median(cpu[label]), 2) if cpu[label] else None,
                      "runs": [round(x) for x in v]} for label, v in rates.items()}
    print(json.dumps(result, indent=2))
    path = ROOT / "var" / "bench" / "rules.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

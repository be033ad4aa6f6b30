#!/usr/bin/env python3
"""System calls and kernel/user time per message, brokerd beside Mosquitto
(issue 18: where QoS 1's CPU per message goes).

For each broker and run: the broker starts on ``--broker-cpus``, a scenario
of ``bench/run.py`` (b20k by default) runs on ``--gen-cpus``, and after
``--warmup`` seconds ``perf stat`` counts the broker's system calls (the
tracepoints ``raw_syscalls:sys_enter`` and ``syscalls:sys_enter_*`` of the
calls a broker makes) for ``--window`` seconds, while ``/proc/PID/stat``
gives its user and kernel time over the same window. Figures are per
message delivered (the generator's rate times the window). Needs ``perf``
and root (or a low ``perf_event_paranoid``); loopback only; not part of the
test suite.

    .venv/bin/python bench/syscalls.py                    # b20k, brokerd and mosquitto, 1 run
    .venv/bin/python bench/syscalls.py --runs 2 b20k a2
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run import DEFAULT_MQTTBENCH, PERSISTENT, SCENARIOS, Broker  # noqa: E402

CALLS = ["read", "write", "writev", "readv", "sendmsg", "recvfrom", "sendto", "epoll_wait", "epoll_pwait",
         "epoll_ctl", "accept4", "close"]
TICK = os.sysconf("SC_CLK_TCK")


def cpu_times(pid: int) -> tuple[float, float]:
    """(user, kernel) seconds of ``pid`` and its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def measure(broker: Broker, scenario: str, args) -> dict:
    gen_args, _, _ = SCENARIOS[scenario]
    gen_args = re.sub(r"--duration \S+", f"--duration {args.warmup + args.window + 2:g}", gen_args)
    broker.start()
    try:
        gen = subprocess.Popen(["taskset", "-c", args.gen_cpus, args.python, str(args.mqttbench), *gen_args.split(),
                                "--port", str(broker.port), "--json", *broker.gen_args],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        time.sleep(args.warmup)
        pid = broker.proc.pid
        events = ["raw_syscalls:sys_enter", *(f"syscalls:sys_enter_{c}" for c in CALLS), "task-clock"]
        u0, k0 = cpu_times(pid)
        perf = subprocess.run(["perf", "stat", "-x", ",", "-e", ",".join(events), "-p", str(pid), "--", "sleep",
                               f"{args.window:g}"], capture_output=True, text=True)
        u1, k1 = cpu_times(pid)
        out, _ = gen.communicate(timeout=120)
    finally:
        broker.stop()
    result = json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
    if not result.get("recv_rate"):
        raise SystemExit(f"{scenario}: no message was delivered, nothing to count per message")
    messages = result["recv_rate"] * args.window
    counts = {}
    for line in perf.stderr.splitlines():
        parts = line.split(",")
        if len(parts) > 2 and parts[0].replace(".", "").isdigit():
            counts[parts[2].split(":")[-1].replace("sys_enter_", "")] = float(parts[0])
    if "sys_enter" not in counts:
        raise SystemExit(f"perf stat counted nothing (root? perf_event_paranoid?):\n{perf.stderr[-1500:]}")
    return {"msg_per_s": result["recv_rate"],
            "syscalls": counts["sys_enter"] / messages,
            "by_call": {c: counts[c] / messages for c in CALLS if counts.get(c)},
            "user_us": (u1 - u0) * 1e6 / messages, "kernel_us": (k1 - k0) * 1e6 / messages}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenarios", nargs="*", default=["b20k"], help=f"of bench/run.py ({', '.join(SCENARIOS)})")
    ap.add_argument("--brokers", default="brokerd,mosquitto")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--warmup", type=float, default=4.0, help="seconds of load before counting")
    ap.add_argument("--window", type=float, default=5.0, help="seconds counted")
    ap.add_argument("--broker-cpus", default="0")
    ap.add_argument("--gen-cpus", default="1")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--mqttbench", type=Path, default=DEFAULT_MQTTBENCH)
    args = ap.parse_args()
    if shutil.which("perf") is None:
        ap.error("needs perf (Debian: linux-perf)")
    # messages counted per message: pairs and fan-out, clean sessions (p1's are run.py's own generator's)
    usable = [k for k, v in SCENARIOS.items() if k not in PERSISTENT and v[0].split()[0] in ("pairs", "fanout")]
    for scenario in args.scenarios:
        if scenario not in usable:
            ap.error(f"{scenario}: one of {', '.join(usable)}")
    brokers = args.brokers.split(",")
    with tempfile.TemporaryDirectory(prefix="syscalls-") as tmp:
        for scenario in args.scenarios:
            for run in range(1, args.runs + 1):
                for name in brokers:
                    r = measure(Broker(name, args.python, Path(tmp), [], cpus=args.broker_cpus), scenario, args)
                    calls = ", ".join(f"{c} {n:.2f}" for c, n in sorted(r["by_call"].items(), key=lambda x: -x[1]))
                    print(f"{scenario} {name} run {run}: {r['msg_per_s']:,.0f} msg/s; per message: "
                          f"{r['syscalls']:.2f} system calls ({calls}); user {r['user_us']:.1f} µs, "
                          f"kernel {r['kernel_us']:.1f} µs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

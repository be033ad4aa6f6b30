#!/usr/bin/env python3
"""Two revisions of brokerd measured in the same sitting, alternating.

A change that must not cost speed (a restructuring) is measured against the
revision before it on the same machine at the same time: this checkout's
``bench/run.py`` runs each checkout's brokerd (``--brokerd-root``; broker on
CPU 0, generator on CPU 1), one scenario run at a time, the two revisions
alternating and swapping who goes first each round, so drift in the
machine's load falls on both. One harness for both sides: a variant such as
``brokerd-full`` (every feature on) runs the earlier revision too.

    git worktree add /tmp/before <REV> && ln -s "$PWD/.venv" /tmp/before/.venv
    .venv/bin/python bench/ab.py --before /tmp/before --runs 3 a2 b20k c1 d10
    .venv/bin/python bench/ab.py --before /tmp/before --broker brokerd-full a2

Prints, per scenario, the medians of each revision's figures and the ratio
after/before, plus the broker's CPU per delivered message (µs; the figure
that does not depend on how fast the generator can go). Loopback only; not
part of the test suite.
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
sys.path.insert(0, str(HERE))
from run import DEFAULT_MQTTBENCH, SCENARIOS, cpu_us_per_message, fmt, get  # noqa: E402


def run_once(checkout: Path, scenario: str, out: Path, python: str, extra: list[str], broker: str) -> dict:
    cmd = [python, str(HERE / "run.py"), "--brokers", broker, "--runs", "1", "--out", str(out),
           "--brokerd-root", str(checkout), *[f"--brokerd-arg={a}" for a in extra], scenario]
    before = out.read_text().count("\n") if out.exists() else 0
    # both sides use one generator (this checkout's default; a worktree elsewhere has no ../shared)
    env = {**os.environ, "MQTTBENCH": os.environ.get("MQTTBENCH", str(DEFAULT_MQTTBENCH))}
    subprocess.run(cmd, cwd=HERE.parent, check=True, capture_output=True, text=True, timeout=900, env=env)
    lines = out.read_text().splitlines()[before:]
    return json.loads(lines[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenarios", nargs="+", help=f"of {', '.join(SCENARIOS)}")
    ap.add_argument("--before", required=True, help="checkout of the earlier revision")
    ap.add_argument("--after", default=str(HERE.parent), help="checkout of the later one (default: this one)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--brokerd-arg", action="append", default=[])
    ap.add_argument("--broker", default="brokerd", help="the brokerd variant of bench/run.py (e.g. brokerd-full)")
    args = ap.parse_args(argv)
    sides = {"before": Path(args.before).resolve(), "after": Path(args.after).resolve()}
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="brokerd-ab-") as tmp:
        for r in range(args.runs):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for name in args.scenarios:
                for side in order:
                    res = run_once(sides[side], name, Path(tmp) / f"{side}.jsonl", args.python, args.brokerd_arg,
                                   args.broker)
                    results.setdefault((name, side), []).append(res)
                    us = cpu_us_per_message(res)
                    print(f"{name} {side} run {r + 1}: " + ", ".join(
                        f"{label}={fmt(get(res, path))}" for path, label, _ in SCENARIOS[name][2])
                        + (f", broker CPU {us:.2f} µs/msg" if us else ""), flush=True)
    print("\n| scenario | metric | before | after | after / before |\n|---|---|---|---|---|")
    for name in args.scenarios:
        metrics = list(SCENARIOS[name][2]) + [("__cpu_us", "broker CPU µs per message", "lower")]
        for path, label, _ in metrics:
            meds = {}
            for side in sides:
                vals = [cpu_us_per_message(x) if path == "__cpu_us" else get(x, path)
                        for x in results.get((name, side), [])]
                vals = [v for v in vals if v is not None]
                meds[side] = statistics.median(vals) if vals else None
            ratio = f"{meds['after'] / meds['before']:.3f}" if meds["before"] and meds["after"] is not None else "-"
            print(f"| {name} | {label} | {fmt(meds['before'])} | {fmt(meds['after'])} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Write usage-log files in brokerd's layout, for tests, the benchmark and
demos (``manage.py reports_demo_usage``): the same paths, names and fields
brokerd writes (README, *Usage reports*), one file per node, dataset and
minute, written under a temporary name and renamed.
"""

import json
import os
import random
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

REASONS = ["client disconnect", "keepalive timeout", "kicked", "taken over", "protocol error", "server shutdown"]
PROTOCOLS = ["3.1", "3.1.1", "5.0"]


def _stamp(ts: float) -> tuple[str, str]:
    t = datetime.fromtimestamp(ts, tz=UTC)
    return t.strftime("%Y-%m-%d"), t.strftime("%Y%m%d%H%M")


def write_rows(root, dataset: str, rows: Iterable[dict], suffix: str = "") -> int:
    """Rows of ``dataset`` ("connections" or "traffic") into
    ``root/dataset/date=D/<node>-<YYYYMMDDHHMM><suffix>.jsonl`` by node and
    minute (of ``disconnected_at`` or ``ts``); -> the number of files."""
    key = "disconnected_at" if dataset == "connections" else "ts"
    files: dict[tuple, list[str]] = defaultdict(list)
    for row in rows:
        day, minute = _stamp(row[key])
        files[(day, row["node"], minute)].append(json.dumps(row, separators=(",", ":")))
    for (day, node, minute), lines in files.items():
        directory = Path(root) / dataset / f"date={day}"
        directory.mkdir(parents=True, exist_ok=True)
        final = directory / f"{node}-{minute}{suffix}.jsonl"
        tmp = directory / f".{final.name}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, final)
    return len(files)


def connection_row(tenant, client_id, connected_at, disconnected_at, *, username=None, node="node1",
                   protocol="5.0", ip="127.0.0.1", msgs_in=0, msgs_out=0, bytes_in=0, bytes_out=0,
                   reason="client disconnect") -> dict:
    return {"tenant": tenant, "client_id": client_id, "username": username, "node": node, "protocol": protocol,
            "ip": ip, "connected_at": float(connected_at), "disconnected_at": float(disconnected_at),
            "msgs_in": msgs_in, "msgs_out": msgs_out, "bytes_in": bytes_in, "bytes_out": bytes_out,
            "reason": reason}


COUNTERS = ["msgs_in_q0", "msgs_in_q1", "msgs_in_q2", "bytes_in", "msgs_out", "bytes_out",
            "dropped_queue_full", "dropped_expired", "dropped_no_subscribers", "acl_denied", "quota_rejected",
            "auth_failures"]


def traffic_row(ts, tenant, topic, *, node="node1", **counters) -> dict:
    row = {"ts": int(ts), "node": node, "tenant": tenant, "topic": topic}
    row.update({c: int(counters.get(c, 0)) for c in COUNTERS})
    return row


def random_connections(rng: random.Random, n: int, start: float, end: float, tenants: list[str],
                       nodes: list[str], devices: int) -> list[dict]:
    """``n`` connections closed within [start, end): lengths from a second to
    a day; some device-named, some anonymous; a few zero-length."""
    rows = []
    for i in range(n):
        tenant = rng.choice(tenants)
        dev = f"dev{rng.randrange(devices):03d}"
        closed = rng.uniform(start, end)
        length = 0.0 if rng.random() < 0.01 else min(rng.expovariate(1 / 1800), 86400.0)
        length = round(length, 3)
        closed = round(closed, 3)
        anonymous = tenant == "default"
        msgs_in, msgs_out = rng.randrange(0, 500), rng.randrange(0, 500)
        rows.append(connection_row(
            tenant, f"{dev}-{i}" if anonymous else dev, closed - length, closed,
            username=None if anonymous else f"{tenant}/{dev}", node=rng.choice(nodes),
            protocol=rng.choice(PROTOCOLS), ip=f"10.0.{rng.randrange(256)}.{rng.randrange(256)}",
            msgs_in=msgs_in, msgs_out=msgs_out, bytes_in=msgs_in * rng.randrange(10, 200),
            bytes_out=msgs_out * rng.randrange(10, 200), reason=rng.choice(REASONS)))
    return rows


def random_traffic(rng: random.Random, n: int, start: float, end: float, tenants: list[str], nodes: list[str],
                   topics: int) -> list[dict]:
    """``n`` per-minute rows at random minutes of [start, end), one per
    (minute, node, tenant, topic) at most; some tenant-wide ("") rows."""
    rows, seen = [], set()
    minutes = int((end - start) // 60)
    while len(rows) < n:
        ts = int(start // 60 * 60) + 60 * rng.randrange(minutes)
        tenant, node = rng.choice(tenants), rng.choice(nodes)
        topic = "" if rng.random() < 0.05 else f"t/{rng.randrange(topics):03d}"
        if (ts, node, tenant, topic) in seen:
            continue
        seen.add((ts, node, tenant, topic))
        if topic == "":
            counters = {"auth_failures": rng.randrange(0, 5), "quota_rejected": rng.randrange(0, 3)}
        else:
            q0, q1, q2 = rng.randrange(0, 50), rng.randrange(0, 20), rng.randrange(0, 5)
            out = rng.randrange(0, 100)
            counters = {"msgs_in_q0": q0, "msgs_in_q1": q1, "msgs_in_q2": q2, "bytes_in": (q0 + q1 + q2) * 40,
                        "msgs_out": out, "bytes_out": out * 40, "acl_denied": rng.randrange(0, 2),
                        "dropped_queue_full": rng.randrange(0, 2), "dropped_expired": rng.randrange(0, 2),
                        "dropped_no_subscribers": rng.randrange(0, 3)}
        rows.append(traffic_row(ts, tenant, topic, node=node, **counters))
    return rows

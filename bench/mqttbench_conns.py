#!/usr/bin/env python3
"""mqttbench ``conns`` where every client also subscribes: idle devices, each
with one subscription of its own (``--subscribe``, a format of the client's
index, default ``bench/conns/{}/cmd``), held for ``--duration``. Same options
and output as mqttbench.py; the shared generator is imported, not changed
(only its connect is wrapped, so the connect phase -- and ``connect_rate`` --
covers CONNECT, CONNACK, SUBSCRIBE and SUBACK of each client).

    python bench/mqttbench_conns.py --mqttbench PATH --subscribe 'dev/{}/cmd' \\
        --start-at EPOCH conns --port 1883 --clients 18000 --client-prefix g1 ...

``--start-at EPOCH`` waits until that wall-clock time before starting, so
several generator processes (each limited to its own descriptors) begin their
connect phase together; right after its connect phase each prints one line
``{"phase": "connected", "ok": N, "t0": EPOCH, "t1": EPOCH}`` on stdout, so
whoever runs them (``bench/conns.py``) knows when every connection is up and
how long the phase took across all of them.
"""

import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mqttbench_load


def main() -> int:
    argv = sys.argv[1:]
    path = mqttbench_load.default_path()
    topic_fmt = "bench/conns/{}/cmd"
    start_at = 0.0
    qos = 1
    while argv[:1] in (["--mqttbench"], ["--subscribe"], ["--start-at"], ["--sub-qos"]):
        opt, val, argv = argv[0], argv[1], argv[2:]
        if opt == "--mqttbench":
            path = Path(val)
        elif opt == "--subscribe":
            topic_fmt = val
        elif opt == "--sub-qos":
            qos = int(val)
        else:
            start_at = float(val)
    mqttbench = mqttbench_load.load(path)
    open_client = mqttbench.Bench.open_client
    open_many = mqttbench.Bench.open_many

    async def subscribed_client(self, idx, client_id, timeout):
        cl = await open_client(self, idx, client_id, timeout)
        if not topic_fmt:
            return cl
        cl.fut = self.loop.create_future()
        cl.transport.write(mqttbench.pkt_subscribe(1, topic_fmt.format(f"{self.a.client_prefix}-{idx}"), qos,
                                                   self.v5))
        try:
            codes = await asyncio.wait_for(cl.fut, timeout)
        except BaseException:
            cl.transport.close()
            raise
        cl.fut = None
        if any(c >= 0x80 for c in codes):
            cl.transport.close()
            raise ConnectionError(f"SUBACK {codes.hex()}")
        return cl

    async def timed_open_many(self, n, *args, **kw):
        t0 = time.time()
        res = await open_many(self, n, *args, **kw)
        ok = sum(c is not None for c in res)
        print(json.dumps({"phase": "connected", "ok": ok, "t0": t0, "t1": time.time()}), flush=True)
        return res

    mqttbench.Bench.open_client = subscribed_client
    mqttbench.Bench.open_many = timed_open_many
    if start_at:
        time.sleep(max(0.0, start_at - time.time()))
    return mqttbench.main(argv)


if __name__ == "__main__":
    sys.exit(main())

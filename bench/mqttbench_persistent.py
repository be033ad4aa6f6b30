#!/usr/bin/env python3
"""mqttbench with persistent sessions: every client connects with clean
session = 0 (MQTT 3.1.1), so the broker keeps its subscriptions and queues
in its session store. Same options and output as mqttbench.py.

    python bench/mqttbench_persistent.py --mqttbench PATH pairs --qos 1 ...

The shared generator is imported, not changed: only its CONNECT builder is
wrapped.
"""

import importlib.util
import os
import sys
from pathlib import Path

DEFAULT = Path(__file__).resolve().parent.parent.parent / "shared" / "bench" / "mqttbench.py"


def main() -> int:
    argv = sys.argv[1:]
    path = Path(os.environ.get("MQTTBENCH", DEFAULT))
    if argv[:1] == ["--mqttbench"]:
        path, argv = Path(argv[1]), argv[2:]
    spec = importlib.util.spec_from_file_location("mqttbench", path)
    mqttbench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mqttbench)
    connect = mqttbench.pkt_connect

    def persistent_connect(client_id, keepalive, clean, username, password, v5):
        return connect(client_id, keepalive, False, username, password, v5)

    mqttbench.pkt_connect = persistent_connect
    return mqttbench.main(argv)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""mqttbench with persistent sessions: every client connects with clean
session = 0 (MQTT 3.1.1), so the broker keeps its subscriptions and queues
in its session store. Same options and output as mqttbench.py.

    python bench/mqttbench_persistent.py --mqttbench PATH pairs --qos 1 ...

The shared generator is imported, not changed: only its CONNECT builder is
wrapped.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mqttbench_load


def main() -> int:
    mqttbench, argv = mqttbench_load.from_argv(sys.argv[1:])
    connect = mqttbench.pkt_connect

    def persistent_connect(client_id, keepalive, clean, username, password, v5):
        return connect(client_id, keepalive, False, username, password, v5)

    mqttbench.pkt_connect = persistent_connect
    return mqttbench.main(argv)


if __name__ == "__main__":
    sys.exit(main())

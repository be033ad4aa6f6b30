#!/usr/bin/env python3
"""mqttbench with subscribers on another broker: ``--sub-port PORT`` sends the
subscriber connections (ids ending ``-s<N>``) there, the publishers to
``--port`` -- publishers on one cluster node, subscribers on another. Same
options and output as mqttbench.py; the shared generator is imported, not
changed (only its connect is wrapped).

    python bench/mqttbench_split.py --mqttbench PATH --sub-port 1884 pairs --port 1883 ...
"""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mqttbench_load
import proctree


def main() -> int:
    argv = sys.argv[1:]
    path = mqttbench_load.default_path()
    sub_port = None
    while argv[:1] in (["--mqttbench"], ["--sub-port"]):
        if argv[0] == "--mqttbench":
            path = Path(argv[1])
        else:
            sub_port = int(argv[1])
        argv = argv[2:]
    mqttbench = mqttbench_load.load(path)
    open_client = mqttbench.Bench.open_client
    pub_port = {}

    async def split_open_client(self, idx, client_id, timeout):
        # open_client reads a.port before its first await: set it for this client
        base = pub_port.setdefault("port", self.a.port)
        subscriber = sub_port is not None and re.search(r"-s\d+$", client_id)
        self.a.port = sub_port if subscriber else base
        return await open_client(self, idx, client_id, timeout)

    mqttbench.Bench.open_client = split_open_client
    proctree.patch(mqttbench)         # the broker's figures: with $BENCH_ALSO_PIDS, several nodes summed
    return mqttbench.main(argv)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""mqttbench with the broker measured as a process tree (``proctree``): CPU
and RSS of ``--broker-pid`` summed with its descendants -- a brokerd started
with ``--workers N``: the supervisor and its workers. Same options and output
as mqttbench.py.

    python bench/mqttbench_tree.py --mqttbench PATH pairs --port 1883 --broker-pid PID ...
"""

import importlib.util
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import proctree

DEFAULT = Path(__file__).resolve().parent.parent.parent / "shared" / "bench" / "mqttbench.py"


def main() -> int:
    argv = sys.argv[1:]
    path = Path(os.environ.get("MQTTBENCH", DEFAULT))
    if argv[:1] == ["--mqttbench"]:
        path, argv = Path(argv[1]), argv[2:]
    spec = importlib.util.spec_from_file_location("mqttbench", path)
    mqttbench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mqttbench)
    proctree.patch(mqttbench)
    return mqttbench.main(argv)


if __name__ == "__main__":
    sys.exit(main())

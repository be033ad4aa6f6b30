#!/usr/bin/env python3
"""mqttbench with the broker measured as a process tree (``proctree``): CPU
and RSS of ``--broker-pid`` summed with its descendants -- a brokerd started
with ``--workers N``: the supervisor and its workers. Same options and output
as mqttbench.py.

    python bench/mqttbench_tree.py --mqttbench PATH pairs --port 1883 --broker-pid PID ...
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mqttbench_load
import proctree


def main() -> int:
    mqttbench, argv = mqttbench_load.from_argv(sys.argv[1:])
    proctree.patch(mqttbench)
    return mqttbench.main(argv)


if __name__ == "__main__":
    sys.exit(main())

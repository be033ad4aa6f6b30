"""``python -m brokerd.worker``: one worker of a host, started by ``brokerd.supervisor``
(``--workers N``), which writes its settings as JSON on its standard input.

It dies with its parent: should the supervisor be killed, the kernel sends
the worker ``supervisor.PARENT_GONE`` (``PR_SET_PDEATHSIG``) and it stops as
on a SIGTERM -- once, however many times the signal comes. A supervisor
that died before that took effect leaves it to another parent: the
worker, finding its parent is not the pid its settings name, exits at once.
"""

import ctypes
import ctypes.util
import json
import os
import sys

from .config import Config
from .server import WorkerIdentity, run, setup_logging
from .supervisor import PARENT_GONE

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    name = ctypes.util.find_library("c")
    if name and sys.platform.startswith("linux"):
        ctypes.CDLL(name).prctl(PR_SET_PDEATHSIG, PARENT_GONE)
    if os.getppid() != parent:       # the parent died before prctl took effect
        sys.exit(1)


def main() -> int:
    spec = json.loads(sys.stdin.read())
    # the supervisor's pid as it says, not getppid() here: a supervisor killed while this process
    # started (before main ran) left it to init, and it would take init for its parent
    _die_with_parent(int(spec["parent"]))
    config = Config(**spec["config"])
    worker = WorkerIdentity(spec["host"], spec["slot"])
    setup_logging(config, worker)
    return run(config, worker)


if __name__ == "__main__":
    sys.exit(main())

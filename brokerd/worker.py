"""``python -m brokerd.worker``: one worker of a host, started by ``brokerd.supervisor``
(``--workers N``), which writes its settings as JSON on its standard input.

It dies with its parent: should the supervisor be killed, the kernel sends
the worker ``supervisor.PARENT_GONE`` (``PR_SET_PDEATHSIG``) and it stops as
on a SIGTERM -- once, however many times the signal comes.
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
    parent = os.getppid()
    spec = json.loads(sys.stdin.read())
    _die_with_parent(parent)
    config = Config(**spec["config"])
    worker = WorkerIdentity(spec["host"], spec["slot"])
    setup_logging(config, worker)
    return run(config, worker)


if __name__ == "__main__":
    sys.exit(main())

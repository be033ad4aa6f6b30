"""The shared generator, ``../shared/bench/mqttbench.py``, loaded as a module
by the bench/mqttbench_*.py wrappers (``MQTTBENCH`` or ``--mqttbench PATH``
names another copy)."""

import importlib.util
import os
from pathlib import Path

DEFAULT = Path(__file__).resolve().parent.parent.parent / "shared" / "bench" / "mqttbench.py"


def default_path() -> Path:
    return Path(os.environ.get("MQTTBENCH", DEFAULT))


def load(path: Path):
    spec = importlib.util.spec_from_file_location("mqttbench", path)
    mqttbench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mqttbench)
    return mqttbench


def from_argv(argv: list[str]):
    """-> (the mqttbench module, the arguments after a leading ``--mqttbench PATH``)."""
    path = default_path()
    if argv[:1] == ["--mqttbench"]:
        path, argv = Path(argv[1]), argv[2:]
    return load(path), argv

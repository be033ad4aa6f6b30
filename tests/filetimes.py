"""The order in which ``make test``'s processes take the test files: longest first.

``--dist loadfile`` hands a process a whole file at a time, from one queue.
pytest-xdist's default (``--loadscope-reorder``) sorts that queue by the
number of tests in a file, so the end-to-end files -- one to five tests,
a minute or more each -- were handed out last, and the run ended on one
process while the other had nothing left to take. ``make test`` passes
``--no-loadscope-reorder`` (the queue is the collection order) and
``pytest_collection_modifyitems`` (tests/conftest.py) sorts the collection
here: the files that took longest first, each file's tests in their own
order. A file missing from the table (a new one) goes first, as if it were
the longest: new tests may be slow, and the start of a run is where a slow
file costs nothing.

The table, ``tests/file_times.json`` (file -> seconds of setup, call and
teardown in a ``make test`` run), is brought up to date for the files a run
ran by ``make test PYTEST_ARGS=--write-file-times``. Only the order comes from it:
a stale table makes a run end less evenly, never changes a result.
"""

import json
from collections import defaultdict
from pathlib import Path

TABLE = Path(__file__).with_name("file_times.json")


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def load(path: Path = TABLE) -> dict[str, float]:
    try:
        return {k: float(v) for k, v in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        return {}


def longest_first(items: list, times: dict[str, float]) -> None:
    """Sort ``items`` (pytest items) in place: files by descending seconds in
    ``times`` (unknown files first), a file's tests kept together and in order."""
    first_index: dict[str, int] = {}
    for i, item in enumerate(items):
        first_index.setdefault(file_of(item.nodeid), i)
    unknown = max(times.values(), default=0.0) + 1.0
    items.sort(key=lambda item: (-times.get(file_of(item.nodeid), unknown), first_index[file_of(item.nodeid)]))


class Recorder:
    """Sums the setup, call and teardown seconds of each file's tests; writes the table at the end."""

    def __init__(self, path: Path = TABLE):
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def add(self, report) -> None:
        self.seconds[file_of(report.nodeid)] += report.duration

    def write(self) -> None:
        """The table with this run's files' figures (the others' kept)."""
        merged = {**load(self.path), **{f: round(s, 1) for f, s in self.seconds.items()}}
        table = dict(sorted(merged.items(), key=lambda kv: (-kv[1], kv[0])))
        self.path.write_text(json.dumps(table, indent=1) + "\n")

"""make test's order of the test files (tests/filetimes.py): longest first, each file's tests together."""

import json
from types import SimpleNamespace

from . import filetimes


def items(*nodeids):
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def test_longest_files_first_each_files_tests_in_order_unknown_files_before_all():
    got = items("a.py::t1", "b.py::t1", "a.py::t2", "c.py::t1", "new.py::t1", "b.py::t2", "new.py::t2")
    filetimes.longest_first(got, {"a.py": 5.0, "b.py": 90.0, "c.py": 5.0})
    assert [i.nodeid for i in got] == ["new.py::t1", "new.py::t2", "b.py::t1", "b.py::t2",
                                       "a.py::t1", "a.py::t2", "c.py::t1"]


def test_the_table_covers_every_test_file_of_the_suite():
    """A file missing from tests/file_times.json is scheduled first, as if it were the longest:
    harmless, but a table that lost touch with the suite orders nothing."""
    from pathlib import Path

    here = Path(__file__).resolve().parent
    files = {f"tests/{p.relative_to(here)}" for p in here.rglob("test_*.py")}
    table = json.loads(filetimes.TABLE.read_text())
    missing = sorted(files - set(table))
    assert len(missing) <= 5, f"tests/file_times.json misses {missing}: make test PYTEST_ARGS=--write-file-times"


def test_recorder_merges_this_runs_files_into_the_table(tmp_path):
    table = tmp_path / "times.json"
    table.write_text(json.dumps({"old.py": 7.0, "a.py": 1.0}))
    rec = filetimes.Recorder(table)
    for nodeid, seconds in (("a.py::t1", 2.0), ("a.py::t1", 0.5), ("b.py::t", 3.25)):
        rec.add(SimpleNamespace(nodeid=nodeid, duration=seconds))
    rec.write()
    assert json.loads(table.read_text()) == {"old.py": 7.0, "b.py": 3.2, "a.py": 2.5}
    assert list(json.loads(table.read_text())) == ["old.py", "b.py", "a.py"]

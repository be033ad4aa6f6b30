import itertools
import os
import random

import pytest

from . import filetimes
from .procs import SPARK_TEST_CONF, BrokerProcess

_ids = itertools.count()

# Production keeps Spark's defaults; the suite's Spark runs interpreted and its JVMs with test options
# (tests/procs.py, SPARK_TEST_CONF: why). Subprocesses started with this environment (Celery workers,
# child sessions) get it too; the standalone cluster test (tests/deploy/test_spark_cluster.py) passes it
# on, and the deployed roles (tests/deploy/test_roles.py) get the Java options only: their worker runs
# Spark's code generation as production does.
os.environ.setdefault("SPARK_CONF", SPARK_TEST_CONF)
# No class-data sharing archive (spark_reports/cds.py) for the suite's sessions: a test process would
# write ~150 MB at its exit and wait ~10-20 s for its JVM to do so; tests/reports/test_cds.py runs
# sessions of its own with one.
os.environ.setdefault("SPARK_CDS_DIR", "off")


# ------------------------------------------------------------------ the order of the files (tests/filetimes.py)

def pytest_addoption(parser):
    parser.addoption("--write-file-times", action="store_true",
                     help="bring tests/file_times.json (seconds per test file: make test's order) up to date")
    parser.addoption("--shuffle", type=int, metavar="SEED",
                     help="run the tests in an order drawn from SEED (each test must pass in any order); "
                          "with --dist load a file's tests are spread over the processes too")


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):          # a pytest-xdist process: longest files first
        filetimes.longest_first(items, filetimes.load())
    seed = config.getoption("--shuffle")
    if seed is not None:                        # (every process draws the same order from the seed)
        random.Random(seed).shuffle(items)


def pytest_configure(config):
    if config.getoption("--write-file-times") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_FileTimes(), "file-times")


class _FileTimes:
    def __init__(self):
        self.recorder = filetimes.Recorder()

    def pytest_runtest_logreport(self, report):
        self.recorder.add(report)

    def pytest_sessionfinish(self, session):
        self.recorder.write()


@pytest.fixture(scope="module")
def broker():
    """A brokerd node shared by a test module: anonymous access, mqtt + ws listeners."""
    with BrokerProcess("--sys-interval", "1") as b:
        yield b


@pytest.fixture
def broker_factory():
    """Start brokerd nodes with custom flags: ``broker_factory("--max-inflight", "4")``."""
    started = []

    def start(*args, **kwargs):
        b = BrokerProcess(*args, **kwargs).start()
        started.append(b)
        return b

    yield start
    for b in started:
        b.stop()


@pytest.fixture
def client_id(request):
    """A client id unique to the test (tests share a broker per module)."""
    return f"{request.node.name[:40]}-{os.getpid()}-{next(_ids)}"


# ------------------------------------------------------------------ HBase

@pytest.fixture(scope="session")
def hbase_double(tmp_path_factory):
    """The HBase Thrift gateway test double (tests/hbase_double.py), one process
    for the test session, its tables in a temporary SQLite file; faithful where
    it matters: delete markers on, ``mutateRows`` applied row by row."""
    from .hbase_double import HBaseDoubleProcess

    proc = HBaseDoubleProcess(tmp_path_factory.mktemp("hbase") / "hbase.db", delete_markers=True).start()
    yield proc
    proc.stop()


@pytest.fixture
def hbase_url(request):
    """``hbase://HOST:PORT?table_prefix=t<unique>``: the test double, or the real
    Thrift gateway named by BROKERD_TEST_HBASE=HOST:PORT (whose tables with the
    test's prefix are dropped afterwards)."""
    import uuid

    real = os.environ.get("BROKERD_TEST_HBASE")
    address = real or request.getfixturevalue("hbase_double").address
    prefix = f"t{uuid.uuid4().hex[:12]}"
    yield f"hbase://{address}?table_prefix={prefix}"
    if real:
        import happybase

        host, _, port = real.rpartition(":")
        conn = happybase.Connection(host, int(port), table_prefix=prefix, timeout=10000)
        try:
            for name in conn.tables():
                conn.delete_table(name, disable=True)
        finally:
            conn.close()


# ------------------------------------------------------------------ PostgreSQL

@pytest.fixture(scope="session")
def postgres():
    """A private PostgreSQL server (tests/postgres.py) for the test session."""
    from .postgres import PostgresServer

    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture
def postgres_db(postgres, request):
    """A new empty database on it; -> its ``postgres://`` URL."""
    import uuid

    return postgres.create_database(f"t{uuid.uuid4().hex[:12]}")

"""The reports on a standalone Spark cluster, as docker/compose.yaml's ``spark`` profile runs them:
the image's ``spark-master`` and ``spark-worker`` roles (docker/entrypoint.sh, pyspark's own Spark),
started outside Docker on 127.0.0.1, and a driver with ``SPARK_MASTER=spark://...`` that compacts a
usage log into the lake and runs the tenant and platform reports there, with an executor in the
worker's JVM, not in the driver. The figures are tests/reports/expected.py's."""

import json
import random
import subprocess
import sys

import pytest

from spark_reports import usagegen as gen

from ..procs import ROOT, SPARK_TEST_CONF, SPARK_TEST_JAVA_OPTIONS, free_port
from ..reports import expected as X
from .spark_cluster_job import PERIOD
from .test_roles import VENV_BIN, Role

pytestmark = pytest.mark.slow

TENANTS = ["acme", "globex", "default"]
NODES = ["n1", "n2"]
FIGURES = ("messages", "bytes_in", "bytes_out", "rejected", "dropped", "connects", "disconnects", "devices",
           "peak_connections")


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spark")
    port, ui, worker_ui = free_port(), free_port(), free_port()
    env = {"PATH": f"{VENV_BIN}:/usr/bin:/bin", "HOME": str(tmp), "LANG": "C.UTF-8", "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_LOG_DIR": str(tmp / "logs"), "SPARK_WORKER_DIR": str(tmp / "work"),
           "MQTTHUB_ROLE_FILE": str(tmp / "role"), "SPARK_DAEMON_JAVA_OPTS": SPARK_TEST_JAVA_OPTIONS}
    master = Role("spark-master", dict(env, SPARK_MASTER_HOST="127.0.0.1", SPARK_MASTER_PORT=str(port),
                                       SPARK_MASTER_WEBUI_PORT=str(ui)), ready=r"I have been elected leader",
                  timeout=120)
    url = f"spark://127.0.0.1:{port}"
    try:
        worker = Role("spark-worker", dict(env, SPARK_MASTER=url, SPARK_WORKER_WEBUI_PORT=str(worker_ui)),
                      ready=r"Successfully registered with master", timeout=120)
    except BaseException:
        master.stop()
        raise
    yield url, master, worker
    worker.stop()
    master.stop()


def test_reports_run_on_a_standalone_spark_cluster(spark_cluster, tmp_path):
    url, master, worker = spark_cluster
    rng = random.Random(7)
    conns = gen.random_connections(rng, 200, PERIOD.start - 86400, PERIOD.end + 86400, TENANTS, NODES, 20)
    traffic = gen.random_traffic(rng, 300, PERIOD.start - 86400, PERIOD.end + 86400, TENANTS, NODES, 10)
    gen.write_rows(tmp_path, "connections", conns)
    gen.write_rows(tmp_path, "traffic", traffic)
    env = {"PATH": f"{VENV_BIN}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_MASTER": url, "SPARK_SHUFFLE_PARTITIONS": "2",
           "PYTHONPATH": str(ROOT), "SPARK_CDS_DIR": "off",
           # the suite's Spark settings (tests/procs.py), the executor's JVM too
           "SPARK_CONF": f"{SPARK_TEST_CONF};spark.executor.extraJavaOptions={SPARK_TEST_JAVA_OPTIONS}"}
    proc = subprocess.run([sys.executable, "-m", "tests.deploy.spark_cluster_job", str(tmp_path)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:] + master.log() + worker.log()
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["master"] == url
    assert got["executors"] >= 2                        # the driver and the worker's executor
    assert got["compacted_rows"] > 0
    assert master.match(r"Registering app mqtthub-reports")
    assert worker.match(r"Asked to launch executor")
    for code, tenant in (("tenant", "acme"), ("platform", None)):
        want = X.totals(conns, traffic, PERIOD.start, PERIOD.end, tenant)
        assert {k: got["totals"][code][k] for k in FIGURES} == {k: want[k] for k in FIGURES}, code

"""The driver JVM's class-data sharing archive (spark_reports.cds): made once by
the first session, mapped by the next ones, never a reason for a session to fail.

Each session here is a process of its own (a JVM takes its archive when it
starts; the suite's own session runs without one: tests/conftest.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from pyspark.find_spark_home import _find_spark_home

from spark_reports import cds
from spark_reports.spark import cds_dir, driver_settings

REPO = Path(__file__).resolve().parents[2]

# a session, one query, and what its JVM started with (its pid's memory maps name the archive it maps)
CHILD = """
import json, sys
from spark_reports import cds
from spark_reports.spark import cds_dir, driver_settings
from spark_reports.spark import cds_plan, get_spark
spark = get_spark()
total = spark.range(1000).selectExpr("sum(id) AS s").collect()[0]["s"]
plan = cds_plan()
pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
print(json.dumps({"sum": total, "use": str(plan.use) if plan.use else None,
                  "writes": plan.part is not None, "mapped": plan.use is not None and cds.mapped(plan.use, pid)}))
"""


def _session(cds_dir: Path) -> dict:
    env = {**os.environ, "SPARK_CDS_DIR": str(cds_dir), "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("DJANGO_SETTINGS_MODULE", None)             # spark_reports.spark reads the environment then
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=cds.ARCHIVE_WAIT + 120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_first_session_makes_the_archive_and_the_next_ones_map_it(tmp_path):
    first = _session(tmp_path)
    assert first["sum"] == 499500 and first["writes"] and first["use"] is None
    archives = sorted(tmp_path.glob("*.jsa"))
    assert len(archives) == 1 and not list(tmp_path.glob("*.part"))      # whole, in place once the JVM exited
    assert cds._whole(archives[0])
    second = _session(tmp_path)
    assert second["sum"] == 499500
    assert second["use"] == str(archives[0]) and not second["writes"]
    assert second["mapped"], "the JVM did not map the archive"
    assert sorted(tmp_path.glob("*.jsa")) == archives                     # reused, not made again


def test_an_archive_the_jvm_refuses_does_not_break_a_session(tmp_path):
    """A damaged archive of the right size: the JVM says so and starts without it; the archive is
    removed, so the next session makes a good one."""
    key = cds.key(cds.java_binary(), _find_spark_home(), driver_settings())
    junk = tmp_path / f"{key}-{1 << 16}.jsa"
    junk.write_bytes(os.urandom(1 << 16))
    out = _session(tmp_path)
    assert out["sum"] == 499500
    assert out["use"] == str(junk) and out["mapped"] is False
    assert not junk.exists()


def _spark_home(tmp_path: Path) -> str:
    home = tmp_path / "spark"
    (home / "jars").mkdir(parents=True)
    (home / "jars" / "spark-core.jar").write_bytes(b"v1")
    return str(home)


def test_a_cut_short_archive_is_never_given_to_the_jvm(tmp_path):
    """A truncated archive crashes the JVM (SIGBUS): one whose size is not its name's is removed."""
    home = _spark_home(tmp_path)
    key = cds.key(cds.java_binary(), home, {})
    cut = tmp_path / "cds" / f"{key}-{1 << 20}.jsa"
    cut.parent.mkdir()
    cut.write_bytes(b"\0" * 1000)
    plan = cds.plan(tmp_path / "cds", home, {})
    assert plan.use is None and plan.part is not None
    assert not any("SharedArchiveFile" in o for o in plan.options)
    assert not cut.exists()


def test_another_spark_or_driver_setting_gets_an_archive_of_its_own(tmp_path):
    """A Spark upgrade (other jars) or other driver options: a new archive is made rather than one
    the JVM would refuse; the old one goes once unused for a week."""
    home = _spark_home(tmp_path)
    where = tmp_path / "cds"
    where.mkdir()
    old_key = cds.key(cds.java_binary(), home, {})
    old = where / f"{old_key}-3.jsa"
    old.write_bytes(b"abc")
    assert cds.plan(where, home, {}).use == old
    assert cds.plan(where, home, {"spark.driver.memory": "4g"}).use is None
    (Path(home) / "jars" / "spark-core.jar").write_bytes(b"v2, another size")
    now = old.stat().st_mtime
    plan = cds.plan(where, home, {}, now=now + 3600)
    assert plan.use is None and plan.part is not None and old.exists()
    cds.plan(where, home, {}, now=now + cds.UNUSED + 1)
    assert not old.exists()


def test_off_gives_the_jvm_no_archive(settings):
    settings.SPARK_CDS_DIR = "off"
    assert cds_dir() is None
    settings.SPARK_CDS_DIR = "/srv/cds"
    assert cds_dir() == Path("/srv/cds")
    assert cds.plan(None, _find_spark_home(), {}).options == []

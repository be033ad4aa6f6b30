"""One long-lived SparkSession per process, and where the usage log lives.

A Celery worker (``-P threads``: its tasks share the process) starts the JVM
on its first report and keeps it: later reports skip the few seconds a
session takes to start. Settings (Django settings when configured, else the
environment, so bench/ and plain scripts work without Django):

- ``SPARK_MASTER``: ``local[*]`` (embedded default), ``spark://HOST:7077`` or ``yarn``;
- ``SPARK_SHUFFLE_PARTITIONS``: 4 -- reports aggregate a few thousand groups,
  Spark's 200 default would spend its time on empty tasks;
- adaptive query execution off (``spark.sql.adaptive.enabled=false``; SPARK_CONF
  can turn it on): with 4 shuffle partitions it has nothing to coalesce, and
  it runs every shuffle stage of a query as a job of its own, re-planned and
  compiled after the one before: a tenant report ran 40 jobs instead of 16;
- ``SPARK_DRIVER_MEMORY``: the driver JVM's heap (``1g``);
- ``SPARK_CONF``: more Spark properties, ``key=value`` separated by ``;``
  (``spark.executor.memory=4g;spark.eventLog.enabled=true``), applied last;
- ``USAGE_DIR``: the usage log brokerd writes (``VAR_DIR/usage``); any URI a
  Hadoop filesystem reads (``hdfs://...``, ``s3a://...``) in production;
- ``USAGE_LAKE``: the Parquet lake compaction writes (``USAGE_DIR/lake``), a
  path or a Hadoop URI (spark_reports.lake);
- ``SPARK_CDS_DIR``: the driver JVM's class-data sharing archives
  (``VAR_DIR/spark-cds``, ``off``: none; spark_reports.cds): the first session
  writes one at its exit, later ones start from it.

``SPARK_LOCAL_IP`` defaults to 127.0.0.1 so a local session never looks
for a routable interface; the web UI is off.
"""

import logging
import os
import sys
import threading
from pathlib import Path

from . import cds

_lock = threading.Lock()
_session = None
_cds_plan = cds.Plan()


def setting(name: str, default: str) -> str:
    try:
        from django.conf import settings

        if settings.configured:
            value = getattr(settings, name, None)
            if value not in (None, ""):
                return str(value)
    except ImportError:  # pragma: no cover - Django is always installed here
        pass
    return os.environ.get(name) or default


def var_dir() -> str:
    return setting("VAR_DIR", str(Path(__file__).resolve().parent.parent / "var"))


def cds_dir() -> Path | None:
    """Where the driver JVM's class-data sharing archives live (spark_reports.cds); None: off."""
    value = setting("SPARK_CDS_DIR", str(Path(var_dir()) / "spark-cds"))
    return None if value.strip().lower() in ("off", "none", "0", "false") else Path(value)


def cds_plan() -> cds.Plan:
    """What this process's driver JVM was started with: the archive it maps, or the one it writes at exit."""
    return _cds_plan


def usage_dir() -> str:
    """The usage log's root: a local path or a Hadoop filesystem URI."""
    return setting("USAGE_DIR", str(Path(var_dir()) / "usage"))


def lake_dir() -> str:
    """The usage lake's root (spark_reports.lake): a local path or a Hadoop filesystem URI."""
    return setting("USAGE_LAKE", f"{usage_dir().rstrip('/')}/lake")


def spark_conf(text: str) -> list[tuple[str, str]]:
    """``SPARK_CONF``'s properties: ``key=value;key=value`` (a value may hold spaces and ``=``)."""
    out = []
    for item in text.split(";"):
        key, sep, value = item.strip().partition("=")
        if not item.strip():
            continue
        if not sep or not key.strip().startswith("spark."):
            raise ValueError(f"SPARK_CONF: {item.strip()!r} is not spark.NAME=VALUE")
        out.append((key.strip(), value.strip()))
    return out


def driver_memory() -> str:
    """``SPARK_DRIVER_MEMORY``: the driver JVM's heap."""
    return setting("SPARK_DRIVER_MEMORY", "1g")


def driver_settings() -> dict[str, str]:
    """The settings that reach the driver JVM's command line (its class-data sharing archive's key)."""
    extra = dict(spark_conf(setting("SPARK_CONF", "")))
    driver = {k: v for k, v in extra.items() if k.startswith("spark.driver.")}
    driver["spark.driver.memory"] = extra.get("spark.driver.memory", driver_memory())
    return driver


def spark_running() -> bool:
    """Has this process a live SparkSession (the next report starts at once)?"""
    s = _session
    return s is not None and s._jsc is not None and not s._jsc.sc().isStopped()


def get_spark():
    """This process's SparkSession, started on first use."""
    global _session, _cds_plan
    with _lock:
        if _session is not None and _session._jsc is not None and not _session._jsc.sc().isStopped():
            return _session
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        logging.getLogger("py4j").setLevel(logging.WARNING)
        # executors (local or remote) run the Python of this virtualenv
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark import SparkContext
        from pyspark.find_spark_home import _find_spark_home
        from pyspark.sql import SparkSession

        master = setting("SPARK_MASTER", "local[*]")
        builder = (
            SparkSession.builder.appName("mqtthub-reports")
            .master(master)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", setting("SPARK_SHUFFLE_PARTITIONS", "4"))
            .config("spark.sql.adaptive.enabled", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.driver.memory", driver_memory())
        )
        extra = dict(spark_conf(setting("SPARK_CONF", "")))
        for key, value in extra.items():
            builder = builder.config(key, value)
        launches = SparkContext._gateway is None         # this call starts the driver JVM
        if launches:
            _cds_plan = cds.plan(cds_dir(), _find_spark_home(), driver_settings())
            options = " ".join([*_cds_plan.options, extra.get("spark.driver.extraJavaOptions", "")]).strip()
            if options:
                builder = builder.config("spark.driver.extraJavaOptions", options)
        if master.startswith("local"):
            builder = builder.config("spark.driver.host", os.environ["SPARK_LOCAL_IP"]).config(
                "spark.driver.bindAddress", os.environ["SPARK_LOCAL_IP"])
        _session = builder.getOrCreate()
        if launches:
            cds.after_start(_cds_plan, getattr(SparkContext._gateway, "proc", None), stop_spark)
        _session.sparkContext.setLogLevel(setting("SPARK_LOG_LEVEL", "ERROR"))
        return _session


def stop_spark() -> None:
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None

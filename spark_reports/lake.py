"""The usage lake: brokerd's landed JSON Lines files compacted into Parquet,
exactly once (issue 20).

Landing (brokerd, ``spark_reports.usagegen``): ``LANDING/<dataset>/date=D/
<node>-<YYYYMMDDHHMM>[-n].jsonl``, each file written under a temporary name
and renamed, never changed afterwards. The lake (``USAGE_LAKE``, by default
``USAGE_DIR/lake``; a path or any Hadoop URI)::

    LAKE/<dataset>/date=D/run=<run id>/part-*.parquet    rows of one run, sorted by tenant
    LAKE/<dataset>/date=D/run=<run id>/_manifest.json    the landed files the run consumed
    LAKE/_staging/<run id>/...                          a run's output before its commit
    LAKE/_compaction.lease                              one compaction at a time

A run (``compact``): discard what an earlier, killed run left in
``_staging``; for each dataset and date, the landed files of closed minutes
that no committed manifest names; one Spark job per dataset writes their rows
under ``_staging/<run>/<dataset>/date=D`` (rows sorted by tenant, so that the
Parquet row-group statistics on ``tenant`` let a tenant's report skip the
others' row groups); then per date the manifest goes into the staged
directory and the directory is renamed to ``date=D/run=<run>``: that rename
is the commit -- the rows and the list of files they came from appear
together or not at all. Landed files named in a committed manifest are
deleted afterwards (``keep_landed`` seconds after the commit, so that a
report that listed them just before may still read them); a file a
committed manifest names is never compacted again, whatever happened
between the commit and its deletion. So a run killed at any point and run
again neither loses nor doubles a row.

Readers (``snapshot``) take the same view: committed run directories of the
period's dates, plus the landed files no committed manifest names.

Every lake operation goes through Hadoop's FileSystem API of the Spark
session (``file://``, ``hdfs://``, ``s3a://`` alike). A directory rename is
atomic on a local filesystem and on HDFS; on S3 (s3a) it is a copy and a
delete per object, so a run killed during its commit can leave a partial run
directory that readers would take as committed: keep the lake on HDFS or a
local/shared filesystem, or see the notes of issue 20.
"""

import json
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pyspark.sql import functions as F

from .schemas import CONNECTIONS_SCHEMA, TELEMETRY_SCHEMA, TRAFFIC_SCHEMA
from .spark import get_spark, lake_dir, usage_dir

log = logging.getLogger(__name__)

# dataset -> (schema with the ``date`` partition column, the row's time column)
DATASETS = {"traffic": (TRAFFIC_SCHEMA, "ts"), "connections": (CONNECTIONS_SCHEMA, "disconnected_at"),
            "telemetry": (TELEMETRY_SCHEMA, "ts")}          # store rules' rows (brokerd.integrations.telemetry)
MANIFEST = "_manifest.json"
LEASE = "_compaction.lease"
STAGING = "_staging"
SETTLE = 120                  # seconds after a minute's end before its files are compacted
KEEP_LANDED = 900             # seconds a committed landed file stays for reports that listed it
ROW_GROUP_BYTES = 1 << 20     # Parquet row groups: small enough that a tenant filter skips most
MERGE_DAYS = 7                # closed dates looked at for merging their runs into one
LEASE_STALE = 3600            # seconds after which a lease (a run that died elsewhere) is taken over

_STAMP = re.compile(r"-(\d{12})(?:-\d+)?\.jsonl$")


class CompactionBusy(Exception):
    """Another compaction holds the lake's lease."""


def default_lake(landing: str) -> str:
    return f"{landing.rstrip('/')}/lake"


# ---------------------------------------------------------------- Hadoop filesystem


class HadoopFS:
    """The few FileSystem calls the lake needs, for any URI Spark's Hadoop
    configuration can open (the filesystem is chosen per path)."""

    def __init__(self, spark):
        self.jvm = spark.sparkContext._jvm
        self.conf = spark.sparkContext._jsc.hadoopConfiguration()

    def _fs(self, uri: str):
        path = self.jvm.org.apache.hadoop.fs.Path(uri)
        return path.getFileSystem(self.conf), path

    def exists(self, uri: str) -> bool:
        fs, path = self._fs(uri)
        return fs.exists(path)

    def list(self, uri: str) -> list:
        """FileStatus of the entries of a directory ([] if it is missing)."""
        fs, path = self._fs(uri)
        if not fs.exists(path):
            return []
        return list(fs.listStatus(path))

    def mkdirs(self, uri: str) -> None:
        fs, path = self._fs(uri)
        fs.mkdirs(path)

    def rename(self, src: str, dst: str) -> bool:
        fs, path = self._fs(src)
        return fs.rename(path, self._fs(dst)[1])

    def delete(self, uri: str, recursive: bool = False) -> bool:
        fs, path = self._fs(uri)
        return fs.delete(path, recursive)

    def read_text(self, uri: str) -> str:
        fs, path = self._fs(uri)
        stream = fs.open(path)
        try:
            return bytes(self.jvm.org.apache.commons.io.IOUtils.toByteArray(stream)).decode()
        finally:
            stream.close()

    def create(self, uri: str, text: str, overwrite: bool = True) -> None:
        """Write a small file (FileAlreadyExistsException if it exists and not ``overwrite``)."""
        fs, path = self._fs(uri)
        out = fs.create(path, overwrite)
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()


def _name(status) -> str:
    return status.getPath().getName()


def _key(name: str, size: int, mtime: int) -> tuple:
    return name, int(size), int(mtime)


def _landed_key(status) -> tuple:
    return _key(_name(status), status.getLen(), status.getModificationTime())


def is_landed(status) -> bool:
    name = _name(status)
    return status.isFile() and name.endswith(".jsonl") and not name.startswith((".", "_"))


def minute_of(status) -> float:
    """The epoch second the file's minute ends (its name's stamp; else its modification time)."""
    m = _STAMP.search(_name(status))
    if m:
        return datetime.strptime(m.group(1), "%Y%m%d%H%M").replace(tzinfo=UTC).timestamp() + 60
    return status.getModificationTime() / 1000


def date_dirs(fs: HadoopFS, root: str, first: str | None = None, last: str | None = None) -> list[str]:
    """The ``date=D`` partitions under ``root`` with ``first <= D <= last`` (either open)."""
    out = []
    for st in fs.list(root):
        name = _name(st)
        if st.isDirectory() and name.startswith("date="):
            d = name[5:]
            if (first is None or d >= first) and (last is None or d <= last):
                out.append(d)
    return sorted(out)


# ---------------------------------------------------------------- committed state


@dataclass
class DateState:
    """One lake date partition as committed: its run directories and the landed files they consumed."""

    runs: list[str] = field(default_factory=list)           # URIs of the run=... directories readers read
    consumed: dict[tuple, float] = field(default_factory=dict)   # landed key -> commit time
    manifests: dict[str, dict] = field(default_factory=dict)     # run URI -> its manifest
    replaced: dict[str, float] = field(default_factory=dict)     # run URI merged into another -> that commit's time


def committed(fs: HadoopFS, lake: str, dataset: str, day: str) -> DateState:
    state = DateState()
    base = f"{lake.rstrip('/')}/{dataset}/date={day}"
    for st in fs.list(base):
        if st.isDirectory() and _name(st).startswith("run="):
            uri = f"{base}/{_name(st)}"
            state.manifests[uri] = json.loads(fs.read_text(f"{uri}/{MANIFEST}"))
    replaced_at = {r: m["committed_at"] for m in state.manifests.values() for r in m.get("replaces", [])}
    for uri, m in sorted(state.manifests.items()):
        if m["run"] in replaced_at:
            state.replaced[uri] = replaced_at[m["run"]]
        else:
            state.runs.append(uri)
        for f in m["landed"]:
            state.consumed[_key(f["name"], f["size"], f["mtime"])] = m["committed_at"]
    return state


def landed_files(fs: HadoopFS, landing: str, dataset: str, day: str) -> list:
    return [st for st in fs.list(f"{landing.rstrip('/')}/{dataset}/date={day}") if is_landed(st)]


@dataclass
class Snapshot:
    """What a reader reads of a dataset: committed lake runs and the landed files not yet in one
    -- whole landing date directories where no committed manifest names any of their files."""

    runs: list[str]
    landed: list[str]
    landed_dirs: list[str] = field(default_factory=list)


def snapshot(spark, landing: str, lake: str, dataset: str, first: str, last: str | None,
             opened_before: float | None = None) -> Snapshot:
    """Dates ``first``..``last`` (``last`` None: no upper bound) of a dataset:
    the committed runs, then the landed files that no committed manifest names.
    Manifests are listed before the landing directory: a run committing in
    between consumed files that are still there and not in this view's runs.
    ``opened_before`` (connections): runs whose every connection opened at or
    after it are left out -- a period's later partitions cost a manifest each,
    not a scan."""
    fs = HadoopFS(spark)
    snap = Snapshot([], [])
    lake_days = date_dirs(fs, f"{lake.rstrip('/')}/{dataset}", first, last)
    states = {d: committed(fs, lake, dataset, d) for d in lake_days}
    for day in date_dirs(fs, f"{landing.rstrip('/')}/{dataset}", first, last):
        consumed = states[day].consumed if day in states else {}
        if not consumed:
            # nothing of it compacted (or its compacted files all gone): Spark lists it
            # itself, much faster than a path per file (59,388 files: 292 s vs 49 s a report)
            snap.landed_dirs.append(f"{landing.rstrip('/')}/{dataset}/date={day}")
            continue
        snap.landed += [st.getPath().toString() for st in landed_files(fs, landing, dataset, day)
                        if _landed_key(st) not in consumed]
    for d in lake_days:
        snap.runs += [uri for uri in states[d].runs if not _opened_after(states[d].manifests[uri], opened_before)]
    return snap


def _opened_after(manifest: dict, instant: float | None) -> bool:
    if instant is None or "opened_from" not in manifest:
        return False
    return manifest["opened_from"] is None or manifest["opened_from"] >= instant


# ---------------------------------------------------------------- the lease


class Lease:
    """``LAKE/_compaction.lease``: created only if absent; taken over when its
    holder is a dead process of this host or older than LEASE_STALE."""

    def __init__(self, fs: HadoopFS, lake: str, stale_after: float = LEASE_STALE):
        self.fs, self.uri, self.stale_after = fs, f"{lake.rstrip('/')}/{LEASE}", stale_after
        self.me = {"host": socket.gethostname(), "pid": os.getpid(), "token": uuid.uuid4().hex}

    def _stale(self, holder: dict) -> bool:
        if time.time() - holder.get("at", 0) > self.stale_after:
            return True
        if holder.get("host") == self.me["host"]:
            try:
                os.kill(int(holder["pid"]), 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
        return False

    def __enter__(self):
        if self.fs.exists(self.uri):
            try:
                holder = json.loads(self.fs.read_text(self.uri))
            except Exception:
                holder = {}
            if not self._stale(holder):
                raise CompactionBusy(f"compaction already running: {holder}")
            log.warning("taking over the stale compaction lease of %s", holder)
            self.fs.delete(self.uri)
        try:
            self.fs.create(self.uri, json.dumps({**self.me, "at": time.time()}), overwrite=False)
        except Exception as exc:
            raise CompactionBusy(f"compaction lease taken meanwhile: {exc}") from None
        return self

    def __exit__(self, *exc):
        try:
            if json.loads(self.fs.read_text(self.uri)).get("token") == self.me["token"]:
                self.fs.delete(self.uri)
        except Exception:
            pass


# ---------------------------------------------------------------- compaction


def _checkpoint(name: str) -> None:
    """A named point of a run (tests stop a run here to prove it recovers)."""


@dataclass
class CompactionResult:
    run: str
    files: int = 0                  # landed files compacted
    rows: int = 0                   # rows committed
    dates: list[str] = field(default_factory=list)   # "dataset/date" units committed
    deleted: int = 0                # landed files deleted (committed by this run or earlier ones)
    merged: list[str] = field(default_factory=list)   # "dataset/date" whose runs were merged into one
    dropped_runs: int = 0           # run directories deleted after a merge
    discarded: list[str] = field(default_factory=list)   # uncommitted runs thrown away
    seconds: float = 0.0


def new_run_id(now: float) -> str:
    return f"{datetime.fromtimestamp(now, UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"


def discard_uncommitted(fs: HadoopFS, lake: str) -> list[str]:
    """What killed runs left in ``_staging``: never committed, so never read; removed."""
    out = []
    for st in fs.list(f"{lake.rstrip('/')}/{STAGING}"):
        fs.delete(st.getPath().toString(), True)
        out.append(_name(st))
    return out


def _plan(fs, landing, lake, dataset, now, settle, keep_landed):
    """-> ({date: [landed FileStatus to compact]}, [landed URIs to delete])"""
    units, deletable = {}, []
    for day in date_dirs(fs, f"{landing.rstrip('/')}/{dataset}"):
        files = landed_files(fs, landing, dataset, day)
        if not files:
            continue
        consumed = committed(fs, lake, dataset, day).consumed
        fresh = []
        for st in files:
            at = consumed.get(_landed_key(st))
            if at is None:
                if minute_of(st) + settle <= now:
                    fresh.append(st)
            elif at + keep_landed <= now:
                deletable.append(st.getPath().toString())
        if fresh:
            units[day] = fresh
    return units, deletable


def _write_staged(spark, landing, dataset, staged_root, units, row_group_bytes) -> dict[str, dict]:
    """One Spark job: the rows of every unit's files, Parquet, partitioned by
    date, one file per date, sorted by tenant -> per date its figures.

    Spark lists the units' date directories itself and the rows are kept by
    their file's name (a join with the chosen files): a path per file made
    Spark check and list each one (a backlog of 59,388 files)."""
    schema, time_col = DATASETS[dataset]
    base = f"{landing.rstrip('/')}/{dataset}"
    chosen = spark.createDataFrame([(day, _name(st)) for day, files in units.items() for st in files],
                                   "date string, landed_file string")
    df = (spark.read.schema(schema).option("basePath", base).option("pathGlobFilter", "*.jsonl")
          .option("mode", "DROPMALFORMED").json([f"{base}/date={day}" for day in units])
          .withColumn("landed_file", F.col("_metadata.file_name")))
    df = df.join(F.broadcast(chosen), ["date", "landed_file"]).drop("landed_file").select(*schema.names)
    return _write_parquet(spark, df.filter(F.col("tenant").isNotNull()), schema, time_col, staged_root,
                          row_group_bytes)


def _write_parquet(spark, df, schema, time_col, staged_root, row_group_bytes) -> dict[str, int]:
    (df.repartition("date").sortWithinPartitions("date", "tenant", time_col)      # date first: the writer keeps it
     .write.mode("overwrite").partitionBy("date").option("parquet.block.size", row_group_bytes)
     .option("compression", "snappy").parquet(staged_root))
    """-> per date: {"rows": n} and, for connections, ``opened_from``: the
    earliest ``connected_at`` (a reader of a period ending before it skips the run)."""
    written = spark.read.schema(schema).parquet(staged_root)
    aggs = [F.count(F.lit(1)).alias("rows")]
    if "connected_at" in schema.names:
        aggs.append(F.min("connected_at").alias("opened_from"))
    return {r["date"]: {k: v for k, v in r.asDict().items() if k != "date"}
            for r in written.groupBy("date").agg(*aggs).collect()}


def _commit(fs, lake, dataset, run, staged_root, day, files, stats, now, merged: DateState | None = None) -> None:
    """Commit one date of a run: its manifest into the staged directory, then
    the directory renamed into the lake. A merge's manifest names every landed
    file and run the merged runs did (so they stay consumed and hidden)."""
    staged = f"{staged_root}/date={day}"
    fs.mkdirs(staged)            # a date whose files held no valid row still commits (consumes them)
    landed = [{"name": _name(st), "size": st.getLen(), "mtime": st.getModificationTime()} for st in files]
    replaces = []
    if merged is not None:
        landed = [f for m in merged.manifests.values() for f in m["landed"]]
        replaces = sorted({m["run"] for m in merged.manifests.values()} |
                          {r for m in merged.manifests.values() for r in m.get("replaces", [])})
    if dataset == "connections":
        stats = {"rows": 0, "opened_from": None, **stats}
    manifest = {"format": 1, "run": run, "dataset": dataset, "date": day, "committed_at": now, "rows": 0, **stats,
                "landed": landed, "replaces": replaces}
    fs.create(f"{staged}/{MANIFEST}", json.dumps(manifest))
    _checkpoint("manifest written")
    parent = f"{lake.rstrip('/')}/{dataset}/date={day}"
    fs.mkdirs(parent)
    if not fs.rename(staged, f"{parent}/run={run}"):
        raise OSError(f"commit of {dataset}/{day} failed: rename {staged} -> {parent}/run={run}")
    _checkpoint("committed")


def _merge(spark, fs, lake, dataset, result, now, keep, merge_days, row_group_bytes) -> list[str]:
    """Closed dates (before today, the last ``merge_days``) holding several
    runs (one per compaction: ~288 a day at 5 min) rewritten as one run, rows
    sorted by tenant again; committed like a compaction, with ``replaces``
    naming the runs it supersedes (readers skip them). -> the superseded run
    directories whose merge is ``keep`` seconds old (deleted by the caller)."""
    today = datetime.fromtimestamp(now, UTC).date()
    first = (today - timedelta(days=merge_days)).isoformat()
    last = (today - timedelta(days=1)).isoformat()
    root = f"{lake.rstrip('/')}/{dataset}"
    units, old = {}, []
    for day in date_dirs(fs, root, first, last):
        state = committed(fs, lake, dataset, day)
        old += [uri for uri, at in state.replaced.items() if at + keep <= now]
        if len(state.runs) > 1:
            units[day] = state
    if not units:
        return old
    schema, time_col = DATASETS[dataset]
    run = f"{result.run}-merge"
    staged_root = f"{lake.rstrip('/')}/{STAGING}/{result.run}/{dataset}-merge"
    df = spark.read.schema(schema).option("basePath", root).parquet(
        *[uri for state in units.values() for uri in state.runs]).select(*schema.names)
    rows = _write_parquet(spark, df, schema, time_col, staged_root, row_group_bytes)
    for day, state in sorted(units.items()):
        _commit(fs, lake, dataset, run, staged_root, day, [], rows.get(day, {}), now, merged=state)
        result.merged.append(f"{dataset}/{day}")
        _checkpoint("merge committed")
        if keep <= 0:
            old += state.runs + list(state.replaced)
    return old


def compact(spark, landing: str, lake: str | None = None, *, now: float | None = None, settle: float = SETTLE,
            keep_landed: float = KEEP_LANDED, row_group_bytes: int = ROW_GROUP_BYTES, merge_days: int = MERGE_DAYS,
            datasets: Iterable[str] = tuple(DATASETS)) -> CompactionResult:
    """One compaction run (see the module's docstring); CompactionBusy if another holds the lease."""
    t0 = time.monotonic()
    lake = lake or default_lake(landing)
    now = time.time() if now is None else now
    fs = HadoopFS(spark)
    fs.mkdirs(lake)
    result = CompactionResult(new_run_id(now))
    with Lease(fs, lake):
        result.discarded = discard_uncommitted(fs, lake)
        deletable = []
        for dataset in datasets:
            units, old = _plan(fs, landing, lake, dataset, now, settle, keep_landed)
            deletable += old
            if not units:
                continue
            staged_root = f"{lake.rstrip('/')}/{STAGING}/{result.run}/{dataset}"
            rows = _write_staged(spark, landing, dataset, staged_root, units, row_group_bytes)
            _checkpoint("written")
            for day, files in sorted(units.items()):
                _commit(fs, lake, dataset, result.run, staged_root, day, files, rows.get(day, {}), now)
                result.files += len(files)
                result.rows += rows.get(day, {}).get("rows", 0)
                result.dates.append(f"{dataset}/{day}")
                if keep_landed <= 0:
                    deletable += [st.getPath().toString() for st in files]
        old_runs = []
        for dataset in datasets:
            old_runs += _merge(spark, fs, lake, dataset, result, now, keep_landed, merge_days, row_group_bytes)
        for uri in deletable:
            fs.delete(uri)
            result.deleted += 1
            _checkpoint("deleting")
        for uri in old_runs:
            fs.delete(uri, True)
            result.dropped_runs += 1
        fs.delete(f"{lake.rstrip('/')}/{STAGING}/{result.run}", True)
    result.seconds = time.monotonic() - t0
    log.info("compaction %s: %s files, %s rows into %s; %s landed files deleted; merged %s, %s runs dropped",
             result.run, result.files, result.rows, result.dates, result.deleted, result.merged, result.dropped_runs)
    return result


def main(argv=None) -> int:
    """``python -m spark_reports.lake [LANDING [LAKE]] [--settle S] [--keep-landed S]``"""
    import argparse

    p = argparse.ArgumentParser(description="Compact the landed usage log into the Parquet lake (one run).")
    p.add_argument("landing", nargs="?")
    p.add_argument("lake", nargs="?")
    p.add_argument("--settle", type=float, default=SETTLE)
    p.add_argument("--keep-landed", type=float, default=KEEP_LANDED)
    a = p.parse_args(argv)
    landing = a.landing or usage_dir()
    r = compact(get_spark(), landing, a.lake or (lake_dir() if not a.landing else None), settle=a.settle,
                keep_landed=a.keep_landed)
    print(json.dumps(r.__dict__), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

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
    LAKE/rollups/<dataset>/date=D/run=<run id>/...       a closed date's daily rollup (spark_reports.rollups)
    LAKE/_rollup_todo/<dataset>/date=D                  a date committed since its rollup was made

A run (``compact``): discard what an earlier, killed run left in
``_staging``; for each dataset and date, the landed files of closed minutes
that no committed manifest names; one Spark job per dataset writes their rows
under ``_staging/<run>/<dataset>/date=D`` (rows sorted by tenant, so that the
Parquet row-group statistics on ``tenant`` let a tenant's report skip the
others' row groups); then per date the staged directory is moved to
``date=D/run=<run>`` and its manifest (the landed files it consumed) written
beside the rows under a temporary name and renamed to ``_manifest.json``:
that rename is the commit -- a run directory without its manifest is not
read, so the rows and the list of files they came from appear
together or not at all. Landed files named in a committed manifest are
deleted afterwards (``keep_landed`` seconds after the commit, so that a
report that listed them just before may still read them); a file a
committed manifest names is never compacted again, whatever happened
between the commit and its deletion. So a run killed at any point and run
again neither loses nor doubles a row.

Readers (``snapshot``) take the same view: committed run directories of the
period's dates, plus the landed files no committed manifest names.

Daily rollups (traffic and connections; ``spark_reports.rollups``): every
commit into a date first drops a marker in ``_rollup_todo``; at the end of a
run, each marked date that is closed (before the run's UTC day) gets its
rollup made again from the date's committed rows -- unless the rollup there
is current -- and committed the same way (staged, moved, manifest last).
A rollup's manifest names its ``source``: a digest of the date's live run
ids (a committed run's rows never change, so the live runs are the date's
rows). A reader uses a date's rollup only where its source is the date's
source in the reader's own view of the lake and no landed file of that date
is waiting; anywhere else it reads the date's raw rows. So late rows, a merge
(new run ids, same rows) or a run killed between a commit and the rollup
never make a reader count a row twice or miss one: at worst it reads the
raw rows until the next run brings the rollup up to date, and the marker,
removed only once the rollup is current, makes that run do it.

Every lake operation goes through Hadoop's FileSystem API of the Spark
session (a path, ``file://``, ``hdfs://``, ``s3a://`` alike). The commit
needs one thing atomic: a single small file appearing whole under its new
name (``_publish``) -- a rename on a local filesystem and on HDFS, a copy of
one object on S3 (s3a). The directory move before it need not be (on s3a
it is a copy and a delete per object). Not atomic on s3a: the lease's
create-if-absent (a check, then a write): run one compaction at a time (one
beat) there.
"""

import hashlib
import json
import logging
import os
import re
import socket
import threading
import time
import urllib.parse
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pyspark.sql import functions as F

from . import rollups as rollup_defs
from .schemas import CONNECTIONS_SCHEMA, TELEMETRY_SCHEMA, TRAFFIC_SCHEMA
from .spark import get_spark, lake_dir, usage_dir

log = logging.getLogger(__name__)

# dataset -> (schema with the ``date`` partition column, the row's time column)
DATASETS = {"traffic": (TRAFFIC_SCHEMA, "ts"), "connections": (CONNECTIONS_SCHEMA, "disconnected_at"),
            "telemetry": (TELEMETRY_SCHEMA, "ts")}          # store rules' rows (brokerd.integrations.telemetry)
MANIFEST = "_manifest.json"
MANIFEST_TMP = "_manifest.json.tmp"     # written beside the data, renamed to MANIFEST: the commit
MOVING = "_moving"                      # _staging/<run>/_moving/*: run directories being committed
LEASE = "_compaction.lease"
STAGING = "_staging"
ROLLUPS = "rollups"           # LAKE/rollups/<dataset>/date=D/run=R: daily rollups
TODO = "_rollup_todo"         # LAKE/_rollup_todo/<dataset>/date=D: a date whose rollup may be stale
ROLLED = tuple(rollup_defs.SCHEMAS)   # the datasets that have daily rollups
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
        # the classes, looked up once: each name of a ``jvm.org.apache...`` chain is a round trip
        # to the JVM (five for Path), and a compaction makes a Path for every file it touches
        self._path = self.jvm.org.apache.hadoop.fs.Path
        self._io = self.jvm.org.apache.commons.io.IOUtils

    def _fs(self, uri: str):
        path = self._path(uri)
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
            return bytes(self._io.toByteArray(stream)).decode()
        finally:
            stream.close()

    def modified(self, uri: str) -> float:
        """A file's modification time (seconds since the epoch)."""
        fs, path = self._fs(uri)
        return fs.getFileStatus(path).getModificationTime() / 1000

    def create_new(self, uri: str, text: str) -> None:
        """Write a small file only if none is there, whole or not at all; FileExistsError if one is.
        A local path: the text written under a name of its own, then hard-linked to ``uri`` (``link``
        fails if the name exists: atomic, where Hadoop's local ``create`` checks, then opens). Any other
        filesystem: its ``create`` without overwrite (atomic on HDFS; on s3a a check, then a write)."""
        parsed = urllib.parse.urlparse(uri)
        if parsed.scheme in ("", "file"):
            path = urllib.parse.unquote(parsed.path) if parsed.scheme else uri
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            tmp = f"{path}.{uuid.uuid4().hex}.tmp"
            with open(tmp, "w") as f:
                f.write(text)
            try:
                os.link(tmp, path)
            finally:
                os.unlink(tmp)
            return
        try:
            self.create(uri, text, overwrite=False)
        except Exception as exc:
            raise FileExistsError(f"{uri}: {exc}") from None

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

    @property
    def source(self) -> str:
        """The date's rows as a digest of its live run ids (a committed run never changes): what a
        rollup of the date was made from."""
        return hashlib.sha1("\n".join(sorted(self.manifests[u]["run"] for u in self.runs)).encode()).hexdigest()


class _Manifests:
    """Committed manifests read in this process, by run directory: a run's manifest is written
    once, as its commit, and never changed, and run ids are never reused -- so a manifest once
    read is the manifest for good. A compaction every few minutes otherwise read every manifest
    of every date it looks at again (each a few JVM round trips and a file read), and so did
    each report; least recently used ones are forgotten past ``limit``."""

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._lock = threading.Lock()
        self._read: OrderedDict[str, dict] = OrderedDict()

    def get(self, uri: str) -> dict | None:
        with self._lock:
            manifest = self._read.get(uri)
            if manifest is not None:
                self._read.move_to_end(uri)
            return manifest

    def put(self, uri: str, manifest: dict) -> None:
        with self._lock:
            self._read[uri] = manifest
            while len(self._read) > self.limit:
                self._read.popitem(last=False)


_manifests = _Manifests()


def read_manifest(fs: HadoopFS, run_uri: str) -> dict | None:
    """The committed manifest of a run directory (lake or rollup), None if it has none (not
    committed). Callers only read it."""
    manifest = _manifests.get(run_uri)
    if manifest is None and fs.exists(f"{run_uri}/{MANIFEST}"):
        manifest = json.loads(fs.read_text(f"{run_uri}/{MANIFEST}"))
        _manifests.put(run_uri, manifest)
    return manifest


def committed(fs: HadoopFS, lake: str, dataset: str, day: str) -> DateState:
    state = DateState()
    base = f"{lake.rstrip('/')}/{dataset}/date={day}"
    for st in fs.list(base):
        if st.isDirectory() and _name(st).startswith("run="):
            uri = f"{base}/{_name(st)}"
            manifest = read_manifest(fs, uri)
            if manifest is not None:                    # without it: not committed (``_publish``)
                state.manifests[uri] = manifest
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
    rollups: list[str] = field(default_factory=list)    # rollup runs of dates read from them (not in ``runs``)
    rolled_dates: list[str] = field(default_factory=list)


def snapshot(spark, landing: str, lake: str, dataset: str, first: str, last: str | None,
             opened_before: float | None = None, rollups: bool = False) -> Snapshot:
    """Dates ``first``..``last`` (``last`` None: no upper bound) of a dataset:
    the committed runs, then the landed files that no committed manifest names.
    Manifests are listed before the landing directory: a run committing in
    between consumed files that are still there and not in this view's runs.
    ``opened_before`` (connections): runs whose every connection opened at or
    after it are left out -- a period's later partitions cost a manifest each,
    not a scan. ``rollups``: a date whose daily rollup is current and that has
    no landed file waiting is read from its rollup (``rollups``) instead of
    its runs."""
    fs = HadoopFS(spark)
    snap = Snapshot([], [])
    lake_days = date_dirs(fs, f"{lake.rstrip('/')}/{dataset}", first, last)
    states = {d: committed(fs, lake, dataset, d) for d in lake_days}
    waiting = set()                   # dates with landed files no committed run holds
    for day in date_dirs(fs, f"{landing.rstrip('/')}/{dataset}", first, last):
        consumed = states[day].consumed if day in states else {}
        if not consumed:
            # nothing of it compacted (or its compacted files all gone): Spark lists it
            # itself, much faster than a path per file (59,388 files: 292 s vs 49 s a report)
            snap.landed_dirs.append(f"{landing.rstrip('/')}/{dataset}/date={day}")
            waiting.add(day)
            continue
        fresh = [st.getPath().toString() for st in landed_files(fs, landing, dataset, day)
                 if _landed_key(st) not in consumed]
        snap.landed += fresh
        if fresh:
            waiting.add(day)
    for d in lake_days:
        runs = [uri for uri in states[d].runs if not _opened_after(states[d].manifests[uri], opened_before)]
        rollup = current_rollup(fs, lake, dataset, d, states[d]) if rollups and runs and d not in waiting else None
        if rollup:
            snap.rollups.append(rollup)
            snap.rolled_dates.append(d)
        else:
            snap.runs += runs
    return snap


def _opened_after(manifest: dict, instant: float | None) -> bool:
    if instant is None or "opened_from" not in manifest:
        return False
    return manifest["opened_from"] is None or manifest["opened_from"] >= instant


# ---------------------------------------------------------------- daily rollups


def rollup_root(lake: str, dataset: str) -> str:
    return f"{lake.rstrip('/')}/{ROLLUPS}/{dataset}"


def rollups_of(fs: HadoopFS, lake: str, dataset: str, day: str) -> dict[str, dict]:
    """A date's committed rollup runs: URI -> manifest."""
    base = f"{rollup_root(lake, dataset)}/date={day}"
    runs = [f"{base}/{_name(st)}" for st in fs.list(base) if st.isDirectory() and _name(st).startswith("run=")]
    manifests = {uri: read_manifest(fs, uri) for uri in runs}
    return {uri: m for uri, m in manifests.items() if m is not None}


def _current(rolls: dict[str, dict], source: str) -> str | None:
    """The newest rollup run made from ``source`` (None: the date's rollup is stale or missing)."""
    made = [(m["committed_at"], uri) for uri, m in rolls.items() if m["source"] == source]
    return max(made)[1] if made else None


def current_rollup(fs: HadoopFS, lake: str, dataset: str, day: str, state: DateState) -> str | None:
    return _current(rollups_of(fs, lake, dataset, day), state.source) if dataset in ROLLED else None


def _mark(fs: HadoopFS, lake: str, dataset: str, day: str) -> None:
    """``_rollup_todo/<dataset>/date=D``: written before a commit into the date, removed once its rollup
    is current -- a run killed in between leaves it for the next."""
    if dataset in ROLLED:
        fs.create(f"{lake.rstrip('/')}/{TODO}/{dataset}/date={day}", "", overwrite=True)


def _mark_all_once(fs: HadoopFS, lake: str, dataset: str) -> None:
    """A lake from before rollups (no ``_rollup_todo/<dataset>``): every date it holds marked, before
    the run commits anything."""
    root = f"{lake.rstrip('/')}/{TODO}/{dataset}"
    if not fs.exists(root):
        for day in date_dirs(fs, f"{lake.rstrip('/')}/{dataset}"):
            _mark(fs, lake, dataset, day)
        fs.mkdirs(root)


def _todo(fs: HadoopFS, lake: str, dataset: str) -> list[str]:
    root = f"{lake.rstrip('/')}/{TODO}/{dataset}"
    return sorted(_name(st)[5:] for st in fs.list(root) if _name(st).startswith("date="))


def _rollup(spark, fs, lake, dataset, result, now, keep, row_group_bytes) -> list[str]:
    """The marked dates before the run's UTC day whose rollup is not current: their rollups made
    from their committed rows in one Spark job, committed per date (manifest, then one rename).
    Markers are removed, and superseded rollup runs returned for deletion, ``keep`` seconds after
    the current rollup's commit (a reader that took the older view may still read the older one)."""
    today = datetime.fromtimestamp(now, UTC).date().isoformat()
    days = [d for d in _todo(fs, lake, dataset) if d < today]
    if not days:
        return []
    states = {d: committed(fs, lake, dataset, d) for d in days}
    rolls = {d: rollups_of(fs, lake, dataset, d) for d in days}
    stale = [d for d in days if states[d].runs and _current(rolls[d], states[d].source) is None]
    if stale:
        schema, _ = DATASETS[dataset]
        rschema, order = rollup_defs.SCHEMAS[dataset]
        raw = spark.read.schema(schema).option("basePath", f"{lake.rstrip('/')}/{dataset}").parquet(
            *[uri for d in stale for uri in states[d].runs]).select(*schema.names)
        if dataset == "connections":
            raw = raw.filter(F.col("tenant").isNotNull() & F.col("connected_at").isNotNull()
                             & F.col("disconnected_at").isNotNull())
        else:
            raw = raw.filter(F.col("tenant").isNotNull() & F.col("ts").isNotNull())
        staged_root = f"{lake.rstrip('/')}/{STAGING}/{result.run}/{ROLLUPS}-{dataset}"
        stats = _write_parquet(spark, rollup_defs.GROUPERS[dataset](raw), rschema, order, staged_root,
                               row_group_bytes)
        _checkpoint("rollup written")
        for d in stale:
            _commit_rollup(fs, lake, dataset, result.run, staged_root, d, states[d].source, stats.get(d, {}), now)
            result.rolled_up.append(f"{dataset}/{d}")
            _checkpoint("rollup committed")
            rolls[d] = rollups_of(fs, lake, dataset, d)
    old = []
    for d in days:
        current = _current(rolls[d], states[d].source)
        if current is None and states[d].runs:
            continue                                   # cannot happen but for a failure above: marked still
        if current is not None and rolls[d][current]["committed_at"] + keep > now:
            continue                                   # superseded ones stay a while: marked still
        old += [uri for uri in rolls[d] if uri != current]
        fs.delete(f"{lake.rstrip('/')}/{TODO}/{dataset}/date={d}")
    return old


_ROLLUP_RUN = re.compile("/" + ROLLUPS + "/(" + "|".join(ROLLED) + r")/date=(\d{4}-\d{2}-\d{2})/(run=[\w.-]+)/")


def drop_damaged_rollups(spark, lake: str, error: str) -> list[str]:
    """The rollup runs of ``lake`` that ``error`` (a failed read's message) names -- a part file cut
    short or damaged on disk -- deleted, their dates marked for the next compaction to make again:
    a rollup is the lake's rows grouped, so readers read the date's raw rows meanwhile, where a
    damaged one made every report over the date fail. -> the run directories deleted."""
    fs = HadoopFS(spark)
    out = []
    for dataset, day, run in sorted(set(_ROLLUP_RUN.findall(error))):
        uri = f"{rollup_root(lake, dataset)}/date={day}/{run}"
        if fs.exists(uri):
            _mark(fs, lake, dataset, day)
            fs.delete(uri, True)
            log.warning("damaged daily rollup %s deleted: its date is read from its rows until the next "
                        "compaction makes it again", uri)
            out.append(uri)
    return out


def _commit_rollup(fs, lake, dataset, run, staged_root, day, source, stats, now) -> None:
    staged = f"{staged_root}/date={day}"
    fs.mkdirs(staged)                 # a date without a row still gets its (empty) rollup
    manifest = {"format": 1, "run": run, "dataset": dataset, "date": day, "source": source, "committed_at": now,
                "rows": 0, **stats}
    _publish(fs, lake, run, staged, f"{rollup_root(lake, dataset)}/date={day}/run={run}", manifest)


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
        # threads of one process (a Celery worker's pool) first: one run per lake at a time
        with _LEASE_LOCKS_GUARD:
            lock = _LEASE_LOCKS.setdefault(self.uri, threading.Lock())
        if not lock.acquire(blocking=False):
            raise CompactionBusy("compaction already running in this process")
        try:
            self._take()
        except BaseException:
            lock.release()
            raise
        self._lock = lock
        return self

    def _take(self) -> None:
        if self.fs.exists(self.uri):
            try:
                holder = json.loads(self.fs.read_text(self.uri))
            except Exception:       # gone meanwhile, or damaged: as old as the file (never "at 0")
                try:
                    holder = {"at": self.fs.modified(self.uri), "unreadable": True}
                except Exception:
                    holder = {"at": time.time(), "unreadable": True}
            if not self._stale(holder):
                raise CompactionBusy(f"compaction already running: {holder}")
            log.warning("taking over the stale compaction lease of %s", holder)
            self.fs.delete(self.uri)
        try:
            self.fs.create_new(self.uri, json.dumps({**self.me, "at": time.time()}))
        except Exception as exc:
            raise CompactionBusy(f"compaction lease taken meanwhile: {exc}") from None

    def __exit__(self, *exc):
        try:
            if json.loads(self.fs.read_text(self.uri)).get("token") == self.me["token"]:
                self.fs.delete(self.uri)
        except Exception:
            pass
        finally:
            self._lock.release()


_LEASE_LOCKS: dict[str, threading.Lock] = {}
_LEASE_LOCKS_GUARD = threading.Lock()


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
    rolled_up: list[str] = field(default_factory=list)   # "dataset/date" whose daily rollup was made again
    rollup_seconds: float = 0.0     # of ``seconds``: making the daily rollups
    seconds: float = 0.0


def new_run_id(now: float) -> str:
    return f"{datetime.fromtimestamp(now, UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"


def discard_uncommitted(fs: HadoopFS, lake: str) -> list[str]:
    """What killed runs left: their ``_staging`` (never read) and the run directories they moved
    into the lake without publishing their manifest (readers skip them); removed."""
    out = []
    for st in fs.list(f"{lake.rstrip('/')}/{STAGING}"):
        staged_run = st.getPath().toString()
        for intent in fs.list(f"{staged_run}/{MOVING}"):
            target = fs.read_text(intent.getPath().toString())
            if target and not fs.exists(f"{target}/{MANIFEST}"):
                fs.delete(target, True)
        fs.delete(staged_run, True)
        out.append(_name(st))
    return out


def _publish(fs: HadoopFS, lake: str, run: str, staged: str, target: str, manifest: dict) -> None:
    """The commit of a staged directory: moved to ``target`` (a new ``run=`` directory), then its
    manifest written beside the data under a temporary name and renamed to ``_manifest.json`` --
    that last rename is the commit. Readers take a run directory only with its manifest, a single
    file that appears whole, so the directory's move need not be atomic: on s3a it is a copy and a
    delete per object. Before the move, ``_staging/<run>/_moving/`` notes the target: a run killed
    between the move and the manifest leaves a directory without one, which the next run deletes."""
    fs.create(f"{lake.rstrip('/')}/{STAGING}/{run}/{MOVING}/{uuid.uuid4().hex}", target)
    fs.mkdirs(target.rsplit("/", 1)[0])
    if not fs.rename(staged, target):
        raise OSError(f"commit failed: rename {staged} -> {target}")
    _checkpoint("moved")
    fs.create(f"{target}/{MANIFEST_TMP}", json.dumps(manifest))
    _checkpoint("manifest written")
    if not fs.rename(f"{target}/{MANIFEST_TMP}", f"{target}/{MANIFEST}"):
        raise OSError(f"commit failed: rename {target}/{MANIFEST_TMP} -> {MANIFEST}")


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
    """Commit one date of a run (``_publish``: the directory moved into the
    lake, then its manifest). A merge's manifest names every landed
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
    _mark(fs, lake, dataset, day)
    _publish(fs, lake, run, staged, f"{lake.rstrip('/')}/{dataset}/date={day}/run={run}", manifest)
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
            datasets: Iterable[str] = tuple(DATASETS), rollups: bool = True) -> CompactionResult:
    """One compaction run (see the module's docstring); CompactionBusy if another holds the lease."""
    t0 = time.monotonic()
    lake = lake or default_lake(landing)
    now = time.time() if now is None else now
    fs = HadoopFS(spark)
    fs.mkdirs(lake)
    result = CompactionResult(new_run_id(now))
    with Lease(fs, lake):
        result.discarded = discard_uncommitted(fs, lake)
        for dataset in datasets:
            if dataset in ROLLED and rollups:
                _mark_all_once(fs, lake, dataset)
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
        t_rollup = time.monotonic()
        for dataset in datasets:
            if dataset in ROLLED and rollups:
                old_runs += _rollup(spark, fs, lake, dataset, result, now, keep_landed, row_group_bytes)
        result.rollup_seconds = time.monotonic() - t_rollup
        for uri in deletable:
            fs.delete(uri)
            result.deleted += 1
            _checkpoint("deleting")
        for uri in old_runs:
            fs.delete(uri, True)
            result.dropped_runs += 1
        fs.delete(f"{lake.rstrip('/')}/{STAGING}/{result.run}", True)
    result.seconds = time.monotonic() - t0
    log.info("compaction %s: %s files, %s rows into %s; %s landed files deleted; merged %s; rolled up %s; "
             "%s runs dropped", result.run, result.files, result.rows, result.dates, result.deleted, result.merged,
             result.rolled_up, result.dropped_runs)
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

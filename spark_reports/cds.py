"""Class-data sharing for the driver JVM: a cold report starts from classes
already parsed and verified (issue 20).

A report's first run in a fresh process loads ~20,000 classes (Spark, Catalyst,
Hadoop, Parquet, Scala) from 280 jars; reading, parsing and verifying them is
much of its cold time. Java's dynamic CDS archive keeps them mapped from one
file: the first session of a set-up writes it when its JVM exits
(``-XX:ArchiveClassesAtExit``), every later one starts with it
(``-XX:SharedArchiveFile``). Measured on the 10M-row lake (2 cores): the
session start 4.8-6 s -> 2.6-3.2 s, the tenant report's first run ~2 s less on top.

- Where: ``SPARK_CDS_DIR`` (``VAR_DIR/spark-cds``; ``off``: none), one archive
  per *key*: the Java runtime (its files' sizes and times), Spark's jars and
  conf directory, and the driver's class path and JVM options -- an upgrade of
  either, or other options, makes a new archive rather than use one the JVM
  would refuse. Archives of other keys are removed once unused for a week.
- Made once: a session that finds no archive for its key has its JVM dump one
  at exit; this process waits for it (``ARCHIVE_WAIT``) at its own exit,
  then moves it into place whole (``os.replace``, after ``fsync``), its byte
  size in its name. A JVM killed or timing out leaves only a ``.part`` file,
  removed an hour later.
- Harmless when missing or stale: no archive -> the JVM's defaults; an
  archive the JVM cannot use (other classes, a damaged file of the right
  size) -> it says so in one warning line and loads classes as usual, and
  the archive is removed (the next session makes a new one). A
  *truncated* archive would crash the JVM (SIGBUS, measured): so an archive
  whose size is not the one in its name is never used, and removed.
- Only where this process launches the JVM: not under ``spark-submit``
  (``PYSPARK_GATEWAY_PORT``) and not when a gateway already runs.

The dump costs the first process ~10-20 s of CPU at its exit, once per key.
"""

import atexit
import glob
import hashlib
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

ARCHIVE_WAIT = 180              # seconds a process waits at exit for its JVM to write the archive
PART_STALE = 3600               # a .part older than this: its JVM was killed, remove it
UNUSED = 7 * 86400              # archives of other keys unused this long: removed


@dataclass
class Plan:
    """What the driver JVM gets: ``options`` (JVM flags), the archive it maps (``use``) or the
    one it writes at exit (``part``, moved into ``directory`` afterwards)."""

    options: list[str] = field(default_factory=list)
    use: Path | None = None
    part: Path | None = None
    directory: Path | None = None
    key: str = ""


def java_binary() -> str | None:
    """The ``java`` Spark's launcher runs: ``JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(found) if found and os.path.exists(found) else None


def _stat(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return f"{path}:-"
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def key(java: str, spark_home: str, driver: dict[str, str]) -> str:
    """A digest of what the archive depends on: the JVM's files, Spark's jars and conf
    directory (the class path), and the driver's settings that reach the JVM."""
    jdk = Path(java).parent.parent
    parts = [_stat(java), _stat(str(jdk / "lib" / "modules")), _stat(str(jdk / "lib" / "server" / "libjvm.so"))]
    for sub in ("jars", "conf"):
        parts += sorted(_stat(p) for p in glob.glob(os.path.join(spark_home, sub, "*")))
    parts += [f"{k}={driver[k]}" for k in sorted(driver)]
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()[:16]


def _archives(directory: Path, k: str) -> list[Path]:
    return sorted(directory.glob(f"{k}-*.jsa"))


def _whole(path: Path) -> bool:
    """Is the archive the size its name says (``KEY-SIZE.jsa``)?"""
    try:
        return path.stat().st_size == int(path.stem.rsplit("-", 1)[1])
    except (OSError, ValueError, IndexError):
        return False


def _tidy(directory: Path, k: str, now: float) -> None:
    """Remove .part files of killed JVMs, and other keys' archives unused for UNUSED seconds."""
    for p in directory.glob("*.part"):
        _remove_if(p, lambda st: now - st.st_mtime > PART_STALE)
    for p in directory.glob("*.jsa"):
        if not p.name.startswith(f"{k}-"):
            _remove_if(p, lambda st: now - st.st_mtime > UNUSED)


def _remove_if(path: Path, old) -> None:
    try:
        if old(path.stat()):
            path.unlink()
    except OSError:
        pass


def plan(directory: Path | None, spark_home: str, driver: dict[str, str], now: float | None = None) -> Plan:
    """The JVM options for this process's driver: map the key's archive where a whole one is
    there, else write one at exit. No options without a directory or a ``java``."""
    java = java_binary()
    if directory is None or java is None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return Plan()
    now = time.time() if now is None else now
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return Plan()
    k = key(java, spark_home, driver)
    _tidy(directory, k, now)
    for archive in _archives(directory, k):
        if _whole(archive):
            try:
                os.utime(archive)                   # in use: not "unused" for _tidy
            except OSError:
                pass
            return Plan([f"-XX:SharedArchiveFile={archive}"], use=archive, directory=directory, key=k)
        _remove_if(archive, lambda st: True)        # cut short: the JVM would crash on it
    part = directory / f"{k}-{os.getpid()}-{uuid.uuid4().hex[:8]}.part"
    # the dump warns of every class it leaves out (~400: signed jars, generated accessors) on stdout
    return Plan([f"-XX:ArchiveClassesAtExit={part}", "-Xlog:cds=off,cds+dynamic=off"], part=part,
                directory=directory, key=k)


def mapped(archive: Path, pid: int) -> bool | None:
    """Has process ``pid`` mapped ``archive`` (None: cannot tell, no /proc)?"""
    try:
        return str(archive) in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return None


def after_start(plan_: Plan, proc, stop) -> None:
    """Once the driver JVM runs: an archive it refused (``mapped`` False: made for other
    classes, or damaged) is removed, so that the next session writes a good one; an archive
    to write is waited for at this process's exit (``finish``)."""
    if proc is None:
        return
    if plan_.use is not None and mapped(plan_.use, proc.pid) is False:
        log.warning("class-data sharing archive %s not used by the JVM: removed, the next session makes one",
                    plan_.use)
        _remove_if(plan_.use, lambda st: True)
    if plan_.part is not None:
        atexit.register(finish, plan_, proc, stop)


def finish(plan_: Plan, proc, stop=None, wait: float = ARCHIVE_WAIT) -> Path | None:
    """Move the archive the exited JVM wrote into place; None (and no .part left) if it wrote none."""
    try:
        if stop is not None:
            stop()
        if proc.stdin is not None:
            proc.stdin.close()
        code = proc.wait(timeout=wait)
    except Exception:  # at exit: a JVM that does not end leaves its .part for _tidy
        return None
    part = plan_.part
    if code != 0 or not part.exists() or part.stat().st_size == 0:
        _remove_if(part, lambda st: True)
        return None
    with open(part, "rb") as f:
        os.fsync(f.fileno())
    final = plan_.directory / f"{plan_.key}-{part.stat().st_size}.jsa"
    os.replace(part, final)
    return final

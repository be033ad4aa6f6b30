"""Real processes for tests: a brokerd node started on free loopback ports.

``BrokerProcess`` runs ``python -m brokerd`` with the given flags, waits for
its ``brokerd ready`` line and reads the bound ports from it. Ports are
chosen by the kernel (``:0``), so tests can run side by side.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Java options of the suite's Spark JVMs (drivers, and in tests/deploy a standalone cluster's daemons and
# executor): the first JIT tier only (C1; a test JVM lives seconds to minutes and C2's compiler threads
# took the CPU its tests wait for on 2 cores) and the serial collector (no GC threads). Flags of the
# JVM alone: what Spark computes is the same. A cold session with its first reports: ~30% faster.
SPARK_TEST_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# The suite's SPARK_CONF (tests/conftest.py): Spark interpreted -- the reports' test data is a few hundred
# rows, compiling Java for each query plan (whole-stage and expression code generation) is most of what a
# test's Spark job spends; interpreted it runs in about half the time (tenant and platform report,
# 102 s -> 34 s cold and 17.9 s -> 11.6 s warm on a loaded 2-core machine) -- and SPARK_TEST_JAVA_OPTIONS.
SPARK_TEST_CONF = ("spark.sql.codegen.wholeStage=false;spark.sql.codegen.factoryMode=NO_CODEGEN;"
                   f"spark.driver.extraJavaOptions={SPARK_TEST_JAVA_OPTIONS}")
READY = re.compile(r"brokerd ready .*listeners=(.*)$")
ADMIN = re.compile(r" admin=(\S+)")


def _states(pid: int) -> list[str]:
    """The scheduler state letter of each thread of ``pid`` (``/proc/PID/task/*/stat``)."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                out.append(fh.read().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:           # the thread ended meanwhile
            pass
    return out


def sigstop(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP ``pid`` and return once every one of its threads is stopped.

    ``kill()`` only queues the signal: a multi-threaded process stops when one
    of its threads runs and takes it, then each other thread at its next
    return to user space. Until then a thread woken by a request (the HBase
    double's connection thread, a node's store thread) can still answer it --
    on a loaded host for long enough that a test's next call gets served."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while not all(s in "TtZX" for s in _states(pid)):
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} not stopped {timeout} s after SIGSTOP: {_states(pid)}")
        time.sleep(0.001)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BrokerProcess:
    def __init__(self, *args: str, listen=("mqtt://127.0.0.1:0", "ws://127.0.0.1:0/mqtt"),
                 anonymous: bool = True, env: dict | None = None, timeout: float = 15.0):
        self.args = list(args)
        self.listen = list(listen)
        self.anonymous = anonymous
        self.env = env
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None
        self.urls: list[str] = []
        self.admin: str | None = None          # HOST:PORT of the admin API (--admin)
        self.output: list[str] = []

    # -- lifecycle
    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "brokerd", "--log-level", "info"]
        for url in self.listen:
            cmd += ["--listen", url]
        if self.anonymous:
            cmd.append("--allow-anonymous")
        return cmd + self.args

    def start(self) -> "BrokerProcess":
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.env:
            env.update(self.env)
        self.output = []
        self.proc = subprocess.Popen(self.command(), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1)
        # one thread reads every line from the start (was: select() on the pipe, then readline(): lines that
        # came in one read sat in the file object's buffer, unseen by select(), until the process wrote again
        # -- a supervisor's "ready" after its workers' lines waited for the next log line, up to 30 s)
        ready = threading.Event()

        def read(stream):
            for line in stream:
                line = line.rstrip()
                self.output.append(line)
                m = None if ready.is_set() else READY.search(line)
                if m:
                    self.urls = m.group(1).split()
                    a = ADMIN.search(line)
                    self.admin = a.group(1) if a else None
                    ready.set()

        reader = threading.Thread(target=read, args=(self.proc.stdout,), daemon=True)
        reader.start()
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if ready.wait(0.1):
                return self
            if self.proc.poll() is not None:
                reader.join(2)          # what it wrote before it exited
                if ready.is_set():
                    return self
                break
        out = "\n".join(self.output)
        self.kill()
        raise RuntimeError(f"brokerd did not become ready:\n{out}")

    def stop(self, sig=signal.SIGTERM, timeout: float = 10.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- addresses
    def url(self, scheme: str) -> str:
        for u in self.urls:
            if u.startswith(scheme + "://"):
                return u
        raise KeyError(f"no {scheme} listener in {self.urls}")

    def port(self, scheme: str = "mqtt") -> int:
        return int(self.url(scheme).split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])

    @property
    def admin_url(self) -> str:
        if not self.admin:
            raise KeyError("started without --admin")
        return f"http://{self.admin}"

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def log(self) -> str:
        return "\n".join(self.output)

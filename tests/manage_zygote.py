"""``python manage.py ARGS`` for the tests, without paying Python's and the libraries' imports each time.

A ``manage.py`` run costs a Django start-up, 1-3 s on a loaded machine, and the end-to-end tests make
dozens (``tests.controlplane``). Most of it is importing the same libraries (Django, Twisted, Daphne,
PySpark, Celery) again. ``run(args, env, stdin, timeout)`` asks a zygote -- one process per test
process, which imported them once, never Django's settings nor any of the project's modules -- to
fork; the child is then what ``python manage.py ARGS`` would be from there on: the given environment,
working directory and ``sys.argv``, stdin from ``stdin``, stdout and stderr captured, ``manage.py``
run as ``__main__``, its exit status returned. Each run is a process of its own (the console's
settings, the database connection and the apps are set up afresh, as before); what the tests see
-- output, exit status, what the commands did -- is the same. ``FORK = False`` runs them as plain
subprocesses again.

Protocol (the zygote's stdin/stdout, one JSON line each way): a request ``{"args", "env", "stdin",
"out", "err"}`` (out/err: files the child writes); the answers ``{"pid"}`` at the fork, then
``{"status"}`` (``os.waitstatus_to_exitcode``) when it ended.
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORK = True
# what a plain import sets up nothing of (no event loop, reactor, thread or settings; Daphne's server module
# installs Twisted's asyncio reactor when imported, so it is left to each run)
PRELOAD = ("django.core.management", "django.db.models", "django.test", "pyspark", "pyspark.sql", "celery",
           "channels.layers")


def run(args, env: dict, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``subprocess.run([python, "manage.py", *args], cwd=ROOT, env=env, input=stdin, capture_output=True,
    text=True, timeout=timeout)``, forked from the zygote."""
    if not FORK:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, input=stdin,
                              capture_output=True, text=True, timeout=timeout)
    return _zygote().run(list(args), env, stdin, timeout)


class _Zygote:
    def __init__(self):
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}   # (nothing set up early)
        self.proc = subprocess.Popen([sys.executable, __file__], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.lock = threading.Lock()
        self.dir = tempfile.mkdtemp(prefix="manage-zygote-")

    def _answer(self, timeout: float | None = None) -> dict:
        line = self.proc.stdout.readline() if timeout is None else _readline(self.proc.stdout, timeout)
        if not line:
            raise RuntimeError("the manage.py zygote ended")
        return json.loads(line)

    def run(self, args, env, stdin, timeout) -> subprocess.CompletedProcess:
        with self.lock:
            out, err, inp = (os.path.join(self.dir, name) for name in ("out", "err", "in"))
            with open(inp, "w", encoding="utf-8") as fh:
                fh.write(stdin or "")
            request = {"args": args, "env": dict(env), "stdin": inp, "out": out, "err": err}
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            pid = self._answer()["pid"]
            try:
                status = self._answer(timeout)["status"]
            except TimeoutError:
                os.kill(pid, 9)
                self._answer()
                raise subprocess.TimeoutExpired(["manage.py", *args], timeout) from None
            with open(out, encoding="utf-8", errors="replace") as fo, open(err, encoding="utf-8",
                                                                            errors="replace") as fe:
                return subprocess.CompletedProcess([sys.executable, "manage.py", *args], status, fo.read(), fe.read())


def _readline(stream, timeout: float) -> bytes:
    import select

    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        ready, _, _ = select.select([stream], [], [], left)
        if ready:
            return stream.readline()


_ZYGOTE: dict[int, _Zygote] = {}       # pid of the test process -> its zygote (a fork of it needs its own)


def _zygote() -> _Zygote:
    z = _ZYGOTE.get(os.getpid())
    if z is None or z.proc.poll() is not None:
        z = _ZYGOTE[os.getpid()] = _Zygote()
    return z


# ---------------------------------------------------------------------------------- the zygote itself

def _child(request: dict) -> None:
    """In the forked child: become ``python manage.py ARGS`` and never return."""
    code = 1
    try:
        for fd, path, flags in ((0, request["stdin"], os.O_RDONLY),
                                (1, request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                (2, request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            f = os.open(path, flags, 0o600)
            os.dup2(f, fd)
            os.close(f)
        sys.stdin = open(0, encoding="utf-8", closefd=False)           # noqa: SIM115 (for the process's life)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)      # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)      # noqa: SIM115
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(ROOT)
        sys.argv = ["manage.py", *request["args"]]
        sys.path[0] = str(ROOT)
        import runpy
        try:
            runpy.run_path(str(ROOT / "manage.py"), run_name="__main__")
            code = 0
        except SystemExit as e:          # as the interpreter reads it
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
    finally:
        os._exit(code & 0xFF)


PROJECT = ("console", "core", "tenants", "metrics", "spark_reports", "brokerd")


def _serve() -> None:
    for name in PRELOAD:
        try:
            __import__(name)
        except Exception:          # a library missing or failing here fails in manage.py too, in its place
            pass
    from django.conf import settings

    if settings.configured or any(m.split(".")[0] in PROJECT for m in sys.modules):
        sys.exit("a preloaded library set Django up or imported the project: not a clean start")
    control_in, control_out = os.dup(0), os.dup(1)
    reader = os.fdopen(control_in, "rb", buffering=0)
    while True:
        line = reader.readline()
        if not line:
            return
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                os.close(control_out)
            finally:
                _child(request)
        os.write(control_out, json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        os.write(control_out, json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode() + b"\n")


if __name__ == "__main__":
    sys.path[0] = str(ROOT)
    _serve()

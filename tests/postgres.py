"""A private PostgreSQL server for tests: Debian's ``postgresql`` binaries,
a throw-away cluster in a temporary directory, listening on a free loopback
port with password authentication (as production connects), fsync off.

PostgreSQL refuses to run as root; as root the server runs as the
``postgres`` user the Debian package made.
"""

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import time

from .procs import free_port

USER = "mqtthub"


def _bindir() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise RuntimeError("PostgreSQL's server is not installed (Debian package postgresql; `make test` installs it)")
    return os.path.dirname(found[-1])


class PostgresServer:
    def __init__(self):
        self.bindir = _bindir()
        self.port = free_port()
        self.password = secrets.token_hex(12)
        self.dir = tempfile.mkdtemp(prefix="mqtthub-pg-")
        self.proc: subprocess.Popen | None = None
        self._as = []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]

    def start(self) -> "PostgresServer":
        data = os.path.join(self.dir, "data")
        pwfile = os.path.join(self.dir, "pw")
        with open(pwfile, "w") as fh:
            fh.write(self.password)
        if self._as:
            os.chown(pwfile, *(lambda p: (p.pw_uid, p.pw_gid))(pwd.getpwnam("postgres")))
        subprocess.run([*self._as, f"{self.bindir}/initdb", "-D", data, "-U", USER, f"--pwfile={pwfile}",
                        "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8"],
                       check=True, capture_output=True, timeout=120)
        with open(os.path.join(self.dir, "server.log"), "w") as log:   # the child keeps its own descriptor
            self.proc = subprocess.Popen([*self._as, f"{self.bindir}/postgres", "-D", data, "-p", str(self.port),
                                          "-k", self.dir, "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                                          "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                                          "-c", "max_connections=200"],
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                self.execute("SELECT 1")
                return self
            except Exception:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"PostgreSQL did not start on port {self.port}")

    def url(self, dbname: str = "postgres") -> str:
        return f"postgres://{USER}:{self.password}@127.0.0.1:{self.port}/{dbname}"

    def execute(self, sql: str, dbname: str = "postgres") -> list:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=USER, password=self.password,
                             dbname=dbname, autocommit=True, connect_timeout=3) as conn:
            cur = conn.execute(sql)
            return cur.fetchall() if cur.description else []

    def create_database(self, name: str) -> str:
        """A new empty database; -> its DATABASE_URL."""
        self.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()    # SIGTERM: smart shutdown; SIGINT would be fast
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def run_django(database_url: str, var_dir, script: str) -> dict:
    """``script`` (Python that sets Django up itself) in a process of its own, the console's settings
    on ``database_url``; -> the JSON object of the last line it printed (its failure: the test's)."""
    import json
    import sys

    from .procs import ROOT

    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DEBUG", "PRODUCTION")}
    env.update(DATABASE_URL=database_url, VAR_DIR=str(var_dir), BROKERD_ADMIN_TOKEN="unused",
               BROKERD_ADMIN_URL=f"http://127.0.0.1:{free_port()}", METRICS_HUB="false",
               DJANGO_SETTINGS_MODULE="console.settings", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])

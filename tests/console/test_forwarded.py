"""Whose address the login throttle counts: the socket's peer, unless the peer
is a trusted proxy (``TRUSTED_PROXIES``, console/forwarded.py).

daphne runs as `make run` starts it (build/run.py) and as the image's
entrypoint starts it (docker/entrypoint.sh console, over plain HTTP and
serving TLS itself), each a real process on a copy of one migrated SQLite
database. Clients are real sockets; each one binds its own loopback source
address (127.0.0.X: Linux routes all of 127/8 to the loopback interface), so
an attacker and the user whose address it claims are different peers.
"""

import http.client
import importlib.util
import os
import re
import shutil
import ssl
import subprocess
import sys
import threading
from urllib.parse import urlencode

import pytest
import trustme

from console.forwarded import client_address, parse_networks

from ..integration.helpers import wait_until
from ..pki import write_cert
from ..procs import ROOT, free_port

pytestmark = pytest.mark.slow

ENTRYPOINT = str(ROOT / "docker" / "entrypoint.sh")
VENV_BIN = os.path.dirname(os.path.abspath(sys.executable))
ROOT_PASSWORD = "forwarded-Root-Passw0rd"
PASSWORD = "forwarded-user-Passw0rd"
LOCKED = "Too many failed sign-in attempts"
WRONG = "Please enter a correct username and password"
PROXY = "127.0.0.31"                 # the trusted proxy of the `proxied` console
USERS = f"""
from django.contrib.auth import get_user_model
for name in ("carol", "dave", "erin"):
    get_user_model().objects.create_user(name, name + "@example.test", {PASSWORD!r})
"""


# ------------------------------------------------------------------ the pure rule

NETS = parse_networks(["10.0.0.1", "10.9.0.0/16"])


@pytest.mark.parametrize("peer, xff, client", [
    ("192.0.2.1", ["203.0.113.9"], "192.0.2.1"),                       # not a proxy: header ignored
    ("10.0.0.1", [], "10.0.0.1"),                                      # a proxy that says nothing
    ("10.0.0.1", ["203.0.113.9"], "203.0.113.9"),
    ("10.0.0.1", ["198.51.100.1, 203.0.113.9"], "203.0.113.9"),        # the client's own words on the left
    ("10.0.0.1", ["198.51.100.1", "203.0.113.9, 10.9.3.4"], "203.0.113.9"),   # two headers, two proxies
    ("10.0.0.1", ["203.0.113.9:4711"], "203.0.113.9"),
    ("10.0.0.1", ["[2001:db8::7]:443"], "2001:db8::7"),
    ("10.0.0.1", ["10.9.1.1, 10.9.2.2"], "10.9.1.1"),                  # all proxies: the leftmost
    ("10.0.0.1", ["198.51.100.1, unknown"], "10.0.0.1"),               # nonsense: stop at the proxy
])
def test_client_address(peer, xff, client):
    assert client_address(peer, xff, NETS) == client


def test_a_bad_trusted_proxy_setting_is_refused():
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="not-an-address"):
        parse_networks(["10.0.0.1", "not-an-address"])


# ------------------------------------------------------------------ daphne for real

def make_run_console_command(host: str, port: int) -> list[str]:
    """The console's command line exactly as build/run.py (`make run`) builds it."""
    spec = importlib.util.spec_from_file_location("build_run", ROOT / "build" / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    saved = {k: os.environ.get(k) for k in ("CONSOLE_HOST", "CONSOLE_PORT")}
    os.environ.update(CONSOLE_HOST=host, CONSOLE_PORT=str(port))
    try:
        return run.services()["console"]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def database(tmp_path_factory):
    """A migrated console database with root (the bootstrap administrator), carol, dave and erin."""
    var = tmp_path_factory.mktemp("forwarded-db")
    env = {**base_env(var), "CONSOLE_ADMIN_USER": "root", "CONSOLE_ADMIN_PASSWORD": ROOT_PASSWORD}
    for args in (["migrate", "--noinput", "-v", "0"], ["console_bootstrap"], ["shell", "-c", USERS]):
        proc = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr[-2000:]
    return var / "console.sqlite3"


def base_env(var) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "BROKERD_ADMIN_TOKEN", "REDIS_URL", "DEBUG", "PRODUCTION", "TRUSTED_PROXIES")}
    env.update(PATH=f"{VENV_BIN}:{os.environ['PATH']}", VAR_DIR=str(var), PYTHONUNBUFFERED="1",
               DATABASE_URL=f"sqlite:///{var}/console.sqlite3", BROKERD_ADMIN_TOKEN="unused",
               BROKERD_ADMIN_URL=f"http://127.0.0.1:{free_port()}", METRICS_HUB="false",
               ALLOWED_HOSTS="127.0.0.1", MQTTHUB_ROLE_FILE=str(var / "role"))
    return env


class Console:
    """daphne started by one of the launchers on a copy of ``database``."""

    def __init__(self, launcher: str, database, var, trusted: str = "", extra_env: dict | None = None):
        self.var = var
        shutil.copy(database, var / "console.sqlite3")
        self.port = free_port()
        self.tls = launcher == "image-tls"
        env = base_env(var)
        if trusted:
            env["TRUSTED_PROXIES"] = trusted
        env.update(extra_env or {})
        if launcher == "make-run":
            cmd = make_run_console_command("127.0.0.1", self.port)
        else:
            cmd = [ENTRYPOINT, "console"]
            env.update(CONSOLE_HOST="127.0.0.1", CONSOLE_PORT=str(self.port))
            if self.tls:
                ca = trustme.CA()
                cert, key = write_cert(ca.issue_cert("127.0.0.1"), var, "console")
                env.update(CONSOLE_TLS_CERT=cert, CONSOLE_TLS_KEY=key)
                self.context = ssl.create_default_context()
                ca.configure_trust(self.context)
        self.lines: list[str] = []
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, bufsize=1, start_new_session=True)
        threading.Thread(target=lambda: self.lines.extend(ln.rstrip() for ln in self.proc.stdout),
                         daemon=True).start()
        wait_until(lambda: self.answers() or self.proc.poll() is not None, 30, 0.2,
                   message="daphne did not come up", explain=self.log)
        assert self.proc.poll() is None, f"daphne exited {self.proc.returncode}:\n{self.log()}"

    def log(self) -> str:
        return "\n".join(self.lines[-40:])

    def answers(self) -> bool:
        try:
            return self.request("GET", "/healthz", source="127.0.0.1")[0] == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def request(self, method, path, *, source: str, headers=None, body=None):
        """One request from the loopback address ``source`` -> (status, headers, text)."""
        if self.tls:
            conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=20, source_address=(source, 0),
                                               context=self.context)
        else:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20, source_address=(source, 0))
        try:
            conn.request(method, path, body, headers or {})
            resp = conn.getresponse()
            return resp.status, resp.headers, resp.read().decode()
        finally:
            conn.close()

    def login(self, username: str, password: str, *, source: str, forwarded_for: str | None = None) -> str:
        """A whole sign-in (the form, then its POST) as a browser at ``source`` would make it,
        with ``X-Forwarded-For`` on both when given -> "ok", "locked" or "wrong"."""
        extra = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
        status, headers, page = self.request("GET", "/login/", source=source, headers=extra)
        assert status == 200, page[-500:]
        cookie = re.search(r"csrftoken=([^;]+)", headers["Set-Cookie"]).group(1)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        origin = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"
        form = urlencode({"username": username, "password": password, "csrfmiddlewaretoken": token})
        status, headers, page = self.request(
            "POST", "/login/", source=source, body=form,
            headers={**extra, "Cookie": f"csrftoken={cookie}", "Origin": origin, "Referer": origin + "/login/",
                     "Content-Type": "application/x-www-form-urlencoded"})
        if status == 302:
            return "ok"
        assert status == 200, f"{status}: {page[-500:]}"
        if LOCKED in page:
            return "locked"
        assert WRONG in page, page[-1000:]
        return "wrong"

    def failures(self) -> list[tuple[str, str]]:
        """(username, address) of the failed logins counted, from the console's database."""
        import sqlite3

        with sqlite3.connect(self.var / "console.sqlite3") as db:
            return db.execute("SELECT username, remote_addr FROM console_loginfailure ORDER BY id").fetchall()


LAUNCHERS = ["make-run", "image", "image-tls"]


@pytest.fixture(scope="module", params=LAUNCHERS)
def console(request, database, tmp_path_factory):
    """daphne as a launcher starts it, with the default settings (no trusted proxy)."""
    c = Console(request.param, database, tmp_path_factory.mktemp(f"console-{request.param}"))
    yield c
    c.stop()


@pytest.fixture(scope="module")
def proxied(database, tmp_path_factory):
    """daphne as the image starts it, behind a proxy at 127.0.0.31 (TRUSTED_PROXIES)."""
    c = Console("image", database, tmp_path_factory.mktemp("console-proxied"), trusted=PROXY)
    yield c
    c.stop()


def test_a_rotating_forwarded_for_header_is_throttled_by_the_real_address(console):
    """30 wrong passwords for 30 user names, each claiming another address:
    after 5 the attacker's own address is locked, the right password too."""
    answers = [console.login(f"spray{i}", "wrong", source="127.0.0.11", forwarded_for=f"203.0.113.{i + 1}")
               for i in range(30)]
    assert answers == ["wrong"] * 5 + ["locked"] * 25
    assert console.login("root", ROOT_PASSWORD, source="127.0.0.11") == "locked"
    assert {addr for _, addr in console.failures() if _.startswith("spray")} == {"127.0.0.11"}
    # another address is not affected
    assert console.login("carol", PASSWORD, source="127.0.0.12") == "ok"


def test_junk_failures_claiming_someone_elses_address_do_not_lock_it_out(console):
    for i in range(5):
        assert console.login(f"junk{i}", "wrong", source="127.0.0.21", forwarded_for="127.0.0.22") == "wrong"
    assert console.login("dave", PASSWORD, source="127.0.0.22") == "ok"
    assert console.login("dave", PASSWORD, source="127.0.0.21") == "locked"      # the attacker's own is


def test_a_user_name_is_locked_whatever_addresses_the_failures_come_from(console):
    for i in range(5):
        assert console.login("erin", "wrong", source=f"127.0.0.{41 + i}", forwarded_for=f"198.51.100.{i}") == "wrong"
    assert console.login("erin", PASSWORD, source="127.0.0.46") == "locked"


def test_a_trusted_proxy_is_believed_and_only_for_what_it_appended(proxied):
    c = proxied
    # the proxy forwards a client at 198.51.100.7: its failures lock that address, not the proxy's
    for i in range(5):
        assert c.login(f"far{i}", "wrong", source=PROXY, forwarded_for="198.51.100.7") == "wrong"
    assert c.login("carol", PASSWORD, source=PROXY, forwarded_for="198.51.100.7") == "locked"
    assert c.login("carol", PASSWORD, source=PROXY, forwarded_for="198.51.100.8") == "ok"
    # a client that claims 198.51.100.9 itself, the proxy appending its real address: the real one counts
    for i in range(5):
        assert c.login(f"liar{i}", "wrong", source=PROXY, forwarded_for="198.51.100.9, 203.0.113.5") == "wrong"
    assert c.login("dave", PASSWORD, source=PROXY, forwarded_for="203.0.113.5") == "locked"
    assert c.login("dave", PASSWORD, source=PROXY, forwarded_for="198.51.100.9") == "ok"
    # a peer that is not the proxy is not believed, whatever it claims
    for i in range(5):
        assert c.login(f"direct{i}", "wrong", source="127.0.0.32", forwarded_for="198.51.100.10") == "wrong"
    assert c.login("erin", PASSWORD, source=PROXY, forwarded_for="198.51.100.10") == "ok"
    assert c.login("erin", PASSWORD, source="127.0.0.32") == "locked"
    counted = {addr for user, addr in c.failures()}
    assert counted == {"198.51.100.7", "203.0.113.5", "127.0.0.32"}

"""The image's roles started outside Docker with the same commands
(``docker/entrypoint.sh ROLE``) and a production-style environment:
``PRODUCTION=true``, the console's database on a real PostgreSQL server
(tests/postgres.py), a real Redis for the cluster bus, Celery and Channels
(password and TLS only, ``rediss://``, as in docker/compose.yaml),
and the HBase store through the HBase Thrift gateway test double
(tests/hbase_double.py; HBase cannot run here).

One device publishes through a brokerd node that enforces the tenant made
with ``mqtthub manage``; an administrator logs in to the console as a TLS
proxy would forward them (X-Forwarded-Proto) and reads a page; a usage
report runs as a Celery task on the worker and shows what the device did.
"""

import http.client
import json
import os
import re
import secrets
import subprocess
import threading
import time
import uuid
from datetime import UTC, datetime
from urllib.parse import urlencode

import pytest
import trustme

from ..cluster.conftest import RedisServer
from ..integration.helpers import wait_until
from ..mqtt import PahoClient
from ..pki import write_cert
from ..procs import ROOT, SPARK_TEST_JAVA_OPTIONS, free_port

pytestmark = pytest.mark.slow

ENTRYPOINT = str(ROOT / "docker" / "entrypoint.sh")
VENV_BIN = os.path.dirname(os.path.abspath(os.sys.executable))


def wait_for(predicate, timeout: float, explain=lambda: "") -> None:
    wait_until(predicate, timeout, interval=0.2, message="timed out", explain=explain)


class Role:
    """``docker/entrypoint.sh ROLE`` as a child process, its output collected."""

    def __init__(self, role: str, env: dict, ready: str, timeout: float = 60):
        self.role = role
        self.lines: list[str] = []
        self.proc = subprocess.Popen([ENTRYPOINT, role], cwd="/", env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()
        wait_for(lambda: self.match(ready) or self.proc.poll() is not None, timeout, self.log)
        assert self.proc.poll() is None, f"{role} exited {self.proc.returncode}:\n{self.log()}"

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def match(self, pattern: str):
        return next((m for ln in list(self.lines) if (m := re.search(pattern, ln))), None)

    def log(self) -> str:
        return f"--- {self.role}\n" + "\n".join(self.lines[-60:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()


def run_role(role: str, *args: str, env: dict) -> str:
    proc = subprocess.run([ENTRYPOINT, role, *args], cwd="/", env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"{role} {args} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    return proc.stdout


class Browser:
    """HTTP to daphne as a TLS-terminating proxy forwards it (X-Forwarded-Proto: https),
    keeping cookies itself (they are Secure, so no client library would send them over HTTP)."""

    def __init__(self, port: int):
        self.port = port
        self.cookies: dict[str, str] = {}
        self.set_cookie: dict[str, str] = {}

    def request(self, method: str, path: str, form: dict | None = None, proto: str | None = "https"):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        origin = f"https://127.0.0.1:{self.port}"
        headers = {"Host": f"127.0.0.1:{self.port}"}
        if proto:
            headers["X-Forwarded-Proto"] = proto
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = None
        if form is not None:
            body = urlencode({**form, "csrfmiddlewaretoken": self.cookies.get("csrftoken", "")})
            headers.update({"Content-Type": "application/x-www-form-urlencoded", "Origin": origin,
                            "Referer": origin + path})
        try:
            conn.request(method, path, body, headers)
            resp = conn.getresponse()
            text = resp.read().decode()
        finally:
            conn.close()
        for cookie in resp.headers.get_all("Set-Cookie") or ():
            name, _, rest = cookie.partition("=")
            self.cookies[name] = rest.split(";")[0]
            self.set_cookie[name] = cookie
        return resp.status, resp.headers, text


@pytest.fixture(scope="module")
def stack(postgres, hbase_double, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prod")
    # as docker/compose.yaml has it: a password, TLS only, a certificate of the cluster's own CA
    redis_password = secrets.token_hex(16)
    redis = RedisServer(tmp, password=redis_password, tls=trustme.CA()).start()
    database = postgres.create_database(f"prod{uuid.uuid4().hex[:8]}")
    token = secrets.token_urlsafe(32)
    admin_port, console_port = free_port(), free_port()
    password = secrets.token_urlsafe(16)
    redis_url = f"rediss://:{redis_password}@127.0.0.1:{redis.port}"
    django_tls = urlencode({"ssl_cert_reqs": "required", "ssl_ca_certs": redis.ca_file})
    base = {"PATH": f"{VENV_BIN}:{os.environ['PATH']}", "HOME": str(tmp), "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1", "SPARK_LOCAL_IP": "127.0.0.1",
            "DATABASE_URL": database, "BROKERD_ADMIN_TOKEN": token, "LOG_LEVEL": "info",
            "MQTTHUB_ROLE_FILE": str(tmp / "role")}
    django = {**base, "PRODUCTION": "true", "SECRET_KEY": secrets.token_urlsafe(50), "ALLOWED_HOSTS": "127.0.0.1",
              "REDIS_URL": f"{redis_url}/0?{django_tls}", "BROKERD_ADMIN_URL": f"http://127.0.0.1:{admin_port}",
              "TRUST_X_FORWARDED_PROTO": "true", "VAR_DIR": str(tmp / "var"), "STATIC_ROOT": str(tmp / "static"),
              "USAGE_DIR": str(tmp / "usage"), "EMAIL_FILE_PATH": str(tmp / "mail"),
              "SPARK_SHUFFLE_PARTITIONS": "2", "REPORTS_RETRY_BACKOFF": "1",
              # the suite's Java options for the worker's Spark JVM (tests/procs.py); Spark's own settings
              # (code generation on) as in production
              "SPARK_CONF": f"spark.driver.extraJavaOptions={SPARK_TEST_JAVA_OPTIONS}",
              # no class-data sharing archive (tests/reports/test_cds.py has them): the worker's JVM wrote
              # one at its exit, which the module's teardown waited for 20 s and then killed half-written
              "SPARK_CDS_DIR": "off",
              "CONSOLE_HOST": "127.0.0.1", "CONSOLE_PORT": str(console_port),
              "CONSOLE_ADMIN_USER": "root", "CONSOLE_ADMIN_PASSWORD": password}
    node = {**base, "BROKERD_NODE_ID": "prod1", "BROKERD_LISTEN": "mqtt://127.0.0.1:0",
            "BROKERD_ADMIN": f"127.0.0.1:{admin_port}", "BROKERD_CLUSTER": f"{redis_url}/1?ssl_ca_certs={redis.ca_file}",
            "BROKERD_CLUSTER_SECRET": secrets.token_hex(32),
            "BROKERD_STORE": f"hbase://{hbase_double.address}?table_prefix=p{uuid.uuid4().hex[:8]}",
            "BROKERD_USAGE_DIR": str(tmp / "usage"), "BROKERD_USAGE_INTERVAL": "1",
            "BROKERD_SYS_INTERVAL": "0"}
    roles: list[Role] = []
    try:
        boot = run_role("migrate", env=django)                 # as the compose file's one-shot service
        assert "created the platform administrator 'root'" in boot
        run_role("manage", "collectstatic", "--noinput", "-v", "0", env=django)    # as the image build does
        broker = Role("brokerd", node, ready=r"brokerd ready .*listeners=mqtt://127\.0\.0\.1:(\d+)")
        roles.append(broker)
        console = Role("console", django, ready=r"Listening on TCP address")
        roles.append(console)
        worker = Role("worker", django, ready=r"ready\.", timeout=90)
        roles.append(worker)
        yield {"django": django, "node": node, "mqtt": int(broker.match(r"listeners=mqtt://127\.0\.0\.1:(\d+)")[1]),
               "console": console, "worker": worker, "broker": broker, "console_port": console_port,
               "password": password, "redis": redis, "postgres": postgres, "database": database}
    finally:
        for r in reversed(roles):
            r.stop()
        redis.stop()


@pytest.fixture(scope="module")
def acme(stack) -> str:
    """Tenant acme, an ACL and device dev1, made once with ``mqtthub manage``; -> dev1's secret."""
    env = stack["django"]
    run_role("manage", "tenants", "create", "acme", env=env)
    run_role("manage", "acl", "add", "acme", "--allow", "--action", "both", "--topic", "{device}/#", env=env)
    return run_role("manage", "devices", "create", "acme", "dev1", env=env).strip().splitlines()[-1]


@pytest.fixture(scope="module")
def acme_traffic(stack, acme) -> list[bytes]:
    """dev1 publishes five QoS 1 messages to its own subscriber (once per module: the
    report test counts them); -> the payloads the subscriber received."""
    # the node learns the tenant from PostgreSQL within a second
    sub = None
    deadline = time.monotonic() + 10
    while sub is None:
        try:
            sub = PahoClient("dev1-sub", username="acme/dev1", password=acme).connect(stack["mqtt"])
        except ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    with sub, PahoClient("dev1-pub", username="acme/dev1", password=acme).connect(stack["mqtt"]) as pub:
        sub.subscribe("dev1/#", qos=1)
        for i in range(5):
            pub.publish("dev1/temp", f"{20 + i}".encode(), qos=1)
        return [m.payload for m in sub.expect_n(5)]


def test_a_device_publishes_through_a_node_enforcing_the_postgres_control_plane(stack, acme_traffic):
    assert acme_traffic == [b"20", b"21", b"22", b"23", b"24"]
    wrong = PahoClient("intruder", username="acme/dev1", password="not-the-secret")
    with pytest.raises(ConnectionError, match="CONNACK refused"):
        wrong.connect(stack["mqtt"])
    wrong.drop()


def test_the_console_serves_pages_as_production_does(stack, acme):
    b = Browser(stack["console_port"])          # a browser of its own: no cookies from another test
    # plain HTTP is sent to HTTPS, except the health check a container engine makes from inside
    status, headers, _ = b.request("GET", "/login/", proto=None)
    assert status == 301 and headers["Location"].startswith("https://")
    assert b.request("GET", "/healthz", proto=None)[0] == 200

    status, headers, page = b.request("GET", "/login/")
    assert status == 200 and "csrftoken" in b.cookies
    assert headers["Strict-Transport-Security"].startswith("max-age=31536000")
    assert headers["X-Frame-Options"] == "DENY" and headers["X-Content-Type-Options"] == "nosniff"
    # static files: hashed names from collectstatic, served compressed-capable and cached for long
    css = re.search(r'href="(/static/[^"]+\.[0-9a-f]{12}\.css)"', page)
    assert css, "the stylesheet has a hashed name"
    status, headers, _ = b.request("GET", css.group(1))
    assert status == 200 and "max-age=315360000" in headers["Cache-Control"]

    status, headers, _ = b.request("POST", "/login/", {"username": "root", "password": stack["password"]})
    assert status == 302, "login failed"
    session = b.set_cookie["sessionid"]
    assert "Secure" in session and "HttpOnly" in session and "SameSite=Lax" in session
    assert "Secure" in b.set_cookie["csrftoken"]

    status, _, page = b.request("GET", "/tenants/acme/devices/")
    assert status == 200 and "dev1" in page

    # the console's logs are JSON lines on stdout
    records = [json.loads(ln) for ln in stack["console"].lines if ln.startswith("{")]
    assert records and all({"time", "level", "logger", "message"} <= set(r) for r in records)


def test_a_report_runs_as_a_celery_task_on_the_worker(stack, acme_traffic):
    b = Browser(stack["console_port"])
    b.request("GET", "/login/")
    assert b.request("POST", "/login/", {"username": "root", "password": stack["password"]})[0] == 302
    # brokerd's usage log holds the device's traffic once its minute file is written (every second here)
    usage = os.path.join(stack["node"]["BROKERD_USAGE_DIR"], "traffic")
    wait_for(lambda: os.path.isdir(usage) and any(f.endswith(".jsonl") for _, _, fs in os.walk(usage) for f in fs),
             15, stack["broker"].log)
    status, headers, _ = b.request("POST", "/tenants/acme/reports/", {"preset": "today"})
    assert status == 302, "report not queued"
    run_page = headers["Location"]
    run_id = int(run_page.rstrip("/").rsplit("/", 1)[1])

    def done():
        page = b.request("GET", run_page)[2]
        return "badge-green\">succeeded" in page or "badge-red\">failed" in page

    wait_for(done, 180, lambda: stack["worker"].log())
    status, _, page = b.request("GET", run_page)
    assert "succeeded" in page, stack["worker"].log()
    status, _, csv = b.request("GET", f"/tenants/acme/reports/{run_id}/csv/")
    rows = dict(line.rsplit(",", 1) for line in csv.splitlines() if line.startswith("totals,,"))
    # five messages in, five delivered to the subscriber
    assert int(rows["totals,,msgs_in"]) == 5 and int(rows["totals,,msgs_out"]) == 5, csv[:500]
    assert datetime.now(UTC).date().isoformat() in page


def test_each_roles_health_check_as_the_image_runs_it(stack):
    for role, env in (("brokerd", stack["node"]), ("console", stack["django"]), ("worker", stack["django"])):
        out = run_role("healthcheck", role, env=env)
        assert out.strip() == f"{role}: healthy", out


def test_the_console_serves_https_itself_with_the_mounted_certificate(stack, tmp_path):
    """As in docker/compose.yaml: daphne on one port with CONSOLE_TLS_CERT / CONSOLE_TLS_KEY."""
    import ssl

    import trustme

    ca = trustme.CA()
    crt, key = write_cert(ca.issue_cert("127.0.0.1", "localhost"), tmp_path, "server")
    port = free_port()
    env = dict(stack["django"], CONSOLE_PORT=str(port), CONSOLE_TLS_CERT=crt, CONSOLE_TLS_KEY=key,
               TRUST_X_FORWARDED_PROTO="false", METRICS_HUB="false")
    console = Role("console", env, ready=r"Listening on TCP address|Configuring endpoint ssl")
    try:
        ctx = ssl.create_default_context()
        ca.configure_trust(ctx)

        def page():
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
            try:
                conn.request("GET", "/login/")
                resp = conn.getresponse()
                return resp.status, resp.headers, resp.read()
            finally:
                conn.close()

        wait_for(lambda: _answers(page), 30, console.log)
        status, headers, body = page()
        assert status == 200 and b"password" in body
        assert headers["Strict-Transport-Security"].startswith("max-age=31536000")
        assert "Secure" in headers["Set-Cookie"]
        assert run_role("healthcheck", "console", env=env).strip() == "console: healthy"
    finally:
        console.stop()


def _answers(fetch) -> bool:
    try:
        return fetch()[0] == 200
    except OSError:
        return False

"""`make run`: start the whole system on embedded defaults, in the foreground.

Loads ``.env`` if present (KEY=VALUE lines; the environment wins), prepares
the database, starts each service as a child process with its output
prefixed, prints where everything listens, and stops all of them when one
exits or on Ctrl-C / SIGTERM.
"""

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def load_dotenv(path: Path) -> None:
    if not path.exists():
        return
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        os.environ.setdefault(key.strip(), value.strip().strip('"').strip("'"))


def var_dir() -> Path:
    return Path(os.environ.get("VAR_DIR") or ROOT / "var")


def generated_secret(path: Path) -> str:
    """As console.env.generated_secret: a random value kept (0600) in ``path``."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        import secrets

        path.parent.mkdir(parents=True, exist_ok=True)
        value = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(value)
        return value


def admin_address() -> str:
    return f"127.0.0.1:{os.environ.get('BROKERD_ADMIN_PORT', '18083')}"


def services() -> dict[str, list[str]]:
    host = os.environ.get("BROKERD_HOST", "127.0.0.1")
    mqtt = os.environ.get("BROKERD_MQTT_PORT", "1883")
    ws = os.environ.get("BROKERD_WS_PORT", "8083")
    store = os.environ.get("BROKERD_STORE", f"sqlite:///{var_dir() / 'brokerd.sqlite3'}")
    # the console's database is the control plane (DATABASE_URL, as the console reads it)
    control = os.environ.get("DATABASE_URL", f"sqlite:///{var_dir() / 'console.sqlite3'}")
    console_host = os.environ.get("CONSOLE_HOST", "127.0.0.1")
    console_port = os.environ.get("CONSOLE_PORT", "8000")
    return {
        "brokerd": [PY, "-m", "brokerd", "--allow-anonymous", "--store", store, "--control-plane", control,
                    "--listen", f"mqtt://{host}:{mqtt}", "--listen", f"ws://{host}:{ws}/mqtt",
                    "--admin", admin_address(),
                    "--usage-dir", os.environ.get("USAGE_DIR", str(var_dir() / "usage"))],
        # no --proxy-headers: daphne would take any client's X-Forwarded-For as its address;
        # the console believes forwarded headers only from TRUSTED_PROXIES (console/forwarded.py)
        "console": [PY, "-m", "console.serve", "-b", console_host, "-p", console_port, "console.asgi:application"],
        # usage reports: Spark jobs in a Celery worker (threads share one Spark session), schedules by beat
        "worker": [PY, "-m", "celery", "-A", "console", "worker", "-P", "threads",
                   "-c", os.environ.get("REPORTS_WORKER_CONCURRENCY", "2"), "--without-mingle", "--without-gossip",
                   "-l", "info"],
        "beat": [PY, "-m", "celery", "-A", "console", "beat", "-l", "info", "--pidfile="],
    }


def banner(login: str) -> str:
    host = os.environ.get("BROKERD_HOST", "127.0.0.1")
    mqtt = os.environ.get("BROKERD_MQTT_PORT", "1883")
    ws = os.environ.get("BROKERD_WS_PORT", "8083")
    console = f"http://{os.environ.get('CONSOLE_HOST', '127.0.0.1')}:{os.environ.get('CONSOLE_PORT', '8000')}/"
    user, _, password = login.partition(" ")
    return f"""
  console    {console}
    log in as  {user}  {password}
  admin API  http://{admin_address()}/api/v1/  (OpenAPI: /openapi.json; token: var/admin_token or one
             made under API tokens in the console)
  brokerd (MQTT 3.1.1 + 5.0, anonymous clients allowed on this development node)
    MQTT       mqtt://{host}:{mqtt}
    WebSocket  ws://{host}:{ws}/mqtt
    sessions   {services()["brokerd"][5]}
               (persistent sessions and retained messages survive a restart)
  try (anonymous clients land in the tenant "default"):
    mosquitto_sub -h {host} -p {mqtt} -t 'demo/#' -v &
    mosquitto_pub -h {host} -p {mqtt} -t demo/hello -m world
  devices of your own tenant (in the console, or from the shell):
    .venv/bin/python manage.py tenants create acme
    .venv/bin/python manage.py acl add acme --allow --action both --topic '{{device}}/#'
    .venv/bin/python manage.py devices create acme dev1      # prints the secret once
    mosquitto_pub -h {host} -p {mqtt} -u acme/dev1 -P SECRET -t dev1/temp -m 21
  usage reports (Spark, run by the Celery worker; schedules by beat)
    {console}reports/  and Reports under each tenant
    usage log  {os.environ.get("USAGE_DIR", str(var_dir() / "usage"))}
    emails     {os.environ.get("EMAIL_FILE_PATH", str(var_dir() / "mail"))} (files; set EMAIL_URL for SMTP)
  Ctrl-C stops everything.
"""


def main() -> int:
    os.chdir(ROOT)
    load_dotenv(ROOT / ".env")
    var_dir().mkdir(parents=True, exist_ok=True)
    if "://" not in os.environ.get("USAGE_DIR", ""):
        # the reports read it from the first minute on, before brokerd has logged anything
        Path(os.environ.get("USAGE_DIR") or var_dir() / "usage").mkdir(parents=True, exist_ok=True)
    # brokerd's bootstrap admin token, which the console uses to act on the cluster
    if not os.environ.get("BROKERD_ADMIN_TOKEN"):
        os.environ["BROKERD_ADMIN_TOKEN"] = generated_secret(var_dir() / "admin_token")
    os.environ.setdefault("BROKERD_ADMIN_URL", f"http://{admin_address()}")
    subprocess.run([PY, "manage.py", "migrate", "--noinput", "-v", "0"], check=True)
    subprocess.run([PY, "manage.py", "collectstatic", "--noinput", "-v", "0"], check=True)
    boot = subprocess.run([PY, "manage.py", "console_bootstrap"], check=True, capture_output=True, text=True)
    login = next(ln[6:] for ln in boot.stdout.splitlines() if ln.startswith("LOGIN "))
    sel = selectors.DefaultSelector()
    procs = {}
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    partial: dict[str, bytes] = {}
    for name, cmd in services().items():
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        procs[name] = p
        partial[name] = b""
        sel.register(p.stdout, selectors.EVENT_READ, name)
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    ready: set[str] = set()
    printed_banner = False
    width = max(len(n) for n in procs)
    def lines_of(key) -> list[str]:
        """Every complete line the process wrote so far (os.read: a buffered readline would
        keep lines select() no longer reports), or what is left of its output at its end."""
        chunk = os.read(key.fileobj.fileno(), 65536)
        if not chunk:
            sel.unregister(key.fileobj)
            rest, partial[key.data] = partial[key.data], b""
            return [rest.decode(errors="replace")] if rest else []
        *lines, partial[key.data] = (partial[key.data] + chunk).split(b"\n")
        return [ln.decode(errors="replace") for ln in lines]

    while not stopping:
        for key, _ in sel.select(0.5):
            for line in lines_of(key):
                print(f"{key.data:>{width}} | {line.rstrip()}", flush=True)
                if "brokerd ready" in line:
                    ready.add("brokerd")
                if key.data == "console" and "Listening on TCP address" in line:
                    ready.add("console")
                if not printed_banner and ready >= {"brokerd", "console"}:
                    print(banner(login), flush=True)
                    printed_banner = True
        dead = [n for n, p in procs.items() if p.poll() is not None]
        if dead:
            print(f"{', '.join(dead)} exited (status {procs[dead[0]].returncode}); stopping", flush=True)
            break
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in procs.values():
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
    for key in list(sel.get_map().values()):
        for line in (partial[key.data] + key.fileobj.read()).decode(errors="replace").splitlines():
            print(f"{key.data:>{width}} | {line.rstrip()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

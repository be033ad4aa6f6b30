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


def services() -> dict[str, list[str]]:
    host = os.environ.get("BROKERD_HOST", "127.0.0.1")
    mqtt = os.environ.get("BROKERD_MQTT_PORT", "1883")
    ws = os.environ.get("BROKERD_WS_PORT", "8083")
    store = os.environ.get("BROKERD_STORE", "sqlite:///var/brokerd.sqlite3")
    # the console's database is the control plane (DATABASE_URL, as the console reads it)
    control = os.environ.get("DATABASE_URL", "sqlite:///var/console.sqlite3")
    return {
        "brokerd": [PY, "-m", "brokerd", "--allow-anonymous", "--store", store, "--control-plane", control,
                    "--listen", f"mqtt://{host}:{mqtt}", "--listen", f"ws://{host}:{ws}/mqtt"],
    }


def banner() -> str:
    host = os.environ.get("BROKERD_HOST", "127.0.0.1")
    mqtt = os.environ.get("BROKERD_MQTT_PORT", "1883")
    ws = os.environ.get("BROKERD_WS_PORT", "8083")
    return f"""
  brokerd (MQTT 3.1.1 + 5.0, anonymous clients allowed on this development node)
    MQTT       mqtt://{host}:{mqtt}
    WebSocket  ws://{host}:{ws}/mqtt
    sessions   {os.environ.get("BROKERD_STORE", "sqlite:///var/brokerd.sqlite3")} (persistent sessions and retained
               messages survive a restart)
  try (anonymous clients land in the tenant "default"):
    mosquitto_sub -h {host} -p {mqtt} -t 'demo/#' -v &
    mosquitto_pub -h {host} -p {mqtt} -t demo/hello -m world
  devices of your own tenant:
    .venv/bin/python manage.py tenants create acme
    .venv/bin/python manage.py acl add acme --allow --action both --topic '{{device}}/#'
    .venv/bin/python manage.py devices create acme dev1      # prints the secret once
    mosquitto_pub -h {host} -p {mqtt} -u acme/dev1 -P SECRET -t dev1/temp -m 21
  Ctrl-C stops everything.
"""


def main() -> int:
    os.chdir(ROOT)
    load_dotenv(ROOT / ".env")
    (ROOT / "var").mkdir(exist_ok=True)
    subprocess.run([PY, "manage.py", "migrate", "--noinput", "-v", "0"], check=True)
    sel = selectors.DefaultSelector()
    procs = {}
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for name, cmd in services().items():
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True, bufsize=1)
        procs[name] = p
        sel.register(p.stdout, selectors.EVENT_READ, name)
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    printed_banner = False
    width = max(len(n) for n in procs)
    while not stopping:
        for key, _ in sel.select(0.5):
            line = key.fileobj.readline()
            if not line:
                sel.unregister(key.fileobj)
                continue
            print(f"{key.data:>{width}} | {line.rstrip()}", flush=True)
            if not printed_banner and "brokerd ready" in line:
                print(banner(), flush=True)
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
        for line in key.fileobj:
            print(f"{key.data:>{width}} | {line.rstrip()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Container health check of one mqtthub role (``mqtthub healthcheck [ROLE]``).

The role is the argument, else the one docker/entrypoint.sh recorded when it
started. Exit 0 healthy, 1 not (with one line saying why):

- brokerd: with an admin API (BROKERD_ADMIN), its ``/healthz`` answers 200
  (a fenced node answers 503); without one, an MQTT 3.1.1 CONNECT to the
  node's first listener is answered with a CONNACK other than "server
  unavailable";
- console: ``GET /healthz`` (a database round trip) answers 200, over TLS when
  daphne serves TLS;
- worker: the Celery worker answers a ping; beat: its process runs;
- spark-master / spark-worker: their web UI answers.
"""

import os
import socket
import ssl
import sys
import urllib.error
import urllib.request
from urllib.parse import urlsplit

ROLE_FILE = os.environ.get("MQTTHUB_ROLE_FILE", "/tmp/mqtthub.role")


def _local(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


def brokerd() -> str | None:
    admin = os.environ.get("BROKERD_ADMIN")
    if admin:
        host, _, port = admin.rpartition(":")
        try:
            with urllib.request.urlopen(f"http://{_local(host.strip('[]'))}:{port}/healthz", timeout=4) as resp:
                return None if resp.status == 200 else f"admin API /healthz answered {resp.status}"
        except urllib.error.HTTPError as exc:
            return f"admin API /healthz answered {exc.code} {exc.read()[:100]!r}"
    listen = os.environ.get("BROKERD_LISTEN", "mqtt://127.0.0.1:1883").replace(",", " ").split()
    url = next((u for u in listen if u.startswith(("mqtt://", "mqtts://"))), None)
    if url is None:
        return "no mqtt:// or mqtts:// listener in BROKERD_LISTEN"
    parts = urlsplit(url)
    port = parts.port or (8883 if parts.scheme == "mqtts" else 1883)
    client_id = f"healthcheck-{os.getpid()}".encode()
    # CONNECT: protocol "MQTT" level 4, clean session, keepalive 10, client id
    body = b"\x00\x04MQTT\x04\x02\x00\x0a" + len(client_id).to_bytes(2, "big") + client_id
    with socket.create_connection((_local(parts.hostname or ""), port), timeout=4) as sock:
        if parts.scheme == "mqtts":
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE     # our own certificate, any name
            sock = ctx.wrap_socket(sock)
        sock.sendall(b"\x10" + bytes([len(body)]) + body)
        connack = sock.recv(4)
        sock.sendall(b"\xe0\x00")
    if len(connack) < 4 or connack[0] != 0x20:
        return f"no CONNACK from {url}: {connack!r}"
    if connack[3] == 3:
        return f"{url} answers 'server unavailable' (fenced, or its store is down)"
    return None


def console() -> str | None:
    tls = bool(os.environ.get("CONSOLE_TLS_CERT"))
    port = os.environ.get("CONSOLE_PORT", "8000")
    hosts = [h.lstrip(".") for h in os.environ.get("ALLOWED_HOSTS", "localhost").split(",") if h.strip()]
    host = next((h.strip() for h in hosts if h.strip() != "*"), "localhost")
    ctx = None
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    req = urllib.request.Request(f"{'https' if tls else 'http'}://127.0.0.1:{port}/healthz", headers={"Host": host})
    with urllib.request.urlopen(req, timeout=4, context=ctx) as resp:
        return None if resp.status == 200 else f"/healthz answered {resp.status}"


def worker() -> str | None:
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "celery", "-A", "console", "inspect", "ping", "--timeout", "3",
                           "-d", f"celery@{socket.gethostname()}"], capture_output=True, text=True, timeout=30)
    return None if proc.returncode == 0 else f"the worker did not answer a ping: {proc.stdout[-200:]}"


def beat() -> str | None:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    argv = fh.read().split(b"\0")
            except OSError:
                continue
            if b"celery" in b" ".join(argv) and b"beat" in argv:
                return None
    return "no celery beat process"


def web(port: str):
    def check() -> str | None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=4) as resp:
            return None if resp.status == 200 else f"web UI answered {resp.status}"
    return check


CHECKS = {"brokerd": brokerd, "console": console, "worker": worker, "beat": beat,
          "spark-master": web(os.environ.get("SPARK_MASTER_WEBUI_PORT", "8080")),
          "spark-worker": web(os.environ.get("SPARK_WORKER_WEBUI_PORT", "8081"))}


def main(argv: list[str]) -> int:
    role = argv[0] if argv else None
    if role is None:
        try:
            with open(ROLE_FILE) as fh:
                role = fh.read().strip()
        except OSError:
            print(f"unhealthy: no role given and none recorded in {ROLE_FILE}")
            return 1
    check = CHECKS.get(role)
    if check is None:
        return 0        # one-shot roles (migrate, manage) have nothing to check
    try:
        problem = check()
    except Exception as exc:
        problem = f"{type(exc).__name__}: {exc}"
    print(f"{role}: {'unhealthy: ' + problem if problem else 'healthy'}")
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What the operator's guide (docs/operations.md) tells operators to do, done:
rotating a node's TLS certificate with SIGHUP (``docker compose kill -s HUP``)
without dropping connected clients, and brokerd's JSON log lines."""

import json
import shutil
import signal
import ssl
import time

import pytest
import trustme

from ..integration.helpers import V311, Client
from ..pki import write_cert
from ..procs import BrokerProcess


def server_cert(ca: trustme.CA, directory, name: str) -> tuple[str, str, str]:
    """A server certificate of ``ca`` for 127.0.0.1 on disk; -> (chain, key, CA) paths."""
    crt, key = write_cert(ca.issue_cert("127.0.0.1", "localhost"), directory, name)
    ca_path = directory / f"{name}-ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    return crt, key, str(ca_path)


def tls_client(client_id: str, ca_path: str) -> Client:
    c = Client(client_id, V311)
    c.client.tls_set(ca_certs=ca_path)
    return c


def handshake_fails(port: int, ca_path: str) -> bool:
    import socket

    ctx = ssl.create_default_context(cafile=ca_path)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, \
                ctx.wrap_socket(sock, server_hostname="127.0.0.1"):
            return False
    except ssl.SSLCertVerificationError:
        return True


def wait_for_log(broker: BrokerProcess, text: str, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while text not in broker.log:
        assert time.monotonic() < deadline, f"{text!r} not logged:\n{broker.log[-2000:]}"
        time.sleep(0.05)


def test_sighup_rotates_the_tls_certificate_and_keeps_clients(tmp_path):
    old_crt, old_key, old_ca = server_cert(trustme.CA(), tmp_path, "old")
    live_crt, live_key = str(tmp_path / "server.crt"), str(tmp_path / "server.key")
    shutil.copy(old_crt, live_crt)
    shutil.copy(old_key, live_key)
    with BrokerProcess("--tls-cert", live_crt, "--tls-key", live_key, listen=("mqtts://127.0.0.1:0",)) as b:
        port = b.port("mqtts")
        before = tls_client("before", old_ca).connect(port)
        before.subscribe("rot/#", qos=1)

        new_crt, new_key, new_ca = server_cert(trustme.CA(), tmp_path, "new")
        shutil.copy(new_crt, live_crt)
        shutil.copy(new_key, live_key)
        b.proc.send_signal(signal.SIGHUP)
        wait_for_log(b, "TLS certificate reloaded")

        assert handshake_fails(port, old_ca), "new handshakes still get the old certificate"
        with tls_client("after", new_ca).connect(port) as after:
            after.publish("rot/x", b"over the new certificate", qos=1)
        # the client connected under the old certificate stayed and gets it
        assert before.expect().payload == b"over the new certificate"

        # a broken file keeps the certificate in use
        (tmp_path / "server.key").write_text("not a key")
        b.proc.send_signal(signal.SIGHUP)
        wait_for_log(b, "TLS certificate not reloaded")
        with tls_client("still", new_ca).connect(port):
            pass
        before.disconnect()
        assert b.proc.poll() is None


def test_json_log_lines_name_the_node():
    with BrokerProcess("--log-format", "json", "--node-id", "jsonnode") as b:
        pass
    records = [json.loads(ln) for ln in b.output if ln.startswith("{")]
    assert records, b.log
    assert all({"time", "level", "logger", "message"} <= set(r) and r["node"] == "jsonnode" for r in records)
    assert any(r["message"].startswith("listening on") for r in records)


@pytest.mark.parametrize("value", ["xml"])
def test_unknown_log_format_is_refused(value):
    import subprocess
    import sys

    from ..procs import ROOT

    proc = subprocess.run([sys.executable, "-m", "brokerd", "--log-format", value], cwd=ROOT, capture_output=True,
                          text=True, timeout=15)
    assert proc.returncode == 2 and "--log-format" in proc.stderr

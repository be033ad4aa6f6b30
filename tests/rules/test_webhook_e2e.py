"""The webhook action end to end (issue 19): rules added with ``manage.py rules
add --webhook`` in a real console database, run by a real brokerd, sending to
real HTTP servers on loopback (``http.server`` in a thread); observed with
paho-mqtt clients, the admin API and the servers' own records."""

import json
import queue
import ssl
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import trustme

from ..controlplane import ControlPlane
from ..procs import free_port
from .nodes import add_each, client, delete_each, loaded, rule_view, wait_for

pytestmark = pytest.mark.slow

ACL = [
    {"topic": "sensors/#", "action": "both", "allow": True},
    {"topic": "bulk/#", "action": "both", "allow": True},
    {"topic": "canary/#", "action": "both", "allow": True},
]
KIB = 1024


class Hook:
    """An HTTP server on 127.0.0.1 that records every request; ``status`` is what
    it answers, ``hold`` (an Event) keeps each request waiting until it is set."""

    def __init__(self, port: int = 0, status: int = 200, hold: threading.Event | None = None, tls=None):
        self.requests: queue.Queue = queue.Queue()
        self.status, self.hold = status, hold
        self.count = 0
        hook = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hook.count += 1
                hook.requests.put((self.command, self.path, dict(self.headers), body))
                if hook.hold is not None:
                    hook.hold.wait(60)
                self.send_response(hook.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_PUT = do_GET = do_PATCH = do_DELETE = _any

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        if tls is not None:                   # an ssl.SSLContext (server side)
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def next(self, timeout: float = 10.0):
        return self.requests.get(timeout=timeout)

    def close(self):
        if self.hold is not None:
            self.hold.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    plane = ControlPlane(tmp_path_factory.mktemp("webhooks"))
    secrets = plane.provision([{"slug": "acme", "acl": ACL, "devices": ["d1", "watch"]},
                               {"slug": "globex", "acl": ACL, "devices": ["d1", "watch"]}])
    token = plane.issue_token("webhook-reader", "read")
    # the tests' servers are on 127.0.0.1: loopback is refused unless allowed
    node = plane.broker("--admin", "127.0.0.1:0", "--rules-webhook-allow", "127.0.0.1",
                        "--rules-webhook-buffer", str(256 * KIB), "--rules-webhook-tenant-buffer", str(64 * KIB),
                        "--rules-webhook-concurrency", "4")
    yield plane, node, secrets, token
    node.stop()


def add(plane, tenant, *args) -> int:
    return int(plane.manage("rules", "add", tenant, *args).stdout.strip())










def test_a_webhook_is_delivered_with_the_rendered_request(scene):
    plane, node, secrets, token = scene
    hook = Hook()
    try:
        shaped, plain = add_each(
            plane, "acme",
            ("--sql", 'SELECT payload.temp AS t, clientid FROM "sensors/+/temp" WHERE t > 30',
             "--webhook", hook.url("/hook/${clientid}?t=${t}"), "--method", "PUT",
             "--header", "X-Device: ${clientid}", "--header", "Authorization: Bearer s3cret",
             "--body", "device=${clientid} temp=${t}"),
            ("--sql", 'SELECT payload.temp AS t, topic FROM "sensors/+/hum"', "--webhook", hook.url("/plain")))
        loaded(node, token, "acme", shaped)
        loaded(node, token, "acme", plain)
        dev = client(node, secrets, "acme/d1", "d1-hook")
        for temp in (12, 31.5):
            dev.publish("sensors/kitchen/temp", json.dumps({"temp": temp}).encode(), qos=1)
        dev.publish("sensors/kitchen/hum", b'{"temp": 7}', qos=1)
        got = sorted([hook.next(), hook.next()], key=lambda r: r[1])
        method, path, headers, body = got[0]
        assert (method, path, body) == ("PUT", "/hook/d1-hook?t=31.5", b"device=d1-hook temp=31.5")
        assert headers["X-Device"] == "d1-hook" and headers["Authorization"] == "Bearer s3cret"
        assert headers["Host"] == f"127.0.0.1:{hook.port}"
        method, path, headers, body = got[1]
        assert (method, path, headers["Content-Type"]) == ("POST", "/plain", "application/json")
        assert json.loads(body) == {"t": 7, "topic": "sensors/kitchen/hum"}      # the output row as JSON
        with pytest.raises(queue.Empty):
            hook.next(timeout=0.5)                                               # 12 is not above 30
        view = wait_for(lambda: (v := rule_view(node, token, "acme", shaped))["sent"] == 1 and v,
                        what="sent counted")
        assert (view["matched"], view["passed"], view["no_result"], view["failed"], view["dropped"]) == (2, 1, 1, 0, 0)
        dev.disconnect()
        delete_each(plane, "acme", (shaped, plain))
    finally:
        hook.close()


def test_a_webhook_is_retried_while_the_server_is_down_and_delivered_when_it_is_back(scene):
    plane, node, secrets, token = scene
    port = free_port()                        # nobody listens there yet: connections are refused
    rid = add(plane, "acme", "--sql", 'SELECT clientid FROM "sensors/+/door"', "--webhook",
              f"http://127.0.0.1:{port}/door", "--retries", "6", "--timeout", "2")
    loaded(node, token, "acme", rid)
    dev = client(node, secrets, "acme/d1", "d1-retry")
    dev.publish("sensors/front/door", b"open", qos=1)
    view = wait_for(lambda: (v := rule_view(node, token, "acme", rid))["retried"] >= 1 and v,
                    what="a first retry")
    assert (view["sent"], view["failed"]) == (0, 0)
    hook = Hook(port)                         # the server comes back
    try:
        method, path, _, body = hook.next(timeout=30)       # backoff 0.5, 1, 2, 4 ... s
        assert (method, path, json.loads(body)) == ("POST", "/door", {"clientid": "d1-retry"})
        view = wait_for(lambda: (v := rule_view(node, token, "acme", rid))["sent"] == 1 and v, what="sent")
        assert view["failed"] == 0 and view["last_error"] is None
    finally:
        hook.close()
        dev.disconnect()
        plane.manage("rules", "delete", "acme", str(rid))


def test_a_webhook_failing_past_its_retries_is_counted_with_its_error(scene):
    plane, node, secrets, token = scene
    hook = Hook(status=503)
    refused = free_port()
    try:
        busy, dead = add_each(
            plane, "acme",
            ("--sql", 'SELECT clientid FROM "sensors/+/gas"', "--webhook", hook.url("/gas"), "--retries", "2"),
            ("--sql", 'SELECT clientid FROM "sensors/+/gas"', "--webhook", f"http://127.0.0.1:{refused}/gas",
             "--retries", "0"))
        loaded(node, token, "acme", busy)
        loaded(node, token, "acme", dead)
        dev = client(node, secrets, "acme/d1", "d1-fail")
        dev.publish("sensors/cellar/gas", b"{}", qos=1)
        view = wait_for(lambda: (v := rule_view(node, token, "acme", busy))["failed"] == 1 and v,
                        what="the failure counted")
        assert hook.count == 3                                  # the first attempt and 2 retries
        assert (view["sent"], view["retried"], view["passed"]) == (0, 2, 1)
        assert view["last_error"] == "HTTP 503 from 127.0.0.1 (after 3 attempts)"
        assert view["last_error_at"] == pytest.approx(time.time(), abs=30)
        view = wait_for(lambda: (v := rule_view(node, token, "acme", dead))["failed"] == 1 and v,
                        what="the refused connection counted")
        assert "ConnectionRefusedError" in view["last_error"] and view["retried"] == 0
        dev.disconnect()
        delete_each(plane, "acme", (busy, dead))
    finally:
        hook.close()


def test_a_destination_outside_the_allowance_is_refused_and_counted(scene):
    plane, node, secrets, token = scene
    targets = {
        "http://10.1.2.3/x": "10.1.2.3 (10.1.2.3) is not an allowed destination (--rules-webhook-allow)",
        "http://169.254.169.254/latest/meta-data/": "is not an allowed destination",
        "http://127.0.0.2:8080/": "127.0.0.2 (127.0.0.2) is not an allowed destination",
        f"http://127.0.0.1:{node.port()}/": f"127.0.0.1:{node.port()} (127.0.0.1) is this node's own port",
    }
    rids = dict(zip(targets, add_each(plane, "globex", *(("--sql", 'SELECT clientid FROM "sensors/#"', "--webhook",
                                                          url, "--retries", "3") for url in targets)), strict=True))
    for rid in rids.values():
        loaded(node, token, "globex", rid)
    dev = client(node, secrets, "globex/d1", "d1-ssrf")
    dev.publish("sensors/x", b"1", qos=1)
    for url, says in targets.items():
        view = wait_for(lambda rid=rids[url]: (v := rule_view(node, token, "globex", rid))["failed"] == 1 and v,
                        what=f"{url} refused")
        assert says in view["last_error"] and (view["sent"], view["retried"]) == (0, 0)   # refused: not retried
    # the console refuses what is obviously not a web destination
    done = plane.manage("rules", "add", "globex", "--sql", 'SELECT * FROM "a"', "--webhook", "file:///etc/passwd",
                        check=False)
    assert done.returncode == 1 and done.stderr.startswith("error: webhook: the URL must start with http://")
    dev.disconnect()
    delete_each(plane, "globex", rids.values())


def test_tls_is_verified_a_certificate_the_node_does_not_trust_fails_the_webhook(scene):
    plane, node, secrets, token = scene
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    trustme.CA().issue_cert("127.0.0.1").configure_cert(server_side)      # a CA the node has never heard of
    hook = Hook(tls=server_side)
    try:
        rid = add(plane, "acme", "--sql", 'SELECT clientid FROM "sensors/+/smoke"', "--webhook",
                  hook.url("/smoke", scheme="https"), "--retries", "0")
        loaded(node, token, "acme", rid)
        dev = client(node, secrets, "acme/d1", "d1-tls")
        dev.publish("sensors/hall/smoke", b"1", qos=1)
        view = wait_for(lambda: (v := rule_view(node, token, "acme", rid))["failed"] == 1 and v, what="the failure")
        assert "CERTIFICATE_VERIFY_FAILED" in view["last_error"] and view["sent"] == 0
        assert hook.requests.empty()                                        # nothing was sent over it
        dev.disconnect()
        plane.manage("rules", "delete", "acme", str(rid))
    finally:
        hook.close()


def _rss_kib(node) -> int:
    with open(f"/proc/{node.proc.pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


def test_a_slow_webhook_never_delays_delivery_and_its_buffer_stays_bounded(scene):
    plane, node, secrets, token = scene
    hold = threading.Event()
    hook = Hook(hold=hold)                    # answers nothing until the test ends
    count, size = 4000, 8 * KIB               # 32 MiB of webhook bodies against a 64 KiB tenant buffer
    try:
        rid = add(plane, "acme", "--sql", 'SELECT payload, topic FROM "bulk/#"', "--webhook", hook.url("/bulk"),
                  "--timeout", "60", "--retries", "0")
        loaded(node, token, "acme", rid)
        watch = client(node, secrets, "acme/watch", "w-bulk")
        watch.subscribe("bulk/#", qos=1)
        canary_sub = client(node, secrets, "globex/watch", "canary-sub")
        canary_sub.subscribe("canary/#", qos=1)
        canary = client(node, secrets, "globex/d1", "canary-pub")
        dev = client(node, secrets, "acme/d1", "d1-bulk")
        rss_before = _rss_kib(node)
        payload = b"x" * size
        # Paced like a device, and never more than LAG messages ahead of the subscriber: the
        # publisher's PUBACKs do not wait for the subscriber, so on a loaded machine a slow test
        # subscriber fell more than its session queue's 1,000 messages (--max-queued) behind and the
        # broker rightly dropped the excess (3870, 3350, 3758 of 4000 arrived). The subscriber's own
        # pace is not what this test is about; the webhook that hangs is.
        lag = 200
        for i in range(count):
            dev.publish(f"bulk/{i % 8}", payload, qos=1, wait=i % 20 == 19)
            if i % 50 == 49:
                deadline = time.monotonic() + 60
                while watch.messages.qsize() < i + 1 - lag:
                    assert time.monotonic() < deadline, (
                        f"the subscriber got {watch.messages.qsize()} of {i + 1} messages in 60 s")
                    time.sleep(0.01)
        got = watch.expect_n(count, timeout=60)          # every message delivered while the webhook hangs
        assert len(got) == count
        canary.publish("canary/ping", b"still served", qos=1)
        [ping] = canary_sub.expect_n(1)
        assert ping.payload == b"still served"
        hook.next()                                      # the webhook was called (and hangs)
        view = rule_view(node, token, "acme", rid)
        assert view["sent"] == 0 and view["passed"] == count
        # in flight: at most the 4 workers; queued: at most 64 KiB (7 requests of 8 KiB); the rest dropped
        assert view["dropped"] >= count - 4 - 8
        assert view["last_error"].startswith("dropped: the tenant's webhook buffer was full")
        # what the console's alarm on rule actions dropped reads (the tenant's figures of the admin API)
        req = urllib.request.Request(f"{node.admin_url}/api/v1/metrics", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            figures = json.loads(resp.read())
        assert figures["tenants"]["acme"]["rule_actions_dropped"] >= view["dropped"]
        assert figures["tenants"]["globex"]["rule_actions_dropped"] == 0
        grown = _rss_kib(node) - rss_before
        assert grown < 16 * KIB, f"RSS grew by {grown} KiB"      # vs 32 MiB of bodies had they been kept
        assert "webhook buffer full: dropping the oldest requests" in node.log
        for c in (dev, watch, canary, canary_sub):
            c.disconnect()
        plane.manage("rules", "delete", "acme", str(rid))
    finally:
        hook.close()


class RawHook:
    """A TCP server on 127.0.0.1 that reads a request and answers ``answer`` (bytes), whatever it is."""

    def __init__(self, answer: bytes):
        import socket
        self.answer = answer
        self.count = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(10)
                try:
                    conn.recv(65536)
                    self.count += 1
                    conn.sendall(self.answer)
                    time.sleep(0.5)
                except OSError:
                    pass

    def close(self):
        self.sock.close()


def test_an_endpoint_answering_an_endless_status_line_fails_its_rule_and_the_sender_goes_on(scene):
    """An endpoint answering a status line longer than the reader's limit (64 KiB, no CRLF) raised
    LimitOverrunError, which the sender did not catch: the worker task died with it, its rule was never
    told, and once the node's workers were gone no webhook of any tenant was sent again."""
    plane, _, secrets, token = scene
    node = plane.broker("--admin", "127.0.0.1:0", "--rules-webhook-allow", "127.0.0.1",
                        "--rules-webhook-concurrency", "1")
    bad = RawHook(b"HTTP/1.1 200 " + b"x" * (100 * KIB))
    good = Hook()
    try:
        junk, fine = add_each(
            plane, "acme",
            ("--sql", 'SELECT clientid FROM "sensors/+/junk"', "--webhook", f"http://127.0.0.1:{bad.port}/j",
             "--retries", "0"),
            ("--sql", 'SELECT clientid FROM "sensors/+/fine"', "--webhook", good.url("/fine"), "--retries", "0"))
        loaded(node, token, "acme", junk)
        loaded(node, token, "acme", fine)
        dev = client(node, secrets, "acme/d1", "d1-junk")
        dev.publish("sensors/a/junk", b"{}", qos=1)
        view = wait_for(lambda: (v := rule_view(node, token, "acme", junk))["failed"] == 1 and v,
                        what="the endless status line counted as a failure")
        assert view["sent"] == 0 and view["last_error"].startswith("127.0.0.1:")
        assert bad.count == 1
        dev.publish("sensors/a/fine", b"{}", qos=1)                  # the node's only worker is still there
        method, path, _, _ = good.next(timeout=15)
        assert (method, path) == ("POST", "/fine")
        wait_for(lambda: rule_view(node, token, "acme", fine)["sent"] == 1, what="sent")
        dev.disconnect()
        delete_each(plane, "acme", (junk, fine))
    finally:
        bad.close()
        good.close()
        node.stop()

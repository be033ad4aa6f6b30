"""Record real client traffic as fuzz seeds: ``fuzz/corpus/<scenario>-<n>.bin``.

Starts a real brokerd (``python -m brokerd --allow-anonymous``) on a free
loopback port and a tiny TCP relay in front of it, then runs real clients
through the relay -- paho-mqtt (3.1.1 and 5.0) and Debian's ``mosquitto_pub`` /
``mosquitto_sub`` (``-V 311`` and ``-V 5``) -- and saves each connection's
client->broker byte stream, untouched, as one corpus file. Everything stays on
127.0.0.1.

    .venv/bin/python fuzz/capture.py [--out fuzz/corpus]

Needs paho-mqtt (a test dependency) and the ``mosquitto-clients`` package.
"""

import argparse
import os
import re
import socket
import subprocess
import sys
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Relay:
    """127.0.0.1:port -> the broker; each connection's client->broker bytes are kept under the current label."""

    def __init__(self, upstream: int):
        self.upstream = upstream
        self.label = "unnamed"
        self.streams: list[tuple[str, bytearray]] = []
        self.lock = threading.Lock()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            buf = bytearray()
            with self.lock:
                self.streams.append((self.label, buf))
            for src, dst, keep in ((client, server, buf), (server, client, None)):
                t = threading.Thread(target=self._pipe, args=(src, dst, keep), daemon=True)
                t.start()
                self.threads.append(t)

    @staticmethod
    def _pipe(src, dst, keep):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if keep is not None:
                    keep += data
                dst.sendall(data)
        except OSError:
            pass
        for s in (dst, src):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def settle(self):
        """Wait until every relayed connection has ended."""
        deadline = time.time() + 10
        for t in list(self.threads):
            t.join(max(0.0, deadline - time.time()))


def start_brokerd():
    proc = subprocess.Popen(
        [sys.executable, "-m", "brokerd", "--allow-anonymous", "--listen", "mqtt://127.0.0.1:0",
         "--sys-interval", "0", "--log-level", "warning"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    m = re.search(r"listeners=mqtt://127\.0\.0\.1:(\d+)", line)
    if not m:
        proc.kill()
        raise SystemExit(f"brokerd did not start: {line!r}")
    return proc, int(m.group(1))


# ----------------------------------------------------------------------------- paho

def paho_client(port, cid, v5, clean=True, will=None, connect_props=None, username=None):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid,
                    protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
                    **({} if v5 else {"clean_session": clean}))
    if username:
        c.username_pw_set(username, "secret")
    if will:
        c.will_set(*will[:4], properties=will[4] if v5 and len(will) > 4 else None)
    done = threading.Event()
    c.on_connect = lambda *a: done.set()
    kw = {}
    if v5:
        kw["clean_start"] = clean
        kw["properties"] = connect_props
    c.connect("127.0.0.1", port, keepalive=30, **kw)
    c.loop_start()
    if not done.wait(5):
        raise RuntimeError(f"{cid}: no CONNACK")
    return c


def wait_pubs(c, infos):
    for info in infos:
        info.wait_for_publish(5)


def finish(c, v5=False, props=None, rc=None):
    if v5 and rc is not None:
        c.disconnect(reasoncode=rc, properties=props)
    else:
        c.disconnect()
    c.loop_stop()


def scenario_paho311(relay, port):
    relay.label = "paho311-basic"
    c = paho_client(port, "paho311-basic", False)
    c.subscribe([("fuzz/paho/#", 2), ("fuzz/+/x", 1), ("fuzz/peer", 0)])
    time.sleep(0.2)
    wait_pubs(c, [c.publish("fuzz/paho/q0", b"zero", 0), c.publish("fuzz/paho/q1", b"one", 1),
                  c.publish("fuzz/paho/q2", b"two" * 30, 2), c.publish("fuzz/paho/ret", b"kept", 1, retain=True)])
    time.sleep(0.3)   # own messages come back: PUBACK / PUBREC / PUBCOMP from the client
    c.unsubscribe("fuzz/+/x")
    time.sleep(0.1)
    finish(c)

    relay.label = "paho311-will"
    c = paho_client(port, "paho311-will", False, clean=False,
                    will=("fuzz/paho/will", b"gone", 1, True), username="dev")
    wait_pubs(c, [c.publish("fuzz/paho/big", bytes(range(256)) * 8, 1)])
    finish(c)

    relay.label = "paho311-persistent"
    c = paho_client(port, "paho311-persistent", False, clean=False)
    c.subscribe("fuzz/paho/ret", 1)
    time.sleep(0.3)
    finish(c)


def scenario_paho5(relay, port):
    relay.label = "paho5-basic"
    cp = Properties(PacketTypes.CONNECT)
    cp.SessionExpiryInterval = 120
    cp.ReceiveMaximum = 10
    cp.TopicAliasMaximum = 5
    cp.MaximumPacketSize = 65536
    cp.RequestProblemInformation = 1
    cp.UserProperty = [("device", "fuzz"), ("fw", "1.2")]
    c = paho_client(port, "paho5-basic", True, connect_props=cp)
    sp = Properties(PacketTypes.SUBSCRIBE)
    sp.SubscriptionIdentifier = 7
    c.subscribe([("fuzz/p5/#", SubscribeOptions(qos=2, noLocal=False, retainAsPublished=True, retainHandling=0)),
                 ("fuzz/p5/nl", SubscribeOptions(qos=1, noLocal=True, retainHandling=1)),
                 ("fuzz/p5/r2", SubscribeOptions(qos=0, retainHandling=2))], properties=sp)
    time.sleep(0.2)
    pp = Properties(PacketTypes.PUBLISH)
    pp.PayloadFormatIndicator = 1
    pp.MessageExpiryInterval = 60
    pp.ContentType = "text/plain"
    pp.ResponseTopic = "fuzz/p5/reply"
    pp.CorrelationData = b"\x01\x02corr"
    pp.UserProperty = [("k", "v"), ("k", "v2")]
    infos = [c.publish("fuzz/p5/q0", b"zero", 0, properties=pp), c.publish("fuzz/p5/q1", b"one", 1, properties=pp),
             c.publish("fuzz/p5/q2", b"two", 2, properties=pp), c.publish("fuzz/p5/ret", b"kept", 1, retain=True)]
    # topic alias: set it with the topic, then use it with an empty topic
    ta = Properties(PacketTypes.PUBLISH)
    ta.TopicAlias = 1
    infos.append(c.publish("fuzz/p5/alias", b"first", 1, properties=ta))
    infos.append(c.publish("", b"by-alias", 1, properties=ta))
    infos.append(c.publish("", b"by-alias-q2", 2, properties=ta))
    wait_pubs(c, infos)
    time.sleep(0.3)
    up = Properties(PacketTypes.UNSUBSCRIBE)
    up.UserProperty = [("why", "done")]
    c.unsubscribe(["fuzz/p5/nl", "fuzz/p5/none"], properties=up)
    time.sleep(0.1)
    dp = Properties(PacketTypes.DISCONNECT)
    dp.SessionExpiryInterval = 0
    dp.ReasonString = "bye"
    finish(c, True, dp, mqtt.ReasonCode(PacketTypes.DISCONNECT, "Normal disconnection"))

    relay.label = "paho5-will"
    wp = Properties(PacketTypes.WILLMESSAGE)
    wp.WillDelayInterval = 5
    wp.MessageExpiryInterval = 30
    wp.ContentType = "application/json"
    wp.UserProperty = [("last", "words")]
    cp = Properties(PacketTypes.CONNECT)
    cp.SessionExpiryInterval = 30
    c = paho_client(port, "paho5-will", True, clean=False, will=("fuzz/p5/will", b'{"gone":1}', 2, True, wp),
                    connect_props=cp, username="dev")
    wait_pubs(c, [c.publish("fuzz/p5/q2b", b"x" * 300, 2)])
    finish(c, True, None, mqtt.ReasonCode(PacketTypes.DISCONNECT, "Disconnect with will message"))

    relay.label = "paho5-empty-id"
    c = paho_client(port, "", True)
    wait_pubs(c, [c.publish("fuzz/p5/anon", b"", 0)])
    finish(c)


# ------------------------------------------------------------------------ mosquitto

def mosq(*args, timeout=10, input_text=None):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, input=input_text)


def scenario_mosquitto(relay, port):
    p = str(port)
    common = ["-h", "127.0.0.1", "-p", p]
    for v in ("311", "5"):
        for q in ("0", "1", "2"):
            relay.label = f"mosquitto_pub-v{v}-q{q}"
            mosq("mosquitto_pub", *common, "-V", v, "-q", q, "-i", f"mpub{v}{q}", "-t", f"fuzz/mosq/{v}/{q}",
                 "-m", f"hello q{q}")
        relay.label = f"mosquitto_pub-v{v}-retain-will"
        mosq("mosquitto_pub", *common, "-V", v, "-q", "1", "-r", "-t", f"fuzz/mosq/{v}/ret", "-m", "retained",
             "--will-topic", f"fuzz/mosq/{v}/will", "--will-payload", "offline", "--will-qos", "2", "--will-retain",
             "-u", "dev", "-P", "pw", "-k", "15")
        relay.label = f"mosquitto_pub-v{v}-multi"
        mosq("mosquitto_pub", *common, "-V", v, "-q", "2", "-t", f"fuzz/mosq/{v}/lines", "-l", "-c",
             "-i", f"mpubl{v}", input_text="a\nbb\nccc\n")
    relay.label = "mosquitto_pub-v5-props"
    mosq("mosquitto_pub", *common, "-V", "5", "-q", "1", "-t", "fuzz/mosq/5/props", "-m", "{}",
         "-D", "connect", "session-expiry-interval", "60",
         "-D", "connect", "receive-maximum", "20",
         "-D", "connect", "topic-alias-maximum", "4",
         "-D", "connect", "user-property", "client", "mosquitto",
         "-D", "publish", "content-type", "application/json",
         "-D", "publish", "payload-format-indicator", "1",
         "-D", "publish", "message-expiry-interval", "30",
         "-D", "publish", "response-topic", "fuzz/mosq/reply",
         "-D", "publish", "correlation-data", "c0ffee",
         "-D", "publish", "user-property", "a", "b",
         "-D", "publish", "topic-alias", "3",
         "-D", "disconnect", "reason-string", "done")
    relay.label = "mosquitto_pub-v5-will-props"
    mosq("mosquitto_pub", *common, "-V", "5", "-q", "0", "-t", "fuzz/mosq/5/w", "-m", "w",
         "--will-topic", "fuzz/mosq/5/will", "--will-payload", "x", "--will-qos", "1",
         "-D", "will", "will-delay-interval", "10", "-D", "will", "user-property", "w", "1",
         "-D", "will", "content-type", "text/plain")

    # subscribers: each receives retained/live messages at QoS 0/1/2 and acknowledges them
    for v in ("311", "5"):
        for q in ("0", "1", "2"):
            relay.label = f"mosquitto_sub-v{v}-q{q}"
            extra = []
            if v == "5":
                extra = ["-D", "subscribe", "subscription-identifier", "9",
                         "-D", "connect", "session-expiry-interval", "10",
                         "-D", "subscribe", "user-property", "s", "1"]
            sub = subprocess.Popen(["mosquitto_sub", *common, "-V", v, "-q", q, "-t", f"fuzz/mosq/{v}/#",
                                    "-t", "fuzz/peer", "-C", "3", "-W", "5", "-i", f"msub{v}{q}", *extra],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.4)
            relay.label = f"mosquitto_pub-v{v}-to-sub-q{q}"
            for i in range(2):
                mosq("mosquitto_pub", *common, "-V", v, "-q", q, "-t", f"fuzz/mosq/{v}/live", "-m", f"m{i}")
            sub.wait(10)
    relay.label = "mosquitto_sub-v311-unsub-clean"
    mosq("mosquitto_sub", *common, "-V", "311", "-q", "1", "-t", "fuzz/mosq/311/ret", "-U", "fuzz/mosq/311/ret",
         "-C", "1", "-W", "2", "-c", "-i", "msubc", "--retained-only")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "fuzz", "corpus"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    proc, port = start_brokerd()
    try:
        relay = Relay(port)
        scenario_paho311(relay, relay.port)
        scenario_paho5(relay, relay.port)
        scenario_mosquitto(relay, relay.port)
        relay.label = "end"
        relay.settle()
    finally:
        proc.terminate()
        proc.wait(10)
    counts: dict[str, int] = {}
    written = 0
    for label, data in relay.streams:
        if not data:
            continue
        n = counts[label] = counts.get(label, 0) + 1
        with open(os.path.join(args.out, f"{label}-{n}.bin"), "wb") as f:
            f.write(bytes(data))
        written += 1
    print(f"{written} streams written to {args.out}")


if __name__ == "__main__":
    main()

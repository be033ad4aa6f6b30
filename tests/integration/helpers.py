"""Helpers for the integration suite: a richer paho client, the mosquitto
command-line clients, a reference Mosquitto broker and polling."""

import json
import queue
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt

from ..mqtt import V5, V31, V311, PacketTypes, PahoClient, props
from ..procs import free_port

MOSQUITTO = "/usr/sbin/mosquitto"
VERSIONS = {V311: "mqttv311", V5: "mqttv5", V31: "mqttv31"}


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.02, message: str = "condition not met",
               explain=None):
    """``predicate()``'s first true value; else AssertionError with ``message`` and, if given,
    what ``explain()`` says then (a process's log at the moment it failed)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} within {timeout} s" + (f"\n{explain()}" if explain else ""))
        time.sleep(interval)


class Client(PahoClient):
    """PahoClient plus: session_present, PUBACK/PUBREC reason codes, manual acks, CONNACK properties."""

    def __init__(self, *args, manual_ack: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self._last_flags = None
        self.connack_props = None
        self.pub_results: dict[int, tuple] = {}
        self.client.on_publish = self._on_publish
        # a test client never reconnects by itself (paho would after 1 s, and take the session back)
        self.client._reconnect_on_failure = False
        if manual_ack:
            self.client.manual_ack_set(True)

    def _on_connect(self, client, userdata, flags, reason_code, properties):
        self._last_flags = flags
        self.connack_props = properties
        super()._on_connect(client, userdata, flags, reason_code, properties)

    def _on_publish(self, client, userdata, mid, reason_code, properties):
        with self._cv:
            self.pub_results[mid] = (reason_code, properties)
            self._cv.notify_all()

    def publish_result(self, info, timeout: float = 5.0):
        """(reason code, properties) of the PUBACK/PUBREC for a publish()."""
        return self._wait(self.pub_results, info.mid, timeout)

    def ack(self, msg) -> None:
        self.client.ack(msg.mid, msg.qos)

    def stop_loop(self) -> None:
        """Stop paho's network thread now (loop_stop alone waits for its 1 s select timeout, and
        forever while it has unacknowledged outgoing messages)."""
        c = self.client
        thread = c._thread
        if thread is None:
            return
        c._thread_terminate = True
        try:
            c._sockpairW.send(b"0")
        except (OSError, AttributeError):
            pass
        if thread is not threading.current_thread():
            thread.join(0.5)
            if thread.is_alive():       # waiting for acks that will not come: cut the connection
                self._shutdown_socket()
                thread.join(5)

    def _shutdown_socket(self) -> None:
        sock = self.client.socket()
        sock = getattr(sock, "_socket", sock)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def drop(self) -> None:
        """Close the TCP connection without DISCONNECT, as a network failure would."""
        sock = self.client.socket()
        self._shutdown_socket()
        self.stop_loop()
        sock = getattr(sock, "_socket", sock)
        if sock is not None:
            sock.close()

    def freeze(self) -> None:
        """Stop reading and writing (no PINGREQ, no acks) but keep the socket open."""
        self.stop_loop()

    def disconnect(self, reasoncode=None, properties=None):
        if self.version == V5:
            self.client.disconnect(reasoncode=reasoncode, properties=properties)
        else:
            self.client.disconnect()
        self.stop_loop()

    def __exit__(self, *exc):
        try:
            self.client.disconnect()
        finally:
            self.stop_loop()


def connect(port: int, client_id: str, version=V311, **kwargs) -> Client:
    clean = kwargs.pop("clean", True)
    transport = kwargs.pop("transport", "tcp")
    manual_ack = kwargs.pop("manual_ack", False)
    return Client(client_id, version, clean=clean, transport=transport, manual_ack=manual_ack).connect(port, **kwargs)


def sub_opts(qos=0, no_local=False, rap=False, rh=0) -> mqtt.SubscribeOptions:
    return mqtt.SubscribeOptions(qos=qos, noLocal=no_local, retainAsPublished=rap, retainHandling=rh)


# --------------------------------------------------------------------------- mosquitto clients

def mosq_pub(port: int, topic: str, message: str | None = None, *args: str, version: str = "mqttv311",
             qos: int = 0, retain: bool = False, timeout: float = 10.0, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-V", version, "-q", str(qos), "-t", topic]
    if message is None:
        cmd.append("-n")
    else:
        cmd += ["-m", message]
    if retain:
        cmd.append("-r")
    cmd += list(args)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, f"{cmd} -> {proc.returncode}: {proc.stderr}"
    return proc


class MosqSub:
    """mosquitto_sub in the background: prints each message as JSON (-F %j, or the given -F format,
    then messages are strings) and debug lines (-d).

    ``start()`` returns once the SUBACK arrived. ``messages(n)`` waits for n messages.
    """

    def __init__(self, port: int, *topics: str, version: str = "mqttv311", qos: int = 0, client_id: str | None = None,
                 args=(), count: int | None = None, wait: float | None = None, fmt: str = "%j"):
        self.json = fmt == "%j"
        self.cmd = ["stdbuf", "-oL", "mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-V", version, "-q",
                    str(qos), "-d", "-F", "MSG " + fmt]
        for t in topics:
            self.cmd += ["-t", t]
        if client_id:
            self.cmd += ["-i", client_id]
        if count is not None:
            self.cmd += ["-C", str(count)]
        if wait is not None:
            self.cmd += ["-W", str(wait)]
        self.cmd += list(args)
        self.lines: queue.Queue = queue.Queue()
        self.debug: list[str] = []
        self.proc = None

    def start(self, expect_suback: bool = True, timeout: float = 5.0) -> "MosqSub":
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     bufsize=1, errors="replace")
        self._suback = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if expect_suback:
            assert self._suback.wait(timeout), f"mosquitto_sub got no SUBACK: {self.debug}"
        return self

    def _read(self):
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            if line.startswith("MSG "):
                self.lines.put(json.loads(line[4:]) if self.json else line[4:])
            else:
                self.debug.append(line)
                if "received SUBACK" in line:
                    self._suback.set()

    def messages(self, n: int, timeout: float = 5.0) -> list[dict]:
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            try:
                out.append(self.lines.get(timeout=max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"mosquitto_sub: {len(out)} of {n} messages; log: {self.debug[-5:]}")
        return out

    def none(self, timeout: float = 0.5) -> None:
        try:
            m = self.lines.get(timeout=timeout)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message {m}")

    def wait(self, timeout: float = 10.0) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


# --------------------------------------------------------------------------- reference broker

class MosquittoProcess:
    """The real Mosquitto broker on a free loopback port: the behavioural reference."""

    def __init__(self, *config_lines: str):
        self.extra = list(config_lines)
        self.dir = tempfile.TemporaryDirectory(prefix="mosq-ref-")
        self.proc = None
        self._port = None

    def start(self) -> "MosquittoProcess":
        self._port = free_port()
        conf = Path(self.dir.name) / "mosquitto.conf"
        conf.write_text("\n".join([f"listener {self._port} 127.0.0.1", "allow_anonymous true",
                                   "persistence false", "log_dest stdout", *self.extra]) + "\n")
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self._port), timeout=0.2).close()
                return self
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"mosquitto exited: {self.proc.stdout.read()}")
                time.sleep(0.05)
        raise RuntimeError("mosquitto did not start")

    def port(self, scheme: str = "mqtt") -> int:
        return self._port

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)
        self.dir.cleanup()


__all__ = ["V5", "V31", "V311", "Client", "MosqSub", "MosquittoProcess", "PacketTypes", "connect", "mosq_pub",
           "props", "sub_opts", "wait_until"]

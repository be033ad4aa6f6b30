"""Which requests the console repeats on another node (core/brokerd_client.py).

A node that dies in the middle of a request cannot be made to do so on cue,
so these use loopback sockets that behave as such a node would: one that
refuses connections (a closed port), one that reads the request and closes
without answering (died after receiving it), one that reads and never
answers (hung), and one that answers as brokerd does. tests/metrics/
test_failover.py shows the same client against a real three-node cluster.
"""

import json
import socket
import threading

import pytest

from core.brokerd_client import BrokerdClient, BrokerdInterrupted, BrokerdUnavailable, admin_nodes, admin_urls

from ..procs import free_port


class FakeNode:
    """A listening loopback socket; ``mode``: "answer" (200 JSON), "close" (read the
    request, close), "hang" (read it, say nothing). ``requests`` are the request lines read."""

    def __init__(self, mode: str):
        self.mode = mode
        self.requests: list[str] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        data = b""
        conn.settimeout(5)
        try:
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
        except OSError:
            return
        self.requests.append(data.split(b"\r\n", 1)[0].decode())
        if self.mode == "answer":
            body = json.dumps({"items": [], "node": self.url}).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n%s" % (len(body), body))
            conn.close()
        elif self.mode == "close":
            conn.close()
        else:
            self._held.append(conn)

    def close(self):
        self.sock.close()
        for c in self._held:
            c.close()


@pytest.fixture
def fakes():
    made = []

    def make(mode):
        node = FakeNode(mode)
        made.append(node)
        return node

    yield make
    for n in made:
        n.close()


def client(*urls, timeout=5.0) -> BrokerdClient:
    return BrokerdClient(base_url=",".join(urls), token="t", actor="console:test", timeout=timeout,
                         connect_timeout=1.0)


def test_a_refused_connection_moves_any_request_to_the_next_node(fakes):
    dead, alive = f"http://127.0.0.1:{free_port()}", fakes("answer")
    api = client(dead, alive.url)
    assert api.publish("acme", "a/b", "x")["node"] == alive.url
    assert api.kick("acme", "c1")["node"] == alive.url
    assert alive.requests == ["POST /api/v1/publish HTTP/1.1", "DELETE /api/v1/clients/acme/c1 HTTP/1.1"]
    # the node that answered is asked first from now on; the dead one only after it
    assert api.base_url == alive.url and api.endpoints.order()[-1] == dead


def test_a_read_cut_off_is_asked_again_elsewhere_a_write_is_not(fakes):
    dying, alive = fakes("close"), fakes("answer")
    assert client(dying.url, alive.url).clients()["items"] == []
    assert alive.requests == ["GET /api/v1/clients?page=1&per_page=50 HTTP/1.1"]
    dying2, alive2 = fakes("close"), fakes("answer")
    api = client(dying2.url, alive2.url)
    with pytest.raises(BrokerdInterrupted, match="may have been carried out"):
        api.publish("acme", "a/b", "x", qos=1)
    assert dying2.requests == ["POST /api/v1/publish HTTP/1.1"] and alive2.requests == []   # not sent twice
    # the next action (the user's, not a repeat) goes to the node that answers
    api.kick("acme", "c1")
    assert alive2.requests == ["DELETE /api/v1/clients/acme/c1 HTTP/1.1"]
    dying3, alive3 = fakes("close"), fakes("answer")
    with pytest.raises(BrokerdInterrupted):
        client(dying3.url, alive3.url).kick("acme", "c1")
    assert len(dying3.requests) == 1 and alive3.requests == []


def test_a_hung_node_times_out_and_a_read_goes_to_the_next(fakes):
    hung, alive = fakes("hang"), fakes("answer")
    assert client(hung.url, alive.url, timeout=0.5).metrics()["node"] == alive.url
    hung2, alive2 = fakes("hang"), fakes("answer")
    with pytest.raises(BrokerdInterrupted):
        client(hung2.url, alive2.url, timeout=0.5).delete_retained("acme", "a/b")
    assert alive2.requests == []


def test_no_node_answers(fakes):
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(3)]
    with pytest.raises(BrokerdUnavailable) as err:
        client(*urls).clients()
    assert all(u in err.value.message for u in urls)


def test_membership_teaches_the_other_nodes_and_forgets_them():
    nodes = admin_nodes(admin_urls(f"http://127.0.0.1:{free_port()}"))
    learned = nodes.learn([
        {"id": "n1", "health": "ok", "admin": nodes.configured[0].split("//")[1]},
        {"id": "n2", "health": "ok", "admin": "10.0.0.2:18083"},
        {"id": "n3", "health": "ok", "admin": "0.0.0.0:18083"},          # a wildcard bind: no one reaches it
        {"id": "n4", "health": "unreachable"},
        {"id": "n5", "health": "fenced", "admin": "10.0.0.5:18083"},
    ])
    assert learned == ["http://10.0.0.2:18083"]
    assert nodes.learn([{"id": "n1", "health": "ok", "admin": "10.0.0.1:18083"}]) == ["http://10.0.0.1:18083"]
    assert nodes.order()[0] == nodes.configured[0]


def test_the_setting_takes_a_list_and_the_old_single_value():
    assert admin_urls("http://a:1") == ["http://a:1"]
    assert admin_urls(" http://a:1/, http://b:2 ,,http://a:1") == ["http://a:1", "http://b:2"]
    with pytest.raises(ValueError, match="brokerd1:18083"):
        admin_urls("brokerd1:18083")

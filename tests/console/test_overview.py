"""The platform overview's node list: a host that runs ``brokerd --workers N``
is one row with its workers under it (issue 18: what a user sees stays one
node per host), a node without workers is a row of its own. brokerd's admin
API is a fake answering ``GET nodes`` as a cluster of one such host (one
worker not answering) and one single-process node would."""

import re

from core.brokerd_client import BrokerdClient, BrokerdError


def node(nid, host, worker, **figures):
    base = {"id": nid, "host": host, "worker": worker, "health": "ok", "uptime": 100, "admin": f"{nid}:18083",
            "listeners": ["mqtt://0.0.0.0:1883"], "connected": 0, "sessions": 0, "subscriptions": 0, "retained": 0,
            "messages_received": 0, "messages_sent": 0, "bytes_received": 0, "bytes_sent": 0}
    return {**base, **figures}


NODES = [
    node("solo", "solo", None, connected=7, sessions=7, retained=3),
    node("h1.1", "h1", 1, connected=20, sessions=21, subscriptions=5, retained=4, messages_received=1000),
    node("h1.0", "h1", 0, connected=10, sessions=11, subscriptions=2, retained=4, messages_received=500),
    {"id": "h1.2-1", "host": "h1", "worker": 2, "health": "unreachable"},      # a worker that does not answer
]


def fake_nodes(monkeypatch, nodes):
    def call(self, method, path, query=None, body=None):
        if method == "GET" and path == "nodes":
            return {"items": nodes}
        raise BrokerdError(404, "not faked")

    monkeypatch.setattr(BrokerdClient, "_call", call)


def rows(html: str) -> list[str]:
    """The node table's rows as text (tags dropped, whitespace squeezed)."""
    body = html[html.index("<tbody>"):html.index("</tbody>")]
    return [" ".join(re.sub(r"<[^>]+>", " ", r).split()) for r in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]


def test_workers_are_listed_under_their_host(monkeypatch, as_admin):
    fake_nodes(monkeypatch, NODES)
    html = as_admin.get("/overview/").content.decode()
    listed = rows(html)
    assert len(listed) == 5, listed                 # host h1, its 3 workers, solo
    h1, w0, w1, w2, solo = listed
    # the host: its workers' figures summed, retained messages (on every worker) counted once
    assert h1.startswith("h1 host · 3 workers degraded 2 of 3 ok 30 32 7 4 1,500"), h1
    assert w0.startswith("worker 0 h1.0 h1.0:18083 ok 10 11 2 4 500"), w0
    assert w1.startswith("worker 1 h1.1"), w1
    assert w2.startswith("worker 2 h1.2-1 unreachable"), w2
    assert solo.startswith("solo solo:18083 ok 7 7 0 3"), solo
    assert 'class="host-row" data-host="h1"' in html and html.count('class="worker-row"') == 3
    # the cards count hosts, not processes
    stat = " ".join(re.sub(r"<[^>]+>", " ", html[html.index("Nodes</div>"):html.index("Connections</div>")]).split())
    assert stat.startswith("Nodes 2 1 healthy · 3 worker processes"), stat


def test_without_workers_one_row_a_node(monkeypatch, as_admin):
    """An unreachable node (no host in its item: as a brokerd before --workers answers) is listed without
    figures (was: the page failed on its missing byte counts)."""
    fake_nodes(monkeypatch, [node("n2", "n2", None, connected=2), node("n1", "n1", None, connected=1),
                             {"id": "n3", "health": "unreachable"}])
    html = as_admin.get("/overview/").content.decode()
    listed = rows(html)
    assert [r.split()[0] for r in listed] == ["n1", "n2", "n3"]
    assert listed[2] == "n3 unreachable no figures (the node does not answer)"
    assert "host-row" not in html and "worker processes" not in html

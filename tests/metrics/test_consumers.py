"""The live metrics websockets, fed by the hub polling a real brokerd: who
may open which socket, and what each one carries."""

import collections
import time
from functools import partial

import pytest

from metrics.consumers import ANONYMOUS, FORBIDDEN, SENT_SOMETHING
from metrics.hub import get_hub

from .conftest import receive_until, run, socket

pytestmark = pytest.mark.django_db


def ok_update(msg):
    return msg.get("type") == "update" and msg.get("state") == "ok"


def test_administrator_gets_the_cluster_with_nodes_and_tenants(live, browsers, device):
    device("acme/d0")
    device("globex/g0")

    async def scenario():
        comm = socket("/ws/metrics/", browsers["root"])
        connected, _ = await comm.connect()
        assert connected
        hello = await comm.receive_json_from(timeout=5)
        assert hello["type"] == "hello" and hello["scope"] == "cluster"
        assert hello["fields"][:3] == ["t", "connections", "msgs_in"]
        update = await receive_until(comm, lambda m: ok_update(m) and m["totals"]["connections"] >= 2)
        await comm.disconnect()
        return update

    update = run(scenario)
    assert update["nodes_total"] == 1 and update["nodes_ok"] == 1
    (n,) = update["nodes"]
    assert n["node"] == "mx1" and n["health"] == "ok"
    assert n["host"] == "mx1" and n["worker"] is None         # one process: its own host (no --workers)
    assert n["memory_rss"] > 1_000_000 and n["uptime"] >= 0 and n["loop_lag"] is not None   # 0.0 in its first 50 ms
    assert set(n["rates"]) >= {"msgs_in", "msgs_out", "bytes_in", "bytes_out", "connects", "disconnects", "drops"}
    slugs = {t["slug"] for t in update["tenants"]}
    assert {"acme", "globex"} <= slugs
    assert len(update["point"]) == 7


def test_tenant_user_gets_only_its_tenant(live, browsers, device):
    device("acme/d0")
    device("acme/d1")
    device("globex/g0")

    async def scenario():
        comm = socket("/ws/metrics/tenants/acme/", browsers["alice"])
        connected, _ = await comm.connect()
        assert connected
        hello = await comm.receive_json_from(timeout=5)
        assert hello["type"] == "hello" and hello["scope"] == "tenant" and hello["tenant"] == "acme"
        update = await receive_until(comm, lambda m: ok_update(m) and m["totals"]["connections"] >= 2)
        await comm.disconnect()
        return update

    update = run(scenario)
    assert update["tenant"] == "acme" and update["totals"]["connections"] == 2
    # nothing about the cluster, its nodes or other tenants
    assert "nodes" not in update and "tenants" not in update
    assert "globex" not in str(update) and "mx1" not in str(update)


def test_tenant_user_refused_the_cluster_and_other_tenants(live, browsers):
    async def scenario():
        codes = {}
        for path in ("/ws/metrics/", "/ws/metrics/tenants/globex/", "/ws/metrics/tenants/no-such/"):
            comm = socket(path, browsers["alice"])
            connected, code = await comm.connect()
            assert not connected, path
            codes[path] = code
        return codes

    assert set(run(scenario).values()) == {FORBIDDEN}


def test_administrator_may_watch_any_tenant(live, browsers):
    async def scenario():
        comm = socket("/ws/metrics/tenants/globex/", browsers["root"])
        connected, _ = await comm.connect()
        hello = await comm.receive_json_from(timeout=5)
        update = await receive_until(comm, ok_update)
        await comm.disconnect()
        return connected, hello, update

    connected, hello, update = run(scenario)
    assert connected and hello["tenant"] == "globex" and update["tenant"] == "globex"


def test_anonymous_socket_refused(live, browsers):
    async def scenario():
        out = []
        for path in ("/ws/metrics/", "/ws/metrics/tenants/acme/"):
            comm = socket(path, browsers["anonymous"])
            out.append(await comm.connect())
        return out

    assert run(scenario) == [(False, ANONYMOUS), (False, ANONYMOUS)]
    assert not get_hub().watchers


def test_a_socket_that_sends_is_closed_and_stops_watching(live, browsers):
    """The sockets only listen: a message (here 512 KiB of JSON) closes the socket at once,
    undecoded, and it leaves its group -- sent faster than they were decoded, such messages
    were queued in the console's memory without bound."""
    async def scenario():
        comm = socket("/ws/metrics/tenants/acme/", browsers["alice"])
        connected, _ = await comm.connect()
        assert connected
        assert (await comm.receive_json_from(timeout=5))["type"] == "hello"
        await comm.send_to(text_data='{"pad": "' + "x" * (512 * 1024) + '"}')
        while True:
            out = await comm.receive_output(timeout=5)
            if out["type"] == "websocket.close":
                return out["code"], dict(get_hub().watchers)

    code, watchers = run(scenario)
    assert code == SENT_SOMETHING
    assert not any(watchers.values()), watchers


def test_foreign_origin_refused(live, browsers):
    async def scenario():
        comm = socket("/ws/metrics/", browsers["root"], origin="http://evil.example")
        return await comm.connect()

    connected, _ = run(scenario)
    assert not connected


def test_brokerd_down_streams_unreachable_and_keeps_trying(settings, browsers):
    """No admin API answers: the socket still opens and says so every poll."""
    settings.METRICS_POLL_INTERVAL = 0.2

    async def scenario():
        comm = socket("/ws/metrics/", browsers["root"])
        connected, _ = await comm.connect()
        await comm.receive_json_from(timeout=5)
        first = await receive_until(comm, lambda m: m.get("type") == "update")
        second = await receive_until(comm, lambda m: m.get("type") == "update")
        await comm.disconnect()
        return connected, first, second

    connected, first, second = run(scenario)
    assert connected
    assert first["state"] == second["state"] == "unreachable"
    assert "unreachable" in first["error"] and second["at"] > first["at"]
    assert get_hub().failures >= 2


async def hello_after_updates(watcher, until, path, browser) -> dict:
    """The hello of a socket on ``path`` opened after a cluster socket (``watcher``'s) saw 4 updates ``until``."""
    first = socket("/ws/metrics/", watcher)
    await first.connect()
    for _ in range(4):
        await receive_until(first, until)
    late = socket(path, browser)
    await late.connect()
    hello = await late.receive_json_from(timeout=5)
    await late.disconnect()
    await first.disconnect()
    return hello


def test_the_hello_carries_recent_points(live, browsers):
    """A socket opened later gets the last minutes of chart points at once."""
    hello = run(partial(hello_after_updates, browsers["root"], ok_update, "/ws/metrics/", browsers["root"]))
    assert len(hello["series"]) >= 4 and hello["latest"]["state"] == "ok"
    times = [p[0] for p in hello["series"]]
    assert times == sorted(times)


def test_a_tenant_page_opens_on_the_last_minutes_like_the_cluster_page(live, browsers, device):
    """The tenant's "last 5 minutes" charts started empty (points were kept only for tenants
    someone watched) while the cluster page filled the past minutes on load."""
    device("acme/d0")

    # the cluster's socket makes the hub poll; nobody watches acme
    hello = run(partial(hello_after_updates, browsers["root"], lambda m: ok_update(m) and m["totals"]["connections"] >= 1,
                        "/ws/metrics/tenants/acme/", browsers["alice"]))
    assert hello["scope"] == "tenant" and len(hello["series"]) >= 3
    assert all(p[1] >= 1 for p in hello["series"][-3:])          # acme's own connection count
    times = [p[0] for p in hello["series"]]
    assert times == sorted(times)


def test_hub_forgets_a_tenant_nobody_watched_for_a_while(monkeypatch):
    from metrics import hub as hub_module

    hub = get_hub()
    hub.watch("acme")
    hub.tenant_series["acme"].append([1.0, 0, 0, 0, 0, 0, 0])
    hub.unwatch("acme")
    hub._forget_unwatched()
    assert list(hub.tenant_series["acme"]) and not hub.watchers      # kept for a reload of the page
    monkeypatch.setattr(hub_module, "FORGET_AFTER", -1)
    hub._forget_unwatched()
    assert "acme" not in hub.tenant_series


def test_hub_forgets_a_busy_tenant_kept_unwatched_once_it_is_no_longer_fed(monkeypatch):
    from metrics import hub as hub_module

    hub = get_hub()
    hub.tenant_series["busy"] = collections.deque([[1.0, 3, 0, 0, 0, 0, 0]])
    hub._kept["busy"] = time.monotonic()
    hub._forget_unwatched()
    assert list(hub.tenant_series["busy"])
    monkeypatch.setattr(hub_module, "FORGET_AFTER", -1)
    hub._forget_unwatched()
    assert "busy" not in hub.tenant_series and "busy" not in hub._kept


def _revoke(how: str, people, tenants, browsers):
    from django.contrib.sessions.models import Session

    from tenants.models import Membership

    if how == "session gone":
        # ended without the console's sign-out (expired, then cleared): no signal tells the sockets
        Session.objects.filter(session_key=browsers["alice"].session.session_key).delete()
    elif how == "membership removed":
        Membership.objects.filter(user=people["alice"], tenant=tenants["acme"]).delete()
    elif how == "signed out":
        browsers["alice"].logout()          # the session is deleted, as by the console's sign-out
    elif how == "no longer staff":
        people["root"].is_staff = False
        people["root"].save(update_fields=["is_staff"])


@pytest.mark.parametrize(("how", "path", "who", "code", "recheck"), [
    ("membership removed", "/ws/metrics/tenants/acme/", "alice", FORBIDDEN, 3600.0),
    ("signed out", "/ws/metrics/tenants/acme/", "alice", ANONYMOUS, 3600.0),
    ("no longer staff", "/ws/metrics/", "root", FORBIDDEN, 3600.0),
    ("session gone", "/ws/metrics/tenants/acme/", "alice", ANONYMOUS, 0.0),
])
def test_a_socket_is_closed_once_its_user_loses_access(settings, monkeypatch, people, tenants, browsers,
                                                        django_capture_on_commit_callbacks,
                                                        how, path, who, code, recheck):
    """Access was checked only at the handshake: a member removed from a tenant, a
    user who signed out or an administrator no longer staff kept receiving the
    tenant's (or the cluster's) figures every second for as long as the page stayed open.
    Then it was checked again every 5 s (``RECHECK_EVERY``): figures went on for up to 5 s.
    What the console changes (the first three) closes the socket at once -- the periodic
    check set to an hour here; a session that just ended is found by the periodic check."""
    from channels.db import database_sync_to_async

    from metrics import consumers

    settings.METRICS_POLL_INTERVAL = 0.2
    monkeypatch.setattr(consumers, "RECHECK_EVERY", recheck, raising=False)

    def revoke():
        with django_capture_on_commit_callbacks(execute=True):      # (the test's transaction commits nothing)
            _revoke(how, people, tenants, browsers)

    async def scenario():
        comm = socket(path, browsers[who])
        connected, _ = await comm.connect()
        assert connected
        await comm.receive_json_from(timeout=5)                       # hello
        await receive_until(comm, lambda m: m.get("type") == "update")
        await database_sync_to_async(revoke)()
        deadline = time.monotonic() + 5
        updates = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"still open {how}: {updates} updates since")
            try:
                out = await comm.receive_output(timeout=left)
            except TimeoutError:
                raise AssertionError(f"still open {how}: {updates} updates since") from None
            if out["type"] == "websocket.close":
                return out, updates
            updates += 1

    closed, updates = run(scenario)
    assert closed["code"] == code
    assert updates <= 1          # at most the update already on its way when access went
    assert not get_hub().watchers


def test_a_console_change_does_not_wait_on_a_channel_layer_that_does_not_answer(settings, people, tenants, browsers,
                                                                                 django_capture_on_commit_callbacks,
                                                                                 caplog):
    """Each change that may take a socket's access away tells its user's sockets over the channel
    layer once committed (``metrics.signals``). With the layer's Redis not answering (hung, or
    its host unreachable) each of those sends waited for redis-py's 5 s timeout, one after
    another, in the request: a sign-out took 5 s, deleting a tenant with 4 members 20 s (one per
    membership), a user's deletion one per membership and one more. The change is made all the
    same (the periodic check closes the sockets); now the request waits 1 s at most for all of
    its sends, and tells each user once."""
    import socket as so

    from django.contrib.auth import get_user_model

    from tenants import services
    from tenants.models import Membership, Tenant

    hung = so.socket()              # accepts (the kernel does) and never answers
    hung.bind(("127.0.0.1", 0))
    hung.listen(64)
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": [f"redis://127.0.0.1:{hung.getsockname()[1]}/0"]}}}
    User = get_user_model()
    for name in ("carol", "dave", "erin"):
        Membership.objects.create(user=User.objects.create_user(name, password="x"), tenant=tenants["acme"])

    def timed(change) -> float:
        t0 = time.monotonic()
        with django_capture_on_commit_callbacks(execute=True):
            change()
        return time.monotonic() - t0

    try:
        waited = {
            "sign-out": timed(lambda: browsers["alice"].post("/logout/")),
            "tenant deleted": timed(lambda: services.delete_tenant(tenants["acme"])),
            "user deleted": timed(lambda: people["bob"].delete()),
        }
    finally:
        hung.close()
    assert not Tenant.objects.filter(slug="acme").exists() and not User.objects.filter(username="bob").exists()
    assert all(s < 2.5 for s in waited.values()), waited
    assert "not told of an access change" in caplog.text


def test_a_tenant_made_with_a_deleted_tenants_slug_opens_on_none_of_its_points(people, tenants):
    """The hub keeps a tenant's last minutes of points by slug (10 minutes after its last page closed,
    or while it is among the busiest): a tenant made with the slug of a deleted one opened its page on
    the deleted customer's connections and rates, and on its last update. Now only points from the
    moment the slug was given again."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from tenants import services
    from tenants.models import Membership

    hub = get_hub()
    hub.watch("acme")
    old = time.time() - 60
    for i in range(5):
        hub.tenant_series["acme"].append([old + i, 40, 900.0, 0, 0, 0, 0])
    hub.latest_tenant["acme"] = {"type": "update", "state": "ok", "at": old + 4, "tenant": "acme",
                                 "totals": {"connections": 40}}
    hub.unwatch("acme")                                  # its page closed: kept for a reload
    services.delete_tenant(tenants["acme"])
    again = services.create_tenant("acme", name="Another customer")
    assert again.usage_since is not None
    carol = get_user_model().objects.create_user("carol", password="correct-horse-battery-9")
    Membership.objects.create(user=carol, tenant=again, role=Membership.Role.ADMIN)
    browser = Client()
    browser.force_login(carol)

    async def scenario():
        comm = socket("/ws/metrics/tenants/acme/", browser)
        connected, _ = await comm.connect()
        assert connected
        hello = await comm.receive_json_from(timeout=5)
        await comm.disconnect()
        return hello

    hello = run(scenario)
    assert hello["tenant"] == "acme"
    assert [p for p in hello["series"] if p[1] == 40] == []
    assert hello["latest"] is None or hello["latest"]["at"] >= again.usage_since.timestamp()

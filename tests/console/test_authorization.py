"""Every named URL of the console, tried by everyone, in both tenants.

``TABLE`` has one entry per URL name (``test_every_url_has_an_entry`` fails
when a URL is added without one, or an entry outlives its URL). An entry
lists the requests to make (GET for pages, POST for actions, some both), how
to fill the URL's arguments from the objects of the ``world`` fixture, and
the *kind* of access the view intends (``core.roles``, ``tenants.access``):

- ``PUBLIC``: anyone, signed in or not;
- ``AUTHENTICATED``: any signed-in user, anonymous visitors go to the login page;
- ``PLATFORM``: platform administrators; tenant users 403. Under
  /tenants/<slug>/ too (edit, suspend, resume, delete): these views refuse
  before looking the tenant up, so a tenant user gets 403 for any slug --
  one that exists or not -- and learns nothing (a documented exception to
  "another tenant is a 404");
- ``TENANT_READ``: platform administrators and any member of *that* tenant;
  a non-member gets 404 (never 403, never data);
- ``TENANT_WRITE``: platform administrators and the tenant's administrators;
  its viewers 403, non-members 404 (confirmation pages of writes, GET, too);
- ``TENANT_ADMIN_READ``: like a write, for pages viewers may not even read
  (the tenant's audit log);
- ``TENANT_PLATFORM_WRITE``: a tenant page whose change only platform
  administrators make (the quota ceilings, $SYS settings): members 403,
  non-members 404;
- ``TOKEN``: the REST API (``console.api``), bearer tokens only: a browser
  session -- a platform administrator's too -- gets 401 and changes nothing
  (its own tests, tests/console/test_api.py, use tokens).

Every per-tenant request is made for acme (alice administers it) and globex
(bob reads it) by root, alice, bob and an anonymous visitor. Allowed: the
view's own answer (200, a redirect that is not to the login page, 204 for a
finished report's status) and, for a POST that writes, a changed database.
Refused: exactly 403, 404 or the login redirect, the database unchanged (every
row of the console's tables, audit log included) and not one call to brokerd's
admin API (brokerd's fake here records them and is "down").
"""

import datetime as dt
from dataclasses import dataclass, field

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test import Client, override_settings
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone

from console.models import ApiToken
from core.brokerd_client import BrokerdClient, BrokerdUnavailable
from metrics.models import Alarm
from spark_reports.models import ReportRun, ReportSchedule
from tenants import rules as rule_services
from tenants import services
from tenants.models import Membership

from ..reports.conftest import sample_result
from .conftest import PASSWORD, _client, make_acme, make_globex, make_people

FAST_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]      # (as conftest's brokerd_down sets them)

PUBLIC = "public"
AUTHENTICATED = "authenticated"
PLATFORM = "platform"
TENANT_READ = "tenant read"
TENANT_WRITE = "tenant write"
TENANT_ADMIN_READ = "tenant-admin read"
TENANT_PLATFORM_WRITE = "tenant, platform write"

TOKEN = "bearer token"
TENANT_KINDS = {TENANT_READ, TENANT_WRITE, TENANT_ADMIN_READ, TENANT_PLATFORM_WRITE}
USERS = ("admin", "alice", "bob", "anonymous")
# the roles of the conftest's people: alice administers acme, bob views globex
ROLES = {("alice", "acme"): "admin", ("bob", "globex"): "viewer"}


@dataclass
class Try:
    method: str
    kind: str
    data: dict = field(default_factory=dict)
    query: str = ""
    # allowed answers; a POST is also expected to change the database unless ``writes`` is False
    ok: tuple = (200,)
    writes: bool = True
    # URL kwargs: name -> key of the ``world`` objects of the tenant (or of the platform)
    args: dict = field(default_factory=dict)


def get(kind, **kw):
    kw.setdefault("ok", (200,))
    return Try("GET", kind, **kw)


def post(kind, data=None, **kw):
    kw.setdefault("ok", (302,))
    return Try("POST", kind, data or {}, **kw)


DEV = {"name": "device"}
CRED = {"name": "device", "credential_id": "credential"}
RULE = {"rule_id": "rule"}
MEMBER = {"membership_id": "member"}
PRULE = {"rule_id": "prule"}             # a rule of the rule engine (enabled)
PRULE_OFF = {"rule_id": "prule_off"}     # and a disabled one
RULE_FORM = {"sql": 'SELECT clientid FROM "a/#"', "topic": "b/out", "qos": "0"}  # data is str.format()ted
CLIENT = {"client_id": "client"}
RUN = {"run_id": "run"}
FAILED = {"run_id": "failed_run"}
SCHEDULE = {"schedule_id": "schedule"}
# brokerd is down: live writes answer with the page and its banner (or go back to it)
LIVE_WRITE = {"ok": (200,), "writes": False}

class CsvUpload:
    """A file for a form (the test client reads it with ``read()``), the same at every try."""

    name = "devices.csv"

    def read(self) -> bytes:
        return b"name\nimported-1\n"


TABLE: dict[str, list[Try]] = {
    # ------------------------------------------------------------ sign-in, home
    "healthz": [get(PUBLIC)],
    "favicon": [get(PUBLIC, ok=(301,))],
    "login": [get(PUBLIC, ok=(200, 302))],              # signed in: on to the home page
    "logout": [post(PUBLIC, writes=False)],             # Django 5: POST only; anonymous too goes to the login page
    "password_change": [get(AUTHENTICATED),
                        post(AUTHENTICATED, {"old_password": PASSWORD, "new_password1": "An0ther-l0ng-pass",
                                             "new_password2": "An0ther-l0ng-pass"})],
    "home": [get(AUTHENTICATED, ok=(200, 302))],        # tenant users: on to their tenant
    "overview": [get(PLATFORM)],
    "tenant_list": [get(AUTHENTICATED)],                # each sees her own tenants (test_access)
    "tenant_create": [get(PLATFORM), post(PLATFORM, {"slug": "initech", "default_acl": "deny"})],
    # ------------------------------------------------------------ the REST API (bearer tokens, never a session)
    "api_openapi": [get(PUBLIC)],
    "api_rules": [get(TOKEN), post(TOKEN, {"sql": 'SELECT * FROM "a"', "action": "store"})],
    "api_rule_test": [post(TOKEN, {"sql": 'SELECT * FROM "a"', "topic": "a"})],
    "api_rule": [get(TOKEN, args=PRULE)],          # DELETE: tests/console/test_api.py (the table tries GET, POST)
    "api_rule_enable": [post(TOKEN, args=PRULE_OFF)],
    "api_rule_disable": [post(TOKEN, args=PRULE)],
    # ------------------------------------------------------------ the tenant itself
    "tenant": [get(TENANT_READ)],
    "tenant_edit": [get(PLATFORM), post(PLATFORM, {"name": "Renamed", "default_acl": "allow"})],
    "tenant_suspend": [post(PLATFORM)],
    "tenant_resume": [post(PLATFORM)],
    "tenant_delete": [get(PLATFORM), post(PLATFORM, {"confirm": "{slug}"})],
    # ------------------------------------------------------------ devices, credentials
    "devices": [get(TENANT_READ)],
    "device_create": [get(TENANT_WRITE), post(TENANT_WRITE, {"name": "new-device"})],
    # the answer is the secrets' file itself (200)
    "device_import": [get(TENANT_WRITE), post(TENANT_WRITE, {"file": CsvUpload()}, ok=(200,))],
    "device": [get(TENANT_READ, args=DEV)],
    "device_edit": [get(TENANT_WRITE, args=DEV), post(TENANT_WRITE, {"description": "moved"}, args=DEV)],
    "device_enable": [post(TENANT_WRITE, args=DEV)],
    "device_disable": [post(TENANT_WRITE, args=DEV)],
    "device_delete": [get(TENANT_WRITE, args=DEV), post(TENANT_WRITE, args=DEV)],
    # the new secret is shown on a page (200), not behind a redirect
    "credential_create": [get(TENANT_WRITE, args=DEV), post(TENANT_WRITE, {"label": "spare"}, args=DEV, ok=(200,))],
    "credential_rotate": [get(TENANT_WRITE, args=CRED), post(TENANT_WRITE, args=CRED, ok=(200,))],
    "credential_enable": [post(TENANT_WRITE, args=CRED)],
    "credential_disable": [post(TENANT_WRITE, args=CRED)],
    "credential_expire": [get(TENANT_WRITE, args=CRED), post(TENANT_WRITE, {"when": "now"}, args=CRED)],
    "credential_delete": [get(TENANT_WRITE, args=CRED), post(TENANT_WRITE, args=CRED)],
    # ------------------------------------------------------------ ACL rules
    "acl": [get(TENANT_READ)],
    "acl_add": [post(TENANT_WRITE, {"who": "all", "action": "both", "topic": "x/#", "allow": "allow"})],
    "acl_check": [get(TENANT_READ, query="device=d&action=publish&topic=a/b")],
    "acl_own_topics": [post(TENANT_WRITE, {"next": "/"})],
    "acl_edit": [get(TENANT_WRITE, args=RULE),
                 post(TENANT_WRITE, {"who": "all", "action": "subscribe", "topic": "y/#", "allow": "deny"},
                      args=RULE)],
    "acl_move": [post(TENANT_WRITE, {"direction": "down"}, args=RULE)],
    "acl_delete": [get(TENANT_WRITE, args=RULE), post(TENANT_WRITE, args=RULE)],
    # ------------------------------------------------------------ rules (rule engine)
    "rules": [get(TENANT_READ)],
    "rules_table": [get(TENANT_READ)],
    "rule_add": [post(TENANT_WRITE, RULE_FORM)],
    "rule_test": [post(TENANT_READ, {"sql": 'SELECT * FROM "a/#"', "test_topic": "a/b", "test_payload": "x"},
                       ok=(200,), writes=False)],
    "rule_edit": [get(TENANT_WRITE, args=PRULE), post(TENANT_WRITE, RULE_FORM, args=PRULE)],
    "rule_enable": [post(TENANT_WRITE, args=PRULE_OFF)],
    "rule_disable": [post(TENANT_WRITE, args=PRULE)],
    "rule_delete": [get(TENANT_WRITE, args=PRULE), post(TENANT_WRITE, args=PRULE)],
    # ------------------------------------------------------------ limits, settings, members, audit
    "quotas": [get(TENANT_READ),
               post(TENANT_WRITE, {"which": "own", "own-max_connections": "3"}),
               post(TENANT_PLATFORM_WRITE, {"which": "ceiling", "ceiling-max_connections": "7"})],
    "system_topics": [get(TENANT_READ), post(TENANT_PLATFORM_WRITE, {"enabled": "on", "interval": "5"})],
    "members": [get(TENANT_READ),
                post(TENANT_WRITE, {"username": "newcomer", "password": "a-Long-passw0rd-9", "role": "viewer"})],
    "member_role": [post(TENANT_WRITE, {"role": "admin"}, args=MEMBER)],
    "member_remove": [get(TENANT_WRITE, args=MEMBER), post(TENANT_WRITE, args=MEMBER)],
    "tenant_audit": [get(TENANT_ADMIN_READ)],
    # ------------------------------------------------------------ live (brokerd down)
    "tenant_clients": [get(TENANT_READ)],
    "client_detail": [get(TENANT_READ, args=CLIENT)],
    "client_kick": [get(TENANT_WRITE, args=CLIENT), post(TENANT_WRITE, args=CLIENT, **LIVE_WRITE)],
    "client_subscribe": [post(TENANT_WRITE, {"filter": "a/#", "qos": "1"}, args=CLIENT, **LIVE_WRITE)],
    "client_unsubscribe": [post(TENANT_WRITE, {"filter": "a/#"}, args=CLIENT, ok=(302,), writes=False)],
    "retained": [get(TENANT_READ)],
    "retained_message": [get(TENANT_READ, query="topic=a/b")],
    "retained_delete": [get(TENANT_WRITE, query="topic=a/b"), post(TENANT_WRITE, {"topic": "a/b"}, **LIVE_WRITE)],
    # the form is a page members may open; sending it is a write
    "publish": [get(TENANT_READ), post(TENANT_WRITE, {"topic": "a/b", "payload": "hi", "qos": "0"}, **LIVE_WRITE)],
    "tenant_metrics": [get(TENANT_READ)],
    "tenant_metrics_history": [get(TENANT_READ), get(TENANT_READ, query="format=json&range=24h")],
    # ------------------------------------------------------------ tenant reports
    "reports": [get(TENANT_READ), post(TENANT_WRITE, {"preset": "last_7"})],
    "report": [get(TENANT_READ, args=RUN)],
    "report_status": [get(TENANT_READ, args=RUN, ok=(204,))],   # done: the page reloads itself
    "report_csv": [get(TENANT_READ, args=RUN)],
    "report_print": [get(TENANT_READ, args=RUN)],
    "report_retry": [post(TENANT_WRITE, args=FAILED)],
    "report_schedules": [get(TENANT_READ),
                         post(TENANT_WRITE, {"frequency": "daily", "hour": "7", "recipients": "{contact}",
                                             "enabled": "on"})],
    "report_schedule_edit": [get(TENANT_WRITE, args=SCHEDULE),
                             post(TENANT_WRITE, {"frequency": "monthly", "hour": "3", "recipients": "{contact}"},
                                  args=SCHEDULE)],
    "report_schedule_send": [post(TENANT_WRITE, args=SCHEDULE)],
    "report_schedule_toggle": [post(TENANT_WRITE, args=SCHEDULE)],
    "report_schedule_delete": [get(TENANT_WRITE, args=SCHEDULE), post(TENANT_WRITE, args=SCHEDULE)],
    # ------------------------------------------------------------ platform pages
    "clients": [get(PLATFORM)],
    "metrics": [get(PLATFORM)],
    "metrics_history": [get(PLATFORM), get(PLATFORM, query="format=json&node=n1")],
    "metrics_node": [get(PLATFORM, args={"node": "node"})],
    "alarms": [get(PLATFORM)],
    "alarm_dismiss": [post(PLATFORM, args={"alarm_id": "alarm"})],
    "platform_reports": [get(PLATFORM), post(PLATFORM, {"preset": "last_7"})],
    "platform_report": [get(PLATFORM, args=RUN)],
    "platform_report_status": [get(PLATFORM, args=RUN, ok=(204,))],
    "platform_report_csv": [get(PLATFORM, args=RUN)],
    "platform_report_print": [get(PLATFORM, args=RUN)],
    "platform_report_retry": [post(PLATFORM, args=FAILED)],
    "audit": [get(PLATFORM)],
    "token_list": [get(PLATFORM)],
    "token_create": [get(PLATFORM), post(PLATFORM, {"name": "deploy", "scope": "write"}, ok=(200,))],
    "token_revoke": [get(PLATFORM, args={"token_id": "token"}), post(PLATFORM, args={"token_id": "token"})],
}

# platform pages under /tenants/<slug>/: tried in both tenants too
TENANT_SCOPED_PLATFORM = {"tenant_edit", "tenant_suspend", "tenant_resume", "tenant_delete"}
TENANT_SCOPED_TOKEN = {"api_rules", "api_rule_test", "api_rule", "api_rule_enable", "api_rule_disable"}
# URL names with a slug whose kind is not a tenant kind (tried in both tenants all the same)
TENANT_SCOPED = TENANT_SCOPED_PLATFORM | TENANT_SCOPED_TOKEN


def _url_names(resolver=None, prefix=""):
    """Every URL name of the site, and the patterns that have none."""
    names, unnamed = [], []
    for p in (resolver or get_resolver()).url_patterns:
        if isinstance(p, URLResolver):
            n, u = _url_names(p, prefix + str(p.pattern))
            names += [f"{p.namespace}:{x}" if p.namespace else x for x in n]
            unnamed += u
        elif isinstance(p, URLPattern):
            (names if p.name else unnamed).append(p.name or prefix + str(p.pattern))
    return names, unnamed


def test_every_url_has_an_entry():
    names, unnamed = _url_names()
    assert not unnamed, f"URLs without a name cannot be in TABLE: {unnamed}"
    assert len(names) == len(set(names)), "two URLs share a name"
    missing = sorted(set(names) - set(TABLE))
    assert not missing, f"URL names without an entry in TABLE (say who may use them): {missing}"
    stale = sorted(set(TABLE) - set(names))
    assert not stale, f"entries of TABLE whose URL is gone: {stale}"


def test_every_entry_is_well_formed():
    kinds = {PUBLIC, AUTHENTICATED, PLATFORM, TOKEN, *TENANT_KINDS}
    for name, tries in TABLE.items():
        assert tries, name
        for t in tries:
            assert t.kind in kinds and t.method in ("GET", "POST"), name


# ---------------------------------------------------------------- the people's world


@pytest.fixture
def brokerd_calls(monkeypatch):
    """brokerd's admin API, down, recording what the views asked of it."""
    calls = []

    def call(self, method, path, query=None, body=None):
        calls.append((method, path))
        raise BrokerdUnavailable("brokerd admin API unreachable (test)")

    monkeypatch.setattr(BrokerdClient, "_call", call)
    return calls


@pytest.fixture(scope="module")
def people_and_world(django_db_setup, django_db_blocker):
    """The tenants, people and ``build_world``'s objects, made once for the module inside a
    transaction rolled back at its end (nothing of it outlives the module); each test runs in a
    savepoint of it (pytest-django's ``db``), rolled back after the test, and each request in one
    of its own: every request still meets the same world. (Made per test, they were most of the
    file's time: each service call rebuilds a policy snapshot.) -> ({name: user}, world)."""
    with django_db_blocker.unblock(), override_settings(PASSWORD_HASHERS=FAST_HASHERS), transaction.atomic():
        acme, globex = make_acme(), make_globex()
        people = make_people(acme, globex)
        world = build_world(acme, globex)
        yield people, world
        transaction.set_rollback(True)


@pytest.fixture
def world(db, people_and_world):
    """The objects the URLs name, one of each per tenant, and the platform's."""
    return people_and_world[1]


@pytest.fixture
def clients(db, people_and_world):
    """{"admin": Client, "alice": Client, "bob": Client, "anonymous": Client}, logged in (per test)."""
    out = {name: _client(user) for name, user in people_and_world[0].items()}
    out["anonymous"] = Client()
    return out


def build_world(acme, globex) -> dict:
    """{slug: {name: object id or name}, None: the platform's} (also tests/console/test_escaping)."""
    ops = {"acme": ["ops@acme.test"], "globex": ["noc@globex.test"]}
    out = {}
    for tenant in (acme, globex):
        services.update_tenant(tenant, name=tenant.name, contact_emails=ops[tenant.slug],
                               default_acl=tenant.default_acl)
        if tenant.acl_rules.count() < 2:
            services.add_acl_rule(tenant, topic="extra/#", action="both", allow=True)
        prule = rule_services.add_rule(tenant, sql='SELECT * FROM "x/#"', action="republish",
                                       config={"topic": "y/${clientid}"}, actor="test")
        prule_off = rule_services.add_rule(tenant, sql='SELECT * FROM "x/#"', action="republish",
                                           config={"topic": "z/${clientid}"}, enabled=False, actor="test")
        other = get_user_model().objects.create_user(f"member-of-{tenant.slug}", password=PASSWORD)
        member = Membership.objects.create(user=other, tenant=tenant, role=Membership.Role.VIEWER)
        device = tenant.test_credential.device
        run = ReportRun.objects.create(
            kind="tenant", tenant=tenant, status="succeeded", period_start=dt.datetime(2026, 3, 2, tzinfo=dt.UTC),
            period_end=dt.datetime(2026, 3, 9, tzinfo=dt.UTC), result=sample_result("tenant", tenant.slug))
        failed = ReportRun.objects.create(
            kind="tenant", tenant=tenant, status="failed", error="boom",
            period_start=dt.datetime(2026, 3, 2, tzinfo=dt.UTC), period_end=dt.datetime(2026, 3, 9, tzinfo=dt.UTC))
        schedule = ReportSchedule.objects.create(tenant=tenant, frequency="weekly", hour=6, recipients=ops[tenant.slug])
        out[tenant.slug] = {"slug": tenant.slug, "device": device.name, "credential": tenant.test_credential.pk,
                            "rule": tenant.acl_rules.order_by("position").first().pk, "member": member.pk,
                            "prule": prule.pk, "prule_off": prule_off.pk,
                            "client": "dev/1~x", "run": run.pk, "failed_run": failed.pk, "schedule": schedule.pk,
                            "contact": ops[tenant.slug][0]}
    run = ReportRun.objects.create(
        kind="platform", status="succeeded", period_start=dt.datetime(2026, 3, 2, tzinfo=dt.UTC),
        period_end=dt.datetime(2026, 3, 9, tzinfo=dt.UTC), result=sample_result("platform", None))
    failed = ReportRun.objects.create(
        kind="platform", status="failed", error="boom", period_start=dt.datetime(2026, 3, 2, tzinfo=dt.UTC),
        period_end=dt.datetime(2026, 3, 9, tzinfo=dt.UTC))
    alarm = Alarm.objects.create(kind="node_down", subject="n9", message="node n9 is down",
                                 raised_at=timezone.now())
    token, _ = ApiToken.issue("grafana", "read")
    out[None] = {"run": run.pk, "failed_run": failed.pk, "alarm": alarm.pk, "token": token.pk, "node": "n1"}
    return out


SKIPPED_TABLES = {"sessions.Session", "contenttypes.ContentType", "auth.Permission"}


def _snapshot_queries() -> list[tuple[str, str]]:
    """(model label, SELECT of every column of its table but auth.User's last_login, by primary key)."""
    qn = connection.ops.quote_name
    out = []
    for model in apps.get_models():
        label = model._meta.label
        if label in SKIPPED_TABLES:
            continue
        columns = [f.column for f in model._meta.concrete_fields
                   if not (label == "auth.User" and f.name == "last_login")]
        out.append((label, f"SELECT {', '.join(map(qn, columns))} FROM {qn(model._meta.db_table)} "
                           f"ORDER BY {qn(model._meta.pk.column)}"))
    return out


def snapshot() -> dict:
    """Every row of the site's tables (users without their last login), as the database has them:
    plain SQL, not the ORM's querysets (two snapshots a request were two thirds of the file's time)."""
    with connection.cursor() as cursor:
        out = {}
        for label, sql in _snapshot_queries():
            cursor.execute(sql)
            out[label] = cursor.fetchall()
        return out


def expected(kind: str, who: str, slug: str | None) -> str | int:
    """"ok", 403, 404 or "login"."""
    if kind == PUBLIC:
        return "ok"
    if kind == TOKEN:
        return 401
    if who == "anonymous":
        return "login"
    if who == "admin" or kind == AUTHENTICATED:
        return "ok"
    if kind == PLATFORM:
        return 403
    role = ROLES.get((who, slug))
    if role is None:
        return 404
    if kind == TENANT_READ or (role == "admin" and kind in (TENANT_WRITE, TENANT_ADMIN_READ)):
        return "ok"
    return 403


def _cases():
    for name, tries in TABLE.items():
        for i, t in enumerate(tries):
            yield pytest.param(name, i, id=f"{name}-{t.method}{i}")


def _fill(value, objects: dict):
    return value.format(**objects) if isinstance(value, str) else value


def _try(t: Try, name: str, slug: str | None, who: str, client, world, brokerd_calls) -> str | None:
    """One request; what was wrong with its answer, or None."""
    objects = {**world[None], **(world[slug] if slug else {})}
    kwargs = {k: objects[v] for k, v in t.args.items()}
    if slug:
        kwargs = {"slug": slug, **kwargs}
    url = reverse(name, kwargs=kwargs) + (f"?{t.query}" if t.query else "")
    data = {k: _fill(v, objects) for k, v in t.data.items()}
    del brokerd_calls[:]
    before = snapshot()
    response = client.get(url) if t.method == "GET" else client.post(url, data)
    status, where = response.status_code, response.get("Location", "")
    want = expected(t.kind, who, slug)
    said = f"{who} {t.method} {url} ({t.kind}) -> {status} {where}"
    if want == "ok":
        if status not in t.ok:
            return f"{said}: expected {t.ok}"
        if where.startswith(reverse("login")) and name != "logout":
            return f"{said}: sent to the login page"
        if t.method == "POST" and t.writes and snapshot() == before:
            return f"{said}: allowed, yet changed nothing (the table's data no longer does the action?)"
        return None
    if want == "login":
        if not (status == 302 and where.startswith(reverse("login") + "?next=")):
            return f"{said}: expected the login page"
    elif status != want:
        return f"{said}: expected {want}"
    if snapshot() != before:
        return f"{said}: refused, yet changed the database"
    if brokerd_calls:
        return f"{said}: refused, yet asked brokerd {brokerd_calls}"
    return None


@pytest.mark.parametrize(("name", "index"), list(_cases()))
def test_access(clients, world, brokerd_calls, name, index):
    """The entry's request by root, alice, bob and anonymous -- in acme and in
    globex for the tenant pages -- each in a savepoint rolled back after it,
    so every one of them meets the same world."""
    t = TABLE[name][index]
    tenant_scoped = t.kind in TENANT_KINDS or name in TENANT_SCOPED
    wrong = []
    for slug in ("acme", "globex") if tenant_scoped else (None,):
        for who in USERS:
            with transaction.atomic():
                problem = _try(t, name, slug, who, clients[who], world, brokerd_calls)
                transaction.set_rollback(True)
            if problem:
                wrong.append(problem)
    assert not wrong, "\n".join(wrong)


# ---------------------------------------------------------------- websockets (metrics.routing)

# route -> kind; the consumer closes refused sockets before the handshake completes (4401 anonymous,
# 4403 otherwise -- also for a tenant that does not exist, so the code tells nothing either)
WEBSOCKETS = {
    r"^ws/metrics/$": PLATFORM,
    r"^ws/metrics/tenants/(?P<slug>[a-z0-9-]{1,63})/$": TENANT_READ,
}


def test_every_websocket_route_has_an_entry():
    from metrics.routing import websocket_urlpatterns

    routes = {str(p.pattern) for p in websocket_urlpatterns}
    assert routes == set(WEBSOCKETS), f"routes without an entry: {routes - set(WEBSOCKETS)}; " \
                                      f"entries without a route: {set(WEBSOCKETS) - routes}"


@pytest.mark.parametrize("route", list(WEBSOCKETS))
def test_websocket_access(db, people_and_world, route):
    """``metrics.consumers.may_watch``, what the consumer asks before accepting
    (tests/metrics/test_consumers opens real sockets)."""
    from django.contrib.auth.models import AnonymousUser

    from metrics.consumers import may_watch

    kind = WEBSOCKETS[route]
    users = {**people_and_world[0], "anonymous": AnonymousUser()}
    wrong = []
    for slug in ("acme", "globex") if kind in TENANT_KINDS else (None,):
        for who in USERS:
            allowed = may_watch(users[who], slug)
            if allowed != (expected(kind, who, slug) == "ok"):
                wrong.append(f"{who} on {route} ({slug}): {'allowed' if allowed else 'refused'}")
    if kind in TENANT_KINDS:
        wrong += [f"{who}: a tenant that does not exist" for who in ("alice", "bob", "anonymous")
                  if may_watch(users[who], "no-such-tenant")]
    assert not wrong, wrong

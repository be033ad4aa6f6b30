"""The models issue 17 moved between apps keep their tables and rows.

``AuditEvent`` went from ``console`` to ``core`` and ``Membership`` from
``console`` to ``tenants``; their tables keep the names brokerd and existing
databases know (``console_auditevent``, ``console_membership``). A database
made by the code before the move -- the migrations as they stood then
(``OLD``: console 0002, tenants 0003, ...), with rows in both tables and the
content types and permissions Django had made for them under ``console`` --
is brought up to date by a plain ``manage.py migrate``: the same rows, read
through the models' new homes, the content types (and the permissions on
them) moved along, no table made or dropped. And back: migrating to ``OLD``
again gives the old code its database as it was. On SQLite and PostgreSQL.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .. import manage_zygote
from ..procs import free_port

ROOT = Path(__file__).resolve().parents[2]

# every app's last migration before the move (what main had when issue 17 began)
OLD = {"console": "0002_login_failure", "tenants": "0003_own_quota", "metrics": "0002_alarm",
       "spark_reports": "0001_initial"}

# the old code's database: migrated to OLD (Django's own apps to their last migration), then the
# content types and permissions its post_migrate made, and rows in the two tables that move
MAKE_OLD = """
import json, sys
import django
django.setup()
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

OLD = json.loads(sys.argv[1])
executor = MigrationExecutor(connection)
graph = executor.loader.graph
targets = [(app, name) for app, name in OLD.items()]
targets += [leaf for leaf in graph.leaf_nodes() if leaf[0] not in OLD and leaf[0] != "core"]
executor.migrate(targets)
apps = MigrationExecutor(connection).loader.project_state(targets).apps
ContentType = apps.get_model("contenttypes", "ContentType")
Permission = apps.get_model("auth", "Permission")
for model, verbose in (("auditevent", "audit event"), ("membership", "membership")):
    ct = ContentType.objects.create(app_label="console", model=model)
    for action in ("add", "change", "delete", "view"):
        Permission.objects.create(content_type=ct, codename=f"{action}_{model}", name=f"Can {action} {verbose}")
User = apps.get_model("auth", "User")
Tenant = apps.get_model("tenants", "Tenant")
alice = User.objects.create(username="alice", email="alice@example.test", password="!")
bob = User.objects.create(username="bob", password="!")
acme = Tenant.objects.create(slug="acme", name="Acme", contact_emails=["ops@acme.test"])
apps.get_model("console", "Membership").objects.create(user=alice, tenant=acme, role="admin")
apps.get_model("console", "Membership").objects.create(user=bob, tenant=acme, role="viewer")
bob.user_permissions.add(Permission.objects.get(codename="view_auditevent"))
from django.utils import timezone
AuditEvent = apps.get_model("console", "AuditEvent")
AuditEvent.objects.create(at=timezone.now(), actor="alice", source="console", action="device.create",
                          object_type="device", object_id="pump-7", tenant="acme", after='{"name": "pump-7"}',
                          remote_addr="127.0.0.1")
AuditEvent.objects.create(at=timezone.now(), actor="console:alice (via api-token:ops)", source="api",
                          action="client.kick", object_type="client", object_id="c1", tenant="acme")
"""

# what the new code reads through the models' new homes
READ_NEW = """
import json
import django
django.setup()
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from core.models import AuditEvent
from tenants.models import Membership
print(json.dumps({
    "members": sorted([m.user.username, m.tenant.slug, m.role] for m in Membership.objects.all()),
    "events": sorted([e.actor, e.source, e.action, e.object_id, e.tenant, e.after] for e in AuditEvent.objects.all()),
    "content_types": sorted([c.app_label, c.model] for c in ContentType.objects.filter(
        model__in=["auditevent", "membership"])),
    "bob_may": sorted(f"{p.content_type.app_label}.{p.codename}" for p in User.objects.get(
        username="bob").user_permissions.all()),
    "permissions": Permission.objects.filter(content_type__model__in=["auditevent", "membership"]).count(),
}))
"""

# the rows as the old code (and brokerd) see them: plain SQL on the old table names
READ_TABLES = """
import json
import django
django.setup()
from django.db import connection
with connection.cursor() as cur:
    cur.execute("SELECT u.username, t.slug, m.role FROM console_membership m JOIN auth_user u ON u.id = m.user_id "
                "JOIN tenants_tenant t ON t.id = m.tenant_id")
    members = sorted(list(r) for r in cur.fetchall())
    cur.execute("SELECT actor, source, action, object_id, tenant, after FROM console_auditevent")
    events = sorted(list(r) for r in cur.fetchall())
    cur.execute("SELECT app_label, model FROM django_content_type WHERE model IN ('auditevent', 'membership')")
    content_types = sorted(list(r) for r in cur.fetchall())
tables = sorted(t for t in connection.introspection.table_names()
                if t.endswith(("_auditevent", "_membership")))
print(json.dumps({"members": members, "events": events, "content_types": content_types, "tables": tables}))
"""

MEMBERS = [["alice", "acme", "admin"], ["bob", "acme", "viewer"]]
EVENTS = [["alice", "console", "device.create", "pump-7", "acme", '{"name": "pump-7"}'],
          ["console:alice (via api-token:ops)", "api", "client.kick", "c1", "acme", None]]
TABLES = ["console_auditevent", "console_membership"]


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/console.sqlite3"
    return request.getfixturevalue("postgres_db")


@pytest.fixture
def env(database_url, tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "DEBUG", "PRODUCTION", "DJANGO_SETTINGS_MODULE")}
    env.update(DATABASE_URL=database_url, VAR_DIR=str(tmp_path), BROKERD_ADMIN_TOKEN="unused",
               BROKERD_ADMIN_URL=f"http://127.0.0.1:{free_port()}", METRICS_HUB="false",
               DJANGO_SETTINGS_MODULE="console.settings", PYTHONPATH=str(ROOT))
    return env


def run(env, *args) -> str:
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def manage(env, *args) -> str:
    """``python manage.py ARGS`` (forked from tests.manage_zygote: the libraries' imports done once)."""
    proc = manage_zygote.run(args, env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def script(env, code: str, *args):
    return json.loads(run(env, "-c", code, *args).strip().splitlines()[-1])


def test_migrate_from_the_old_code_keeps_the_moved_rows(env):
    run(env, "-c", MAKE_OLD, json.dumps(OLD))
    before = script(env, READ_TABLES)
    assert (before["members"], before["events"], before["tables"]) == (MEMBERS, EVENTS, TABLES)
    assert before["content_types"] == [["console", "auditevent"], ["console", "membership"]]

    out = manage(env, "migrate", "--noinput")
    assert "console.0003_auditevent_to_core... OK" in out and "tenants.0004_membership... OK" in out

    after = script(env, READ_NEW)
    assert after["members"] == MEMBERS and after["events"] == EVENTS
    assert after["content_types"] == [["core", "auditevent"], ["tenants", "membership"]]
    assert after["bob_may"] == ["core.view_auditevent"] and after["permissions"] == 8
    tables = script(env, READ_TABLES)
    assert (tables["members"], tables["events"], tables["tables"]) == (MEMBERS, EVENTS, TABLES)

    # and back, for the old code: the state moves back, the rows stay where they always were
    manage(env, "migrate", "--noinput", "console", OLD["console"])
    back = script(env, READ_TABLES)
    assert (back["members"], back["events"], back["tables"]) == (MEMBERS, EVENTS, TABLES)
    assert back["content_types"] == [["console", "auditevent"], ["console", "membership"]]


def test_a_new_database_gets_the_tables_under_their_old_names(env):
    manage(env, "migrate", "--noinput")
    assert script(env, READ_TABLES)["tables"] == TABLES
    assert "No changes detected" in manage(env, "makemigrations", "--check", "--dry-run")

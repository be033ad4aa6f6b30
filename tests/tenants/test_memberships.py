"""Members of a tenant (tenants.memberships): a tenant that has an
administrator keeps one, checked under the tenant's row lock."""

import pytest
from django.contrib.auth import get_user_model

from tenants import memberships
from tenants.errors import LastAdministrator, NotFound, ServiceError
from tenants.models import Membership

from ..postgres import run_django


def member(tenant, username, role):
    user = get_user_model().objects.create_user(username)
    return Membership.objects.create(user=user, tenant=tenant, role=role)


def roles(tenant) -> dict:
    return {m.user.username: m.role for m in Membership.objects.filter(tenant=tenant).select_related("user")}


def test_the_last_admin_is_neither_demoted_nor_removed(tenant):
    alice = member(tenant, "alice", "admin")
    member(tenant, "victor", "viewer")
    with pytest.raises(LastAdministrator, match="alice is the last administrator of acme"):
        memberships.change_role(alice, "viewer")
    with pytest.raises(LastAdministrator, match="alice is the last administrator of acme"):
        memberships.remove_member(alice)
    assert roles(tenant) == {"alice": "admin", "victor": "viewer"}
    assert memberships.is_last_admin(alice)


def test_an_admin_goes_once_there_is_another(tenant):
    alice, dave = member(tenant, "alice", "admin"), member(tenant, "dave", "admin")
    assert not memberships.is_last_admin(alice)
    assert memberships.change_role(alice, "viewer") == "admin"           # the role it had
    assert roles(tenant) == {"alice": "viewer", "dave": "admin"}
    with pytest.raises(LastAdministrator):
        memberships.remove_member(dave)                                  # now the last one
    memberships.remove_member(alice)
    assert roles(tenant) == {"dave": "admin"}
    assert get_user_model().objects.filter(username="alice").exists()   # the account stays


def test_promoting_and_viewers_are_never_held_back(tenant):
    victor, bob = member(tenant, "victor", "viewer"), member(tenant, "bob", "viewer")   # no admin at all
    assert memberships.change_role(victor, "viewer") == "viewer"
    memberships.remove_member(bob)
    assert memberships.change_role(victor, "admin") == "viewer"
    assert roles(tenant) == {"victor": "admin"}


def test_the_role_is_read_again_under_the_lock(tenant):
    """A page loaded while alice was a viewer; she has been made the tenant's
    only administrator since: a change made from the stale copy is refused."""
    alice = member(tenant, "alice", "admin")
    stale = Membership.objects.get(pk=alice.pk)
    stale.role = "viewer"                                                # as loaded before her promotion
    with pytest.raises(LastAdministrator):
        memberships.change_role(stale, "viewer")
    stale.role = "viewer"
    with pytest.raises(LastAdministrator):
        memberships.remove_member(stale)
    assert roles(tenant) == {"alice": "admin"}


def test_a_member_that_went_meanwhile_is_not_found(tenant):
    alice, dave = member(tenant, "alice", "admin"), member(tenant, "dave", "admin")
    Membership.objects.filter(pk=dave.pk).delete()
    with pytest.raises(NotFound):
        memberships.change_role(dave, "viewer")
    with pytest.raises(NotFound):
        memberships.remove_member(dave)
    with pytest.raises(ServiceError, match="role must be one of admin, viewer"):
        memberships.change_role(alice, "owner")
    assert roles(tenant) == {"alice": "admin"}


# ---------------------------------------------------------------- the row lock, on PostgreSQL

# Two administrators, alice and dave. Another transaction holds acme's row lock
# (as change_role takes it) and has demoted dave, uncommitted. change_role(alice,
# "viewer") in a thread must wait for that lock, then see dave demoted and refuse;
# without the lock it would check against the snapshot where dave is still an
# administrator and demote alice too: a tenant without administrators.
RACE = """
import json, sys, threading, time
import django
django.setup()
import psycopg
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from tenants import memberships, services
from tenants.errors import LastAdministrator
from tenants.models import Membership

call_command("migrate", verbosity=0)
acme = services.create_tenant("acme")
alice, dave = (Membership.objects.create(user=get_user_model().objects.create_user(n), tenant=acme, role="admin")
               for n in ("alice", "dave"))
db = settings.DATABASES["default"]
other = psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"], password=db["PASSWORD"],
                        dbname=db["NAME"])
watch = psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"], password=db["PASSWORD"],
                        dbname=db["NAME"], autocommit=True)    # pg_stat_activity is frozen within a transaction
other.execute("SELECT id FROM tenants_tenant WHERE id = %s FOR UPDATE", (acme.pk,))
other.execute("UPDATE console_membership SET role = 'viewer' WHERE id = %s", (dave.pk,))
outcome = []

def demote_alice():
    try:
        memberships.change_role(Membership.objects.get(pk=alice.pk), "viewer")
        outcome.append("demoted")
    except LastAdministrator:
        outcome.append("refused")
    finally:
        connection.close()

thread = threading.Thread(target=demote_alice)
thread.start()
deadline = time.monotonic() + 60
waiting = []
while thread.is_alive() and not waiting and time.monotonic() < deadline:
    waiting = watch.execute("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                            "AND datname = current_database()").fetchall()
    time.sleep(0.01)
other.commit()
thread.join(60)
print(json.dumps({"waited_for_the_lock": bool(waiting), "outcome": outcome,
                  "roles": sorted([m.user.username, m.role] for m in Membership.objects.all())}))
"""


def test_two_admins_demoting_each_other_leave_one_admin(postgres_db, tmp_path):
    result = run_django(postgres_db, tmp_path, RACE)
    assert result == {"waited_for_the_lock": True, "outcome": ["refused"],
                      "roles": [["alice", "admin"], ["dave", "viewer"]]}

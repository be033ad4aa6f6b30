"""The management commands as real processes on a migrated SQLite file:
exit codes, one-line errors on stderr, and ``tail -1`` giving the secret.

The tests share one database (migrating takes seconds) holding tenant
"acme"; each test uses its own device names or tenants.
"""

import hashlib
import json
import os
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tenants-cli")
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp / 'x.sqlite3'}", "VAR_DIR": str(tmp),
           "DJANGO_SETTINGS_MODULE": "console.settings"}
    env.pop("DJANGO_COLORS", None)
    done = subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    env["_DB"] = str(tmp / "x.sqlite3")
    done = manage(env, "tenants", "create", "acme", "--contact", "ops@acme.test")
    assert (done.returncode, done.stdout, done.stderr) == (0, "created tenant acme\n", "")
    return env


def manage(env, *args, shell_tail: str = "") -> subprocess.CompletedProcess:
    cmd = [sys.executable, "manage.py", *args]
    if shell_tail:
        cmd = ["sh", "-c", f"{shlex.join(cmd)} | {shell_tail}"]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def one_line_error(done, code, fragment):
    assert done.returncode == code, (done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert fragment in lines[0]


def query(env, sql, *params):
    with sqlite3.connect(env["_DB"]) as db:
        return db.execute(sql, params).fetchall()


def sha(secret):
    return "sha256$" + hashlib.sha256(secret.encode()).hexdigest()


def test_duplicate_tenant(env):
    one_line_error(manage(env, "tenants", "create", "acme"), 1, "tenant 'acme' already exists")


def test_device_secret_is_the_last_line(env):
    done = manage(env, "devices", "create", "acme", "sensor-1", shell_tail="tail -1")
    assert done.returncode == 0, done.stderr
    secret = done.stdout.strip()
    assert len(secret) >= 43 and "\n" not in secret
    [(stored,)] = query(env, "SELECT c.secret_hash FROM tenants_credential c JOIN tenants_device d "
                             "ON c.device_id = d.id WHERE d.name = 'sensor-1'")
    assert stored == sha(secret)
    # brokerd's view: the device's row carries the hash, never the secret
    [(data,)] = query(env, "SELECT data FROM tenants_devicepolicy WHERE tenant_slug = 'acme' AND name = 'sensor-1'")
    assert secret not in data
    assert json.loads(data)["credentials"][0]["hash"] == sha(secret)

    rotated = manage(env, "devices", "rotate", "acme", "sensor-1", shell_tail="tail -1").stdout.strip()
    assert rotated != secret
    assert query(env, "SELECT c.secret_hash FROM tenants_credential c JOIN tenants_device d "
                      "ON c.device_id = d.id WHERE d.name = 'sensor-1'") == [(sha(rotated),)]


def test_errors_are_one_line(env):
    one_line_error(manage(env, "devices", "list", "ghost"), 1, "unknown tenant 'ghost'")
    one_line_error(manage(env, "devices", "delete", "acme", "nobody"), 1, "unknown device acme/nobody")
    one_line_error(manage(env, "acl", "add", "acme", "--allow", "--action", "both", "--topic", "a/#/b"), 1,
                   "invalid topic filter")
    one_line_error(manage(env, "acl", "add", "acme", "--allow", "--action", "jump", "--topic", "a"), 2,
                   "invalid choice: 'jump'")
    one_line_error(manage(env, "tenants", "quota", "acme", "--max-connections", "lots"), 2,
                   "expected a positive integer or 'none'")


def test_changes_reach_the_snapshot(env):
    assert manage(env, "tenants", "create", "gamma").returncode == 0
    [(before,)] = query(env, "SELECT version FROM tenants_policysnapshot WHERE tenant_slug = 'gamma'")
    done = manage(env, "acl", "add", "gamma", "--allow", "--action", "publish",
                  "--topic", "sensors/{device}/#", "--pattern", "sensor-*")
    assert done.returncode == 0, done.stderr
    assert manage(env, "tenants", "quota", "gamma", "--max-connections", "5").returncode == 0
    assert manage(env, "tenants", "delete", "gamma").returncode == 0
    rows = query(env, "SELECT tenant_slug, version, data FROM tenants_policysnapshot WHERE version > ? "
                      "ORDER BY version", before)
    assert [r[0] for r in rows] == ["gamma"]  # one row per slug, now the deletion
    assert rows[0][1] >= before + 3
    assert json.loads(rows[0][2]) == {"schema": 2, "tenant": "gamma", "status": "deleted"}


def test_devices_import_creates_a_fleet_in_one_change_and_writes_each_secret_once(env, tmp_path):
    """``devices import``: a CSV of devices made in one transaction and one version of their rows (the
    tenant's snapshot untouched), their secrets as CSV."""
    assert manage(env, "tenants", "create", "fleet").returncode == 0
    [(before,)] = query(env, "SELECT version FROM tenants_policysnapshot WHERE tenant_slug = 'fleet'")
    source = tmp_path / "fleet.csv"
    source.write_text("name,cert_cn,description\n" + "".join(f"pump-{i},,pump {i}\n" for i in range(50))
                      + 'gw-1,gw-1.fleet.example,"the gateway, roof"\n')
    out = tmp_path / "secrets.csv"
    done = manage(env, "devices", "import", "fleet", str(source), "--output", str(out), "--label", "factory")
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("created 51 devices in fleet")
    lines = out.read_text().splitlines()
    assert lines[0] == "name,username,secret" and len(lines) == 52
    rows = [line.split(",") for line in lines[1:]]
    assert [r[0] for r in rows] == [f"pump-{i}" for i in range(50)] + ["gw-1"]
    assert all(r[1] == f"fleet/{r[0]}" for r in rows)
    assert query(env, "SELECT version FROM tenants_policysnapshot WHERE tenant_slug = 'fleet'") == [(before,)]
    rows_written = query(env, "SELECT name, version, data FROM tenants_devicepolicy WHERE tenant_slug = 'fleet'")
    assert {version for _, version, _ in rows_written} == {before + 1}, "one version for the whole import"
    devices = {name: json.loads(data) for name, _, data in rows_written}
    assert devices["gw-1"]["cert_cn"] == "gw-1.fleet.example"
    for name, _, secret in rows:
        assert devices[name]["credentials"][0]["hash"] == sha(secret)
    assert query(env, "SELECT description FROM tenants_device WHERE name = 'gw-1'") == [("the gateway, roof",)]
    assert set(query(env, "SELECT DISTINCT c.label FROM tenants_credential c JOIN tenants_device d "
                          "ON c.device_id = d.id JOIN tenants_tenant t ON d.tenant_id = t.id "
                          "WHERE t.slug = 'fleet'")) == {("factory",)}

    # all or nothing: a taken name (here in the file twice), an invalid one -- nothing made, the row named
    for text, fragment in (("name\nvalve-1\nvalve-2\nvalve-1\n",
                            "row 3 ('valve-1'): device fleet/valve-1 already exists"),
                           ("name\nvalve-1\nBad Name\n", "row 2 ('Bad Name'): name: "),
                           ("name\nvalve-1\npump-3\n", "row 2 ('pump-3'): device fleet/pump-3 already exists"),
                           ("device\nvalve-1\n", "the first line names the columns: name (needed)"),
                           ("name,cert_cn\nvalve-1,a,b\n", "row 1: 2 columns expected")):
        source.write_text(text)
        again = tmp_path / "again.csv"
        one_line_error(manage(env, "devices", "import", "fleet", str(source), "--output", str(again)), 1, fragment)
        assert not again.exists(), "no secrets file is left for an import that made nothing"
    assert query(env, "SELECT count(*) FROM tenants_device d JOIN tenants_tenant t ON d.tenant_id = t.id "
                      "WHERE t.slug = 'fleet'") == [(51,)]
    # an existing secrets file is never overwritten (its secrets would be lost): refused before anything is made
    source.write_text("name\nvalve-1\n")
    one_line_error(manage(env, "devices", "import", "fleet", str(source), "--output", str(out)), 1, "cannot write")
    assert out.read_text().splitlines()[0] == "name,username,secret"
    assert query(env, "SELECT count(*) FROM tenants_device WHERE name = 'valve-1'") == [(0,)]
    # standard input and output
    piped = subprocess.run(f"printf 'name\\nvalve-1\\n' | {shlex.quote(sys.executable)} manage.py devices import fleet",
                           shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert piped.returncode == 0, piped.stderr
    [header, row] = piped.stdout.splitlines()
    assert header == "name,username,secret" and row.startswith("valve-1,fleet/valve-1,")


def test_the_device_quota_from_the_command_line(env):
    assert manage(env, "tenants", "create", "plan").returncode == 0
    assert manage(env, "tenants", "quota", "plan", "--max-devices", "1").returncode == 0
    assert manage(env, "devices", "create", "plan", "one").returncode == 0
    one_line_error(manage(env, "devices", "create", "plan", "two"), 1,
                   "the tenant's quota allows 1 device and it has 1")
    assert query(env, "SELECT count(*) FROM tenants_device d JOIN tenants_tenant t ON d.tenant_id = t.id "
                      "WHERE t.slug = 'plan'") == [(1,)]


def test_a_largest_import_leaves_other_tenants_free_to_write(env, tmp_path):
    """An import holds the database's write lock (SQLite: one writer at a time) only to write its devices,
    not while it checks each row: before, the whole check ran in the transaction (~30 s for the 100,000
    devices the console allows) and another tenant's change waited its 20 s for the lock, then failed with
    'database is locked'. (Here a fifth of that against a fifth of the wait: SQLITE_BUSY_TIMEOUT 4 s.)"""
    import time

    env = {**env, "SQLITE_BUSY_TIMEOUT": "4"}
    assert manage(env, "tenants", "create", "huge").returncode == 0
    assert manage(env, "tenants", "create", "bystander").returncode == 0
    source = tmp_path / "huge.csv"
    source.write_text("name\n" + "".join(f"d{i:06d}\n" for i in range(20_000)))
    importing = subprocess.Popen([sys.executable, "manage.py", "devices", "import", "huge", str(source), "--output",
                                  str(tmp_path / "secrets.csv")], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    try:
        canaries, n = [], 0
        while importing.poll() is None and n < 40:
            n += 1
            started = time.monotonic()
            done = manage(env, "devices", "create", "bystander", f"canary-{n}")
            canaries.append((done.returncode, round(time.monotonic() - started, 1), done.stderr[-200:]))
        _, err = importing.communicate(timeout=120)
    finally:
        importing.kill()
    assert importing.returncode == 0, err
    assert query(env, "SELECT count(*) FROM tenants_device d JOIN tenants_tenant t ON d.tenant_id = t.id "
                      "WHERE t.slug = 'huge'") == [(20_000,)]
    # each waits at most what the import's writing holds the lock (~2 s here), never the 4 s and an error
    assert canaries and all(code == 0 for code, _, _ in canaries), canaries


def test_an_import_refuses_a_nul_character_in_one_line_on_postgresql(postgres_db, tmp_path):
    """A NUL byte in a field (PostgreSQL's text holds none): before, it passed every check and the
    insert failed -- a traceback from the command, a 500 from the console's page -- where the device
    form refuses it; now the row is named as for any other invalid field, nothing made."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DEBUG", "PRODUCTION", "DJANGO_COLORS")}
    env.update(DATABASE_URL=postgres_db, VAR_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="console.settings")
    done = subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert manage(env, "tenants", "create", "nul").returncode == 0
    for text, fragment in (("name,description\nok-1,fine\nbad-1,a\0b\n", "row 2 ('bad-1'): description: "),
                           ("name,cert_cn\nok-1,\nbad-1,cn\0.example\n", "row 2 ('bad-1'): cert_cn: ")):
        source = tmp_path / "nul.csv"
        source.write_text(text)
        one_line_error(manage(env, "devices", "import", "nul", str(source), "--output", str(tmp_path / "s.csv")),
                       1, fragment)
        assert not (tmp_path / "s.csv").exists()
    assert "ok-1" not in manage(env, "devices", "list", "nul").stdout


def test_an_import_whose_secrets_cannot_be_written_makes_nothing(env, tmp_path):
    """The secrets are written before the devices are committed: a full disk (here /dev/full as the
    standard output) refuses the import -- before, the devices were made and their secrets, shown
    nowhere else, lost (every device to delete and import again)."""
    assert manage(env, "tenants", "create", "diskfull").returncode == 0
    source = tmp_path / "fleet.csv"
    source.write_text("name\n" + "".join(f"full-{i}\n" for i in range(2000)))
    done = subprocess.run(f"{shlex.quote(sys.executable)} manage.py devices import diskfull {shlex.quote(str(source))}"
                          " > /dev/full", shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0, done.stderr
    assert done.stderr.splitlines()[-1].startswith("error: "), done.stderr[-2000:]
    assert query(env, "SELECT count(*) FROM tenants_device d JOIN tenants_tenant t ON d.tenant_id = t.id "
                      "WHERE t.slug = 'diskfull'") == [(0,)]

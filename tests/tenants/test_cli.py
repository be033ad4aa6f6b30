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
    # brokerd's view: the snapshot carries the hash, never the secret
    [(data,)] = query(env, "SELECT data FROM tenants_policysnapshot WHERE tenant_slug = 'acme'")
    assert secret not in data
    assert json.loads(data)["devices"]["sensor-1"]["credentials"][0]["hash"] == sha(secret)

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
    assert json.loads(rows[0][2]) == {"schema": 1, "tenant": "gamma", "status": "deleted"}

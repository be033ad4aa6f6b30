"""A console database on disk, provisioned through the Django layer, and
brokerd nodes that use it as their control plane -- all real processes.

``ControlPlane.manage(...)`` runs ``python manage.py ...`` with
``DATABASE_URL`` pointing at a SQLite file in the test's directory -- or at
the PostgreSQL database given as ``database_url`` (``postgres://...``, e.g.
the ``postgres_db`` fixture) -- each run a process of its own, forked from a
zygote that has the libraries imported (``tests.manage_zygote``);
``provision(...)`` creates many tenants and devices in one Django process
(through ``tenants.services``) and returns their secrets; ``broker(...)``
starts brokerd with the same environment, so it reads the same database.
"""

import atexit
import json
import os
import shutil
import subprocess
import tempfile

from . import manage_zygote
from .procs import BrokerProcess

# Script bodies for ``manage.py shell -c``: each reads its ``plan`` (set by _READ_PLAN or by
# provision_with_tokens) and prints its secrets on a ``SECRETS`` line.
_READ_PLAN = "import json, sys\nplan = json.loads(sys.stdin.read())\n"

_PROVISION_BODY = r"""
import json
from tenants import services
out = {}
for t in plan:
    tenant = services.create_tenant(t["slug"], name=t.get("name", t["slug"]), default_acl=t.get("default_acl", "deny"))
    for rule in t.get("acl", []):
        services.add_acl_rule(tenant, **rule)
    if t.get("quota"):
        services.update_quota(tenant, **t["quota"])
    for name in t.get("devices", []):
        device, credential, secret = services.provision_device(tenant, name)
        out[f"{t['slug']}/{name}"] = secret
print("SECRETS " + json.dumps(out))
"""

_TOKENS_BODY = r"""
import json
from console.models import ApiToken
out = {}
for name, scope in plan["scopes"].items():
    t, out[name] = ApiToken.issue(name, scope)
ApiToken.objects.filter(name__in=plan["revoked"]).update(revoked=True)
print("SECRETS " + json.dumps(out))
"""

PROVISION = _READ_PLAN + _PROVISION_BODY
TOKENS = _READ_PLAN + _TOKENS_BODY


_TEMPLATE: dict[str, str] = {}      # this process's migrated console database, to copy
_PROVISIONED: dict[str, tuple[str, dict]] = {}   # test file + plan -> (a copy of the database it made, its secrets)


def migrated_sqlite(url: str, env: dict) -> None:
    """A migrated console database at the ``sqlite:///PATH`` ``url``: the first call in
    a test process runs ``manage.py migrate`` into a template file, later calls copy it
    (the same schema and rows; a migrate costs seconds, a copy milliseconds)."""
    path = url[len("sqlite:///"):]
    template = _TEMPLATE.get("path")
    if template is None:
        directory = tempfile.mkdtemp(prefix="console-template-")
        atexit.register(shutil.rmtree, directory, True)
        template = os.path.join(directory, "console.sqlite3")
        proc = manage_zygote.run(["migrate", "--noinput", "-v", "0"],
                                 dict(env, DATABASE_URL=f"sqlite:///{template}", VAR_DIR=directory), timeout=120)
        if proc.returncode != 0:
            raise AssertionError(f"manage.py migrate failed ({proc.returncode}): {proc.stderr[-2000:]}")
        _TEMPLATE["path"] = template
    shutil.copyfile(template, path)


def copy_sqlite(src: str, dst: str) -> None:
    """A closed SQLite database file, with its write-ahead log if one was left."""
    shutil.copyfile(src, dst)
    if os.path.exists(src + "-wal"):
        shutil.copyfile(src + "-wal", dst + "-wal")


class ControlPlane:
    def __init__(self, directory, database_url: str | None = None):
        self.dir = directory
        # directory is absolute: sqlite:////...
        self.url = database_url or f"sqlite:///{directory}/console.sqlite3"
        self.kind = "sqlite" if self.url.startswith("sqlite:") else "pg"
        self.env = dict(os.environ, DATABASE_URL=self.url, VAR_DIR=str(directory), PYTHONUNBUFFERED="1")
        self.pristine = False           # a freshly migrated SQLite database nothing has run on yet
        if self.kind == "sqlite":
            migrated_sqlite(self.url, self.env)
            self.pristine = True
        else:
            self.manage("migrate", "-v", "0")

    def manage(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
        self.pristine = False
        proc = manage_zygote.run(args, self.env, stdin=stdin, timeout=120)      # python manage.py ARGS
        if check and proc.returncode != 0:
            raise AssertionError(f"manage.py {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return proc

    def provision(self, plan: list[dict]) -> dict[str, str]:
        """Tenants (with ACL rules, quotas and devices) in one go; -> {"tenant/device": secret}.

        The same plan on a fresh SQLite database (no manage command, no node yet) gives a
        copy of the database that plan made earlier in the same test file (the same rows
        and secrets, created at most a test file's run ago; a copy costs milliseconds, a
        Django start-up 1-3 s): each test still has its own database."""
        test_file = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[0]
        key = test_file + " " + json.dumps(plan, sort_keys=True)
        db = self.url[len("sqlite:///"):]
        if self.pristine and key in _PROVISIONED:
            copy, secrets = _PROVISIONED[key]
            copy_sqlite(copy, db)
            self.pristine = False
            return dict(secrets)
        pristine = self.pristine
        proc = self.manage("shell", "-c", PROVISION, stdin=json.dumps(plan))
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("SECRETS ")][-1]
        secrets = json.loads(line[len("SECRETS "):])
        if pristine:
            copy = os.path.join(os.path.dirname(_TEMPLATE["path"]), f"provisioned-{len(_PROVISIONED)}.sqlite3")
            copy_sqlite(db, copy)
            _PROVISIONED[key] = (copy, dict(secrets))
        return secrets

    def device(self, tenant: str, name: str) -> str:
        """``manage.py devices create``: the secret is alone on the last line."""
        return self.manage("devices", "create", tenant, name).stdout.strip().splitlines()[-1]

    def manage_each(self, *commands: tuple[str, ...]) -> list[str]:
        """Several management commands (each an argv tuple, as for ``manage``) run in one
        Django process through ``call_command`` -- the same commands and parsers, one
        start-up (1-3 s) instead of one each; -> the standard output of each. For
        commands expected to succeed: an error fails the whole call."""
        out = self.shell("import io, json, sys\nfrom django.core.management import call_command\n"
                         "outs = []\n"
                         "for argv in json.loads(sys.stdin.read()):\n"
                         "    buf = io.StringIO()\n"
                         "    call_command(*argv, stdout=buf)\n"
                         "    outs.append(buf.getvalue())\n"
                         "print('OUTPUTS', json.dumps(outs))",
                         stdin=json.dumps([list(c) for c in commands]))
        line = [ln for ln in out.splitlines() if ln.startswith("OUTPUTS ")][-1]
        return json.loads(line[len("OUTPUTS "):])

    def shell(self, code: str, stdin: str | None = None) -> str:
        """``manage.py shell -c CODE``; -> its standard output."""
        return self.manage("shell", "-c", code, stdin=stdin).stdout

    def issue_token(self, name: str, scope: str) -> str:
        """An admin API token made as the console makes it; -> the secret."""
        return self.issue_tokens({name: scope})[name]

    def issue_tokens(self, scopes: dict[str, str], revoked: tuple[str, ...] = ()) -> dict[str, str]:
        """Admin API tokens ({name: scope}) made as the console makes them, those named in
        ``revoked`` revoked at once, in one ``manage.py`` (each costs a Django start-up);
        -> {name: secret}."""
        out = self.shell(TOKENS, stdin=json.dumps({"scopes": scopes, "revoked": list(revoked)}))
        line = [ln for ln in out.splitlines() if ln.startswith("SECRETS ")][-1]
        return json.loads(line[len("SECRETS "):])

    def provision_with_tokens(self, plan: list[dict], scopes: dict[str, str],
                              revoked: tuple[str, ...] = ()) -> tuple[dict[str, str], dict[str, str]]:
        """``provision(plan)`` and ``issue_tokens(scopes, revoked)`` in one Django process;
        -> (device secrets, token secrets)."""
        code = ("import json, sys\nBOTH = json.loads(sys.stdin.read())\n"
                "plan = BOTH['provision']\n" + _PROVISION_BODY
                + "plan = BOTH['tokens']\n" + _TOKENS_BODY)
        out = self.shell(code, stdin=json.dumps({"provision": plan,
                                                 "tokens": {"scopes": scopes, "revoked": list(revoked)}}))
        devices, tokens = (json.loads(ln[len("SECRETS "):]) for ln in out.splitlines() if ln.startswith("SECRETS "))
        return devices, tokens

    def revoke_token(self, name: str) -> None:
        self.shell("from console.models import ApiToken\n"
                   f"ApiToken.objects.filter(name={name!r}).update(revoked=True)")

    def query(self, sql: str, params=()) -> list[tuple]:
        """Rows of a plain SQL query on the console database, ``?`` placeholders
        on either database. The values are the driver's: on PostgreSQL
        timestamps come back as aware datetimes, on SQLite as text."""
        if self.kind == "sqlite":
            import sqlite3

            conn = sqlite3.connect(self.dir / "console.sqlite3")
            try:
                rows = conn.execute(sql, params).fetchall()
                conn.commit()               # (a write, as on PostgreSQL's autocommit)
                return rows
            finally:
                conn.close()
        from urllib.parse import unquote, urlsplit

        import psycopg

        u = urlsplit(self.url)
        if params:
            sql = sql.replace("%", "%%").replace("?", "%s")
        with psycopg.connect(host=u.hostname, port=u.port or 5432, dbname=u.path.lstrip("/"),
                             user=unquote(u.username or ""), password=unquote(u.password or ""),
                             autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(sql, tuple(params) if params else None)
            return cur.fetchall() if cur.description else []

    def newest_version(self) -> int:
        """The newest policy version written, of a tenant's snapshot or a device's row (a test writing a
        row of its own takes a version above it, as the console's counter would)."""
        [(top,)] = self.query("SELECT MAX(v) FROM (SELECT MAX(version) AS v FROM tenants_policysnapshot "
                              "UNION ALL SELECT MAX(version) FROM tenants_devicepolicy) AS versions")
        return top or 0

    def broker(self, *flags: str, anonymous: bool = False) -> BrokerProcess:
        self.pristine = False
        return BrokerProcess("--sys-interval", "0", *flags, anonymous=anonymous, env=self.env).start()

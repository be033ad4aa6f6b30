"""Reading the console's policy snapshots (asyncio side; plain SQL, no Django).

The console writes one row per tenant into ``tenants_policysnapshot``
(``tenant_slug``, ``version``, ``data`` JSON) in the same transaction as every
change, with ``version`` from a counter that serialises writers. The node
polls for ``version > newest seen`` every ``interval`` seconds (0.5 by
default: a change is enforced well within the 2 seconds promised), applies
the rows in version order and tells the broker what changed. When the
database cannot be reached the node keeps its cache -- authorised devices
stay connected and can reconnect -- logs the outage once, and retries.

URLs as Django's ``DATABASE_URL``: ``sqlite:///relative.sqlite3``,
``sqlite:////abs/path.sqlite3``, ``postgres://USER:PASS@HOST:PORT/DB``
(``postgresql://``, ``pgsql://``; the query's parameters -- ``sslmode``,
``sslrootcert``, ``application_name``, ``currentSchema``... -- are the libpq
connection parameters Django's backend is given, read as dj-database-url
reads them, so the node connects as the console does).
"""

import asyncio
import json
import logging
import time
from urllib.parse import parse_qsl, unquote, urlsplit

from .control import with_devices
from .policy import TenantPolicy, device_from

DELETED = {"schema": 1, "status": "deleted"}     # a tenant's snapshot once it is deleted (with its "tenant")

log = logging.getLogger("brokerd.tenancy")

# OPTIONS Django's PostgreSQL backend takes for itself; the rest goes to libpq
DJANGO_ONLY = {"isolation_level", "server_side_binding", "assume_role", "pool"}


STATEMENT_TIMEOUT_MS = 10_000
WRITE_TIMEOUT = 20.0           # seconds a SQLite write waits for the console's transactions
# a snapshot larger than this is decoded a piece at a time (``decode``)
PIECEWISE_BYTES = 256 * 1024

_decoder = json.JSONDecoder()
_SPACE = " \t\n\r"


def decode(text: str, device=None) -> dict:
    """A snapshot's JSON. ``json.loads`` is one call that holds the interpreter until it is done: a
    tenant of 150,000 devices (31 MB) took ~0.4 s, and every client of the node waited that long at
    each change of it, though the poller's thread did the decoding. A large document is decoded here
    one top-level value, and one device, at a time: between the calls the node's loop runs.
    ``device(name, entry)``: what each device's entry becomes (``policy.device_from``), made as it is
    decoded -- the entries as dicts and lists never pile up for the garbage collector to walk."""
    if len(text) < PIECEWISE_BYTES:
        return json.loads(text)
    raw = _decoder.raw_decode
    end = len(text)

    def skip(i: int) -> int:
        while i < end and text[i] in _SPACE:
            i += 1
        return i

    def expect(i: int, char: str) -> int:
        i = skip(i)
        if i >= end or text[i] != char:
            raise json.JSONDecodeError(f"expected {char!r}", text, i)
        return skip(i + 1)

    def members(i: int, value_of) -> tuple[dict, int]:
        """The object at ``i`` (its ``{``), each member's value read by ``value_of(key, i)``."""
        out = {}
        i = expect(i, "{")
        if i < end and text[i] == "}":
            return out, i + 1
        while True:
            if i >= end or text[i] != '"':
                raise json.JSONDecodeError("expected a member name", text, i)
            key, i = raw(text, i)
            i = expect(i, ":")
            out[key], i = value_of(key, i)
            i = skip(i)
            if i < end and text[i] == ",":
                i = skip(i + 1)
                continue
            if i < end and text[i] == "}":
                return out, i + 1
            raise json.JSONDecodeError("expected ',' or '}'", text, i)

    def top(key: str, i: int):
        if key == "devices" and i < end and text[i] == "{":
            if device is None:
                return members(i, lambda _key, j: raw(text, j))

            def entry(name, j):
                value, j = raw(text, j)
                return device(name, value), j

            return members(i, entry)
        return raw(text, i)

    doc, i = members(skip(0), top)
    if skip(i) != end:
        raise json.JSONDecodeError("extra data", text, skip(i))
    return doc


def pg_params(url: str) -> dict:
    """A ``postgres://`` URL -> keyword arguments for ``psycopg.connect``, as
    dj-database-url and Django's backend turn the same URL into a connection."""
    parts = urlsplit(url)
    params = {k: v for k, v in parse_qsl(parts.query) if k not in DJANGO_ONLY}
    schema = params.pop("currentSchema", None)
    # a query never holds the node's poll for long, on a live server or not
    options = [f"-c search_path={schema}"] if schema else []
    options.append(f"-c statement_timeout={STATEMENT_TIMEOUT_MS}")
    params["options"] = " ".join([params["options"], *options] if params.get("options") else options)
    params.update(host=unquote(parts.hostname or ""), port=parts.port, dbname=unquote(parts.path[1:]),
                  user=unquote(parts.username or ""), password=unquote(parts.password or ""))
    params.setdefault("connect_timeout", 5)
    # a server or network that went away without a word is noticed in about 20 s, not hours:
    # TCP keepalives on the idle kept connection, and unacknowledged writes given up on
    for key, value in (("keepalives", 1), ("keepalives_idle", 10), ("keepalives_interval", 3),
                       ("keepalives_count", 3), ("tcp_user_timeout", 20000)):
        params.setdefault(key, value)
    return {k: v for k, v in params.items() if v not in (None, "")}


def _text(value):
    """A value for a text column on either database: PostgreSQL refuses U+0000
    and both refuse what is not UTF-8 (lone surrogates), so an audit row is
    written with U+FFFD / "?" in their place rather than lost."""
    if value is None:
        return None
    value = str(value)
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "replace").decode("utf-8")
    return value


QUERY = "SELECT tenant_slug, version, data FROM tenants_policysnapshot WHERE version > {p} ORDER BY version"
# the tenants' snapshots and their devices' rows, in one statement: one snapshot of the database (read
# one after the other, a change committed between them could be passed over by the newest version seen)
BOTH_QUERY = ("SELECT tenant_slug, version, data, NULL, NULL, 0 FROM tenants_policysnapshot WHERE version > {p} "
              "UNION ALL SELECT tenant_slug, version, data, incarnation, name, 1 FROM tenants_devicepolicy "
              "WHERE version > {p}")
TENANT_DEVICES = ("SELECT name, data FROM tenants_devicepolicy WHERE tenant_slug = {p} AND incarnation = {p} "
                  "AND data IS NOT NULL")


def _device_row(name: str, data):
    """A device row's entry: its DevicePolicy, None (the device was deleted), or the error it raised."""
    if data is None:
        return None
    try:
        entry = json.loads(data)
        if not isinstance(entry, dict):
            raise ValueError("not an object")
        return device_from(name, entry)
    except Exception as exc:
        return ValueError(f"device row not readable: {type(exc).__name__}: {str(exc)[:200]}")


def _statement_error(conn, exc: Exception) -> bool:
    """Whether ``exc`` is the server refusing one statement on a PostgreSQL connection that is still
    good (autocommit: no transaction is left aborted), rather than the connection failing."""
    import psycopg

    return (isinstance(exc, psycopg.errors.ProgrammingError) and not conn.closed and not conn.broken)


class PolicyDatabase:
    """A read-only connection to the console's database (blocking; used from a thread)."""

    def __init__(self, url: str):
        self.url = url
        parts = urlsplit(url)
        self.kind = {"sqlite": "sqlite", "postgres": "pg", "postgresql": "pg", "pgsql": "pg"}.get(parts.scheme)
        if self.kind is None:
            raise ValueError(f"control plane URL {url!r}: use sqlite:///PATH or postgres://...")
        if self.kind == "sqlite":
            self.path = parts.path[1:] if parts.path.startswith("/") else parts.path
            if not self.path:
                raise ValueError(f"control plane URL {url!r}: no path")
        self.conn = None

    def _connect(self):
        if self.kind == "sqlite":
            import sqlite3

            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5, check_same_thread=False)
            conn.execute("PRAGMA query_only = ON")
            return conn
        import psycopg

        return psycopg.connect(**pg_params(self.url), autocommit=True)

    def _rows(self, sql: str, params=()) -> list[tuple]:
        """One read on the node's connection: kept open on PostgreSQL (autocommit,
        so every poll sees what was committed before it; a read that failed with
        the connection lost closes it and the next one reconnects -- one the server
        refused, a table missing, leaves it open), reopened per poll on SQLite."""
        if self.conn is None:
            self.conn = self._connect()
        try:
            cur = self.conn.cursor()
            cur.execute(sql.format(p="?" if self.kind == "sqlite" else "%s"), params)
            return cur.fetchall()
        except Exception as exc:
            if self.kind != "pg" or not _statement_error(self.conn, exc):
                self.close()
            raise
        finally:
            if self.kind == "sqlite":
                # reopened per poll (a fraction of a millisecond): a file that went away is noticed
                self.close()

    def fetch(self, since: int) -> tuple[list[tuple[str, int, dict | Exception]], list[tuple]]:
        """The snapshots and device rows newer than ``since``: [(slug, version, document)], [(slug,
        incarnation, name, version, DevicePolicy | None (deleted))] -- or, for a row that is no JSON
        document (or nested past what the decoder takes), the error in its place: that row is refused
        alone (a row every poll failed on stopped the node taking any tenant's change)."""
        try:
            rows = self._rows(BOTH_QUERY, (since, since))
        except Exception as exc:
            if "tenants_devicepolicy" not in str(exc):
                raise
            # a console from before the device rows (schema 1; tried again at each poll, on the same
            # PostgreSQL connection: the table comes with the console's upgrade, in the transaction that
            # writes the first schema-2 row)
            rows = [(*row, None, None, 0) for row in self._rows(QUERY, (since,))]
        out, devices = [], []
        for slug, version, data, incarnation, name, kind in rows:
            if kind:
                devices.append((slug, incarnation, name, int(version), _device_row(name, data)))
                continue
            try:
                doc = decode(data, device_from)
            except Exception:
                try:
                    doc = decode(data)    # a device entry it cannot read: refused with the snapshot (_fetch)
                except Exception as exc:
                    doc = ValueError(f"not a JSON document: {type(exc).__name__}: {str(exc)[:200]}")
            out.append((slug, int(version), doc))
        out.sort(key=lambda r: r[1])
        devices.sort(key=lambda r: r[3])
        return out, devices

    def fetch_devices(self, slug: str, incarnation) -> dict:
        """Every device of the tenant ``slug``'s ``incarnation``, as its rows hold them now (a row it
        cannot read is left out, and logged)."""
        out = {}
        for name, data in self._rows(TENANT_DEVICES, (slug, incarnation)):
            entry = _device_row(name, data)
            if isinstance(entry, Exception):
                log.error("device %r of tenant %r ignored: %s", name, slug, entry)
            elif entry is not None:
                out[name] = entry
        return out

    def fetch_tokens(self) -> list | None:
        """Admin API tokens made in the console (None: no such table yet)."""
        try:
            return self._rows("SELECT id, name, token_hash, scope, revoked FROM console_apitoken")
        except Exception as exc:
            if "console_apitoken" in str(exc) or "does not exist" in str(exc):
                return None
            raise

    def insert_audit(self, e: dict) -> None:
        """One audit event into the console's audit log (``console_auditevent``)."""
        import datetime

        at = datetime.datetime.fromtimestamp(e["at"], datetime.UTC)
        values = (at if self.kind == "pg" else at.replace(tzinfo=None).isoformat(" "),
                  *map(_text, (e["actor"], e["source"], e["action"], e["object_type"], e["object_id"],
                               e.get("tenant"))),
                  None if e.get("before") is None else json.dumps(e["before"], default=str),
                  None if e.get("after") is None else json.dumps(e["after"], default=str), _text(e.get("remote_addr")))
        p = "?" if self.kind == "sqlite" else "%s"
        sql = ("INSERT INTO console_auditevent (at, actor, source, action, object_type, object_id, tenant, before, "
               f"after, remote_addr) VALUES ({', '.join([p] * 10)})")
        self.execute([(sql, values)])

    def execute(self, statements: list[tuple[str, tuple]]) -> None:
        """Writes into the console's database, in one transaction, on a connection of their own."""
        if self.kind == "sqlite":
            import sqlite3

            # in a thread, off the event loop: wait for the console's writers as long as they wait
            # for each other (Django's sqlite timeout, console/settings.py), not 5 s ("database is
            # locked" while an administrator's long transaction hashed device secrets on a busy host)
            conn = sqlite3.connect(self.path, timeout=WRITE_TIMEOUT)
            try:
                for sql, values in statements:
                    conn.execute(sql, values)
                conn.commit()
            finally:
                conn.close()
        else:
            conn = self._connect()
            try:
                with conn.transaction():
                    cur = conn.cursor()
                    for sql, values in statements:
                        cur.execute(sql, values)
            finally:
                conn.close()

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
            self.conn = None


class PolicySource:
    """Polls the snapshot table and feeds ``control`` and the broker."""

    def __init__(self, url: str, control, broker, loop: asyncio.AbstractEventLoop, interval: float = 0.5,
                 wall=None, tokens=None, rules=None):
        self.db = PolicyDatabase(url)
        self.rules = rules                    # brokerd.rules.engine.RuleEngine: the tenants' rules
        self.tokens = tokens                  # AdminTokens to refresh, if the node has an admin API
        self.control = control
        self.broker = broker
        self.loop = loop
        self.interval = interval
        self.wall = wall
        self.down_since: float | None = None
        self._task: asyncio.Task | None = None

    def _fetch(self, since: int) -> tuple[list[tuple], int]:
        """(In the poller's thread) what changed since ``since``, a tenant at a time: [(slug, version, its
        snapshot (None: only devices changed), its policy built (or the error))], and the newest version
        read. A schema-2 snapshot gets its devices from the tenant's policy of now and the device rows
        read with it -- or, for a tenant new here (or made again under its slug), from all its rows."""
        docs, device_rows = self.db.fetch(since)
        newest = max([since, *(r[1] for r in docs), *(r[3] for r in device_rows)])
        by_slug: dict[str, list] = {}
        for slug, incarnation, name, version, entry in device_rows:
            if isinstance(entry, Exception):
                log.error("device %r of tenant %r (version %d) ignored: %s", name, slug, version, entry)
                continue
            by_slug.setdefault(slug, []).append((incarnation, name, version, entry))
        out = []
        for slug, version, data in docs:
            if isinstance(data, Exception):
                out.append((slug, version, None, data))
                continue
            rows = by_slug.pop(slug, ())
            devices = None
            if isinstance(data, dict) and data.get("schema") == 2 and data.get("status") != "deleted":
                # (out of the try: the database failing to give them fails the poll, tried again -- a
                # snapshot refused has its version passed, and its tenant's device rows with it)
                devices = self._devices_of(slug, data.get("incarnation"), rows, since)
                version = max([version, *(r[2] for r in rows)])
            try:
                built = self.control.prepare(slug, version, data, devices)
            except Exception as exc:            # (what a document the console did not write may raise)
                built = exc
            out.append((slug, version, data, built))
        for slug, rows in by_slug.items():      # tenants of which only devices changed
            current = self.control.policies.get(slug)
            entries = {name: entry for incarnation, name, _version, entry in rows
                       if current is not None and incarnation == current.incarnation}
            if entries:                         # (else: rows of a tenant, or incarnation, not here)
                version = max(r[2] for r in rows)
                out.append((slug, version, None, self.control.prepare_devices(slug, version, entries)))
        return out, newest

    def _devices_of(self, slug: str, incarnation, rows, since: int) -> dict:
        """A schema-2 snapshot's devices: name -> DevicePolicy."""
        if since == 0:                          # the first read: ``rows`` are every row there is
            return {name: entry for inc, name, _version, entry in rows if inc == incarnation and entry is not None}
        current = self.control.policies.get(slug)
        if current is not None and incarnation is not None and current.incarnation == incarnation:
            return with_devices(current.devices, {name: entry for inc, name, _version, entry in rows
                                                  if inc == incarnation})
        if type(incarnation) is not int or not -2**63 <= incarnation < 2**63:
            return {}                           # (no row is of it: a document the console did not write)
        # not applied on top of these rows: all of them read now are as new as they are, or newer
        return self.db.fetch_devices(slug, incarnation)

    def _compile_rules(self, rows) -> dict:
        """The new and changed rules of ``rows``' snapshots, compiled (in a thread: a statement takes up
        to ~0.1 s, and the event loop serves every tenant meanwhile); -> {slug: {rule id: RuleState}}."""
        ready = {}
        for slug, _version, data, _built in rows:
            if data is None:                    # (devices alone changed)
                continue
            try:
                specs = [r for r in (data or {}).get("rules") or () if isinstance(r, dict) and "id" in r and "sql" in r]
                ready[slug] = self.rules.compile_ahead(slug, specs)
            except (ValueError, KeyError, TypeError, AttributeError):
                pass                        # apply() reports it
        return ready

    async def poll(self) -> int:
        """One round: fetch and apply what changed; -> number of snapshots applied."""
        rows, newest = await asyncio.to_thread(self._fetch, self.control.version)
        ready = await asyncio.to_thread(self._compile_rules, rows) if self.rules is not None and rows else {}
        now = self.loop.time()
        for slug, version, data, built in rows:
            current = self.control.policies.get(slug)
            if (self.control.loaded and current is not None and isinstance(built, TenantPolicy)
                    and None not in (current.incarnation, built.incarnation)
                    and current.incarnation != built.incarnation):
                # the slug's tenant was deleted and another made under its name between two polls (the
                # row holds the newest only): the old one goes first -- its connections, sessions,
                # retained messages and counters -- as if its deletion had been seen
                now = await self._install(slug, version, DELETED | {"tenant": slug}, None, {}, now)
            now = await self._install(slug, version, data, built, ready, now)
        self.control.version = max(self.control.version, newest)
        if not self.control.loaded:
            self.control.loaded = True
            # the first load: tenants deleted while this node could not learn it (down, or its
            # database out of reach at start) leave what the node restored of them
            self.broker.forget_gone_tenants(now)
        if self.tokens is not None:
            tokens = await asyncio.to_thread(self.db.fetch_tokens)
            if tokens is not None:
                self.tokens.replace(tokens)
        return len(rows)

    async def _install(self, slug: str, version: int, data: dict, built, ready: dict, now: float) -> float:
        """Apply one snapshot (``built``: its policy, prepared; ``ready``: rules compiled ahead) and enforce
        it on the tenant's clients; -> the loop's time after."""
        if isinstance(built, Exception):        # (what ``_fetch`` could not read or build)
            return self._ignored(slug, version, built, now)
        try:
            old, new = self.control.apply(slug, version, data, built, now)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return self._ignored(slug, version, exc, now)
        autosub = new.autosub if new is not None else None
        if data is not None:                    # (None: devices alone changed, nothing else to install)
            if autosub is None:
                self.broker.autosub.pop(slug, None)
            else:
                self.broker.autosub[slug] = autosub
        if self.rules is not None and data is not None:
            try:
                self.rules.apply(slug, new.rules if new is not None else None, ready.get(slug))
            except (ValueError, KeyError, TypeError) as exc:
                log.error("rules of tenant %r (version %d) ignored: %s", slug, version, exc)
        if self.control.loaded:
            # in steps, the loop serving every client between them (a big tenant's ACL change)
            for _ in self.broker.policy_steps(slug, old, new, now, self.wall(), time.perf_counter):
                await asyncio.sleep(0)
            now = self.loop.time()
        return now

    def _ignored(self, slug: str, version: int, exc: Exception, now: float) -> float:
        """A snapshot refused: its tenant keeps the policy it had, the others' go on (its version is passed)."""
        log.error("policy snapshot of tenant %r (version %d) ignored: %s: %s", slug, version, type(exc).__name__, exc)
        self.control.version = max(self.control.version, version)
        return now

    async def load(self, timeout: float) -> bool:
        """The first full load, waiting at most ``timeout`` for the database."""
        deadline = self.loop.time() + timeout
        while True:
            try:
                n = await self.poll()
                log.info("control plane %s: %d tenants loaded", self.db.url, n)
                return True
            except Exception as exc:
                if self.loop.time() >= deadline:
                    log.error("control plane %s unreachable (%s): serving without it until it answers",
                              self.db.url, exc)
                    self.down_since = self.loop.time()
                    return False
                await asyncio.sleep(0.5)

    def start(self) -> None:
        self._task = self.loop.create_task(self._run(), name="policy-source")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.poll()
            except Exception as exc:
                if self.down_since is None:
                    self.down_since = self.loop.time()
                    log.error("control plane %s unreachable (%s): keeping the cached policies of %d tenants",
                              self.db.url, exc, len(self.control.policies))
                continue
            if self.down_since is not None:
                log.warning("control plane %s reachable again after %.0f s", self.db.url,
                            self.loop.time() - self.down_since)
                self.down_since = None

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        await asyncio.to_thread(self.db.close)


class AuditSink:
    """Writes admin API changes into the console's audit log (off the event loop)."""

    def __init__(self, db: PolicyDatabase):
        self.db = db

    async def record(self, event: dict) -> None:
        try:
            await asyncio.to_thread(self.db.insert_audit, event)
        except Exception as exc:
            log.error("audit event not written (%s): %s", exc, json.dumps(event, default=str))

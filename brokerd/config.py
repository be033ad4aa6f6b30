"""brokerd settings: command-line flags, environment variables, an optional
TOML file, defaults.

Every flag has a TOML key of the same name with ``_`` for ``-``
(``--max-inflight 16`` == ``max_inflight = 16``); ``listen`` is a list.
Every flag is also an environment variable ``BROKERD_`` + the key in upper
case (``BROKERD_MAX_INFLIGHT=16``; ``BROKERD_LISTEN`` separates URLs with
commas or spaces; booleans are true/false); ``BROKERD_CONFIG`` names the
TOML file. Flags win over the environment, the environment over the file,
the file over ``DATABASE_URL`` (the control plane's default).
"""

import argparse
import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .cluster.handshake import MIN_SECRET
from .integrations.webhook import Allowance
from .protocol.properties import NEVER
from .store import open_store
from .tenancy.source import PolicyDatabase

SCHEMES = {"mqtt": 1883, "mqtts": 8883, "ws": 8083, "wss": 8084}


class ConfigError(ValueError):
    pass


@dataclass(slots=True)
class Listener:
    scheme: str
    host: str
    port: int
    path: str = ""

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}"

    @property
    def tls(self) -> bool:
        return self.scheme in ("mqtts", "wss")

    @property
    def websocket(self) -> bool:
        return self.scheme in ("ws", "wss")


def parse_listener(url: str) -> Listener:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"bad listener URL {url!r}: {exc}")
    scheme = parts.scheme
    if scheme not in SCHEMES:
        raise ConfigError(f"bad listener URL {url!r}: scheme must be one of {', '.join(SCHEMES)}")
    host = parts.hostname
    if not host:
        raise ConfigError(f"bad listener URL {url!r}: no host")
    if port is None:
        port = SCHEMES[scheme]
    path = parts.path or ""
    if scheme in ("ws", "wss"):
        path = path or "/mqtt"
    elif path not in ("", "/"):
        raise ConfigError(f"bad listener URL {url!r}: only ws:// and wss:// listeners take a path")
    else:
        path = ""
    return Listener(scheme, host, port, path)


@dataclass(slots=True)
class Config:
    listen: list = field(default_factory=lambda: ["mqtt://127.0.0.1:1883"])
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    tls_verify_client: str = "none"         # none | optional | required
    node_id: str = "node1"
    allow_anonymous: bool = False
    log_level: str = "info"
    log_format: str = "text"                # text | json
    max_keepalive: int = 3600
    max_packet_size: int = 1024 * 1024
    max_inflight: int = 32
    max_queued: int = 1000
    max_queued_bytes: int = 0
    max_connections: int = 100_000
    max_session_expiry: int = NEVER
    connect_timeout: float = 10.0
    # before authentication (issue 16): the largest CONNECT, and the node's bytes of incomplete ones
    max_connect_size: int = 64 * 1024
    preauth_budget: int = 16 * 1024 * 1024
    topic_alias_maximum: int = 64
    queue_qos0: bool = True
    shared_subscription_strategy: str = "round_robin"
    response_information: str = ""
    sys_interval: float = 10.0
    history_interval: float = 60.0
    usage_dir: str | None = None
    usage_checkpoint: float = 5.0
    write_buffer_high: int = 64 * 1024
    queue_budget: int = 64 * 1024 * 1024
    store: str = "memory://"
    control_plane: str | None = None
    cluster: str | None = None
    admin: str | None = None
    # the admin API's bounds (what whoever reaches its port can make the node hold)
    admin_max_connections: int = 64
    admin_timeout: float = 10.0
    admin_body_budget: int = 16 * 1024 * 1024
    cluster_listen: str = "127.0.0.1:0"
    # node links: a shared secret (BROKERD_CLUSTER_SECRET or a file) and/or mutual TLS -- see link_secret()
    cluster_secret: str | None = field(default=None, repr=False)
    cluster_secret_file: str | None = None
    cluster_tls_cert: str | None = None
    cluster_tls_key: str | None = None
    cluster_tls_ca: str | None = None
    # in a connect storm, the client-id claims made while a claim call of several is on its way to Redis
    # wait until this long (seconds) after its start, and go together (bus.Batches)
    cluster_claim_gap: float = 0.005
    advertise_host: str | None = None
    server_reference: str | None = None
    anonymous_tenant: str = "default"
    # worker processes per host sharing the listeners (SO_REUSEPORT): a number or "auto" (the usable cores)
    workers: str = "1"

    # rules' webhooks (brokerd.integrations.webhook): where they may go, and what they may hold
    rules_webhook_allow: str = "public"
    rules_webhook_buffer: int = 16 * 1024 * 1024
    rules_webhook_tenant_buffer: int = 1024 * 1024
    rules_webhook_concurrency: int = 16
    # rules' store action (brokerd.integrations.telemetry): rows waiting to be landed under --usage-dir
    rules_store_buffer: int = 64 * 1024 * 1024
    rules_store_tenant_buffer: int = 8 * 1024 * 1024
    rules_store_interval: float = 5.0
    # delayed publish ($delayed/{seconds}/{topic}, brokerd.delayed): pending messages per tenant; 0 turns it off
    max_delayed: int = 100_000

    def worker_count(self) -> int:
        """--workers as a number ("auto": the cores this process may run on)."""
        if self.workers.strip().lower() == "auto":
            return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
        return int(self.workers)

    def link_secret(self) -> bytes | None:
        """The cluster secret the node links prove (``--cluster-secret-file``,
        else ``BROKERD_CLUSTER_SECRET``), or None."""
        if self.cluster_secret_file:
            try:
                with open(self.cluster_secret_file, "rb") as fh:
                    return fh.read().strip()
            except OSError as exc:
                raise ConfigError(f"--cluster-secret-file: cannot read {self.cluster_secret_file}: {exc.strerror}")
        return self.cluster_secret.strip().encode() if self.cluster_secret else None

    def listeners(self) -> list[Listener]:
        return [parse_listener(u) for u in self.listen]

    def validate(self) -> "Config":
        ls = self.listeners()
        if not ls:
            raise ConfigError("at least one --listen is required")
        if any(lst.tls for lst in ls) and not (self.tls_cert and self.tls_key):
            raise ConfigError("mqtts:// and wss:// listeners need --tls-cert and --tls-key")
        if self.tls_verify_client not in ("none", "optional", "required"):
            raise ConfigError("--tls-verify-client must be none, optional or required")
        if self.tls_verify_client != "none" and not self.tls_ca:
            raise ConfigError("--tls-verify-client needs --tls-ca")
        if not 1 <= self.max_inflight <= 65535:
            raise ConfigError("--max-inflight must be 1..65535")
        if not 0 <= self.max_keepalive <= 65535:
            raise ConfigError("--max-keepalive must be 0..65535")
        if not 64 <= self.max_packet_size <= 268_435_460:
            raise ConfigError("--max-packet-size must be 64..268435460")
        if not 64 <= self.max_connect_size <= 268_435_460:
            raise ConfigError("--max-connect-size must be 64..268435460")
        if self.preauth_budget < min(self.max_connect_size, self.max_packet_size):
            raise ConfigError("--preauth-budget must be at least --max-connect-size")
        if self.max_queued < 1:
            raise ConfigError("--max-queued must be at least 1")
        if not 0 <= self.topic_alias_maximum <= 65535:
            raise ConfigError("--topic-alias-maximum must be 0..65535")
        if self.log_format not in ("text", "json"):
            raise ConfigError("--log-format must be text or json")
        if self.shared_subscription_strategy not in ("round_robin", "random"):
            raise ConfigError("--shared-subscription-strategy must be round_robin or random")
        try:
            open_store(self.store)
        except (ValueError, ImportError) as exc:
            raise ConfigError(f"--store: {exc}")
        if self.admin:
            host, _, port = self.admin.rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError("--admin must be HOST:PORT")
        if not 1 <= self.admin_max_connections <= 10_000:
            raise ConfigError("--admin-max-connections must be 1..10000")
        if not 0 < self.admin_timeout <= 3600:
            raise ConfigError("--admin-timeout must be more than 0 and at most 3600 seconds")
        if self.admin_body_budget < 64 * 1024:
            raise ConfigError("--admin-body-budget must be at least 65536 bytes")
        if self.cluster:
            if not self.cluster.startswith(("redis://", "rediss://", "unix://")):
                raise ConfigError("--cluster must be a redis:// URL")
            host, _, port = self.cluster_listen.rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError("--cluster-listen must be HOST:PORT")
            self._validate_link_credentials()
        if not 0 <= self.cluster_claim_gap <= 1:
            raise ConfigError(f"--cluster-claim-gap {self.cluster_claim_gap}: seconds, 0 to 1")
        if self.advertise_host is not None and (not self.advertise_host or "/" in self.advertise_host):
            raise ConfigError("--advertise-host must be a host name or address")
        if self.server_reference is not None:
            host, _, port = self.server_reference.rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError("--server-reference must be HOST:PORT")
        self._validate_workers()
        self._validate_usage_dir()
        if self.usage_checkpoint < 0:
            raise ConfigError(f"--usage-checkpoint {self.usage_checkpoint}: seconds, 0 or more")
        try:
            Allowance(self.rules_webhook_allow)
        except ValueError as exc:
            raise ConfigError(f"--rules-webhook-allow: {exc}")
        if self.rules_webhook_tenant_buffer < 1024 or self.rules_webhook_buffer < self.rules_webhook_tenant_buffer:
            raise ConfigError("--rules-webhook-tenant-buffer must be at least 1024 bytes and at most "
                              "--rules-webhook-buffer")
        if not 1 <= self.rules_webhook_concurrency <= 1024:
            raise ConfigError("--rules-webhook-concurrency must be 1..1024")
        if self.rules_store_tenant_buffer < 1024 or self.rules_store_buffer < self.rules_store_tenant_buffer:
            raise ConfigError("--rules-store-tenant-buffer must be at least 1024 bytes and at most "
                              "--rules-store-buffer")
        if not 0.05 <= self.rules_store_interval <= 60:
            raise ConfigError("--rules-store-interval must be 0.05..60 seconds")
        if self.max_delayed < 0:
            raise ConfigError("--max-delayed must be 0 (delayed publish off) or more")
        if self.control_plane:
            try:
                PolicyDatabase(self.control_plane)
            except ValueError as exc:
                raise ConfigError(f"--control-plane: {exc}")
        return self

    def _validate_usage_dir(self) -> None:
        """brokerd writes the usage log with local file operations (a temporary name, then a
        rename): a local path or ``file://``. An ``hdfs://`` or ``s3a://`` URI was taken for a
        relative path and written under the working directory, counted as written."""
        d = self.usage_dir
        if not d or "://" not in d:
            return
        scheme, _, rest = d.partition("://")
        if scheme == "file" and rest.startswith("/"):
            self.usage_dir = rest
            return
        raise ConfigError(f"--usage-dir {d!r}: brokerd writes the usage log to a local directory (a path or "
                          f"file:///PATH); an {scheme}:// URI is for the reports' USAGE_DIR -- see docs/operations.md, "
                          f"'Usage log'")

    def _validate_workers(self) -> None:
        """N > 1 workers are N members of a cluster: they need its bus and a store they all share."""
        try:
            n = self.worker_count()
        except ValueError:
            raise ConfigError(f"--workers must be a number or auto, not {self.workers!r}") from None
        if not 1 <= n <= 1024:
            raise ConfigError("--workers must be 1..1024 (or auto)")
        self.workers = str(self.workers).strip().lower()
        if n == 1:
            return
        if not self.cluster:
            raise ConfigError(f"--workers {n} needs --cluster redis://HOST:PORT/DB (or BROKERD_CLUSTER): "
                              "the workers of a host are members of a cluster")
        if not open_store(self.store).durable or self.store.startswith("sqlite:///:memory:"):
            raise ConfigError(f"--workers {n} needs a --store all the workers share: sqlite:///PATH (one file "
                              "on this host) or hbase://HOST:PORT")

    def _validate_link_credentials(self) -> None:
        """A node joins a cluster only with a credential for its links: nothing
        another node sends is acted on unless it proves the same one."""
        tls = (self.cluster_tls_cert, self.cluster_tls_key, self.cluster_tls_ca)
        if any(tls) and not all(tls):
            raise ConfigError("mutual TLS on the cluster links needs all of --cluster-tls-cert, --cluster-tls-key "
                              "and --cluster-tls-ca")
        secret = self.link_secret()
        if secret is None and not any(tls):
            raise ConfigError("--cluster needs a credential for the node links: set BROKERD_CLUSTER_SECRET (or "
                              "--cluster-secret-file / BROKERD_CLUSTER_SECRET_FILE) to the same random secret on "
                              "every node (e.g. `openssl rand -hex 32`), and/or --cluster-tls-cert, "
                              "--cluster-tls-key and --cluster-tls-ca")
        if secret is not None and len(secret) < MIN_SECRET:
            raise ConfigError(f"the cluster secret is too short ({len(secret)} bytes, at least {MIN_SECRET}): "
                              "use e.g. `openssl rand -hex 32`")


def _check_type(name: str, value, source: str):
    """A TOML value must have the type of the setting's default (an int will
    do where a float is expected; optional paths are strings)."""
    if name == "workers" and isinstance(value, int) and not isinstance(value, bool):
        return str(value)           # workers = 4, or workers = "auto"
    if name == "listen":
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{source}: listen must be a list of URLs")
        return value
    default = Config.__dataclass_fields__[name].default
    expected = str if default is None else type(default)
    if expected is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, expected)
    if not ok:
        raise ConfigError(f"{source}: {name} must be {expected.__name__}, not {type(value).__name__} {value!r}")
    return value


ENV_PREFIX = "BROKERD_"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def from_environ(environ) -> dict:
    """The settings given as ``BROKERD_<NAME>`` variables (empty ones are unset)."""
    values = {}
    for f in dataclasses.fields(Config):
        var = ENV_PREFIX + f.name.upper()
        raw = environ.get(var, "").strip()
        if not raw:
            continue
        if f.name == "listen":
            values["listen"] = [u for u in re.split(r"[,\s]+", raw) if u]
            continue
        default = f.default
        expected = str if default is None else type(default)
        try:
            if expected is bool:
                if raw.lower() not in _TRUE + _FALSE:
                    raise ValueError
                value = raw.lower() in _TRUE
            else:
                value = expected(raw)
        except ValueError:
            raise ConfigError(f"${var}: expected {'true/false' if expected is bool else expected.__name__}, "
                              f"not {raw!r}")
        values[f.name] = value
    return values


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m brokerd", description="MQTT 3.1.1 + 5.0 broker node")
    p.add_argument("--config", metavar="FILE",
                   help="TOML file with the same keys as these flags (default: $BROKERD_CONFIG)")
    p.add_argument("--listen", action="append", metavar="URL",
                   help="mqtt://HOST:PORT, mqtts://HOST:PORT, ws://HOST:PORT/mqtt or wss://HOST:PORT/mqtt "
                        "(repeatable; default mqtt://127.0.0.1:1883)")
    p.add_argument("--tls-cert", metavar="PEM", help="server certificate chain for mqtts/wss")
    p.add_argument("--tls-key", metavar="PEM", help="private key for --tls-cert")
    p.add_argument("--tls-ca", metavar="PEM", help="CA bundle for verifying client certificates")
    p.add_argument("--tls-verify-client", choices=["none", "optional", "required"],
                   help="client certificate verification (default none)")
    p.add_argument("--node-id", metavar="NAME")
    p.add_argument("--allow-anonymous", action="store_true", default=None,
                   help="accept clients without credentials into the default tenant")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", choices=["text", "json"],
                   help="log lines as text (default) or one JSON object a line (time, level, logger, node, message)")
    p.add_argument("--max-keepalive", type=int, metavar="SECONDS",
                   help="v5: sent as Server Keep Alive when a client asks for more or 0; "
                        "3.1.1 clients asking for more are refused (default 3600)")
    p.add_argument("--max-packet-size", type=int, metavar="BYTES", help="default 1048576")
    p.add_argument("--max-inflight", type=int, metavar="N",
                   help="unacknowledged QoS 1/2 messages per client, each way (default 32)")
    p.add_argument("--max-queued", type=int, metavar="N", help="queued messages per session (default 1000)")
    p.add_argument("--max-queued-bytes", type=int, metavar="BYTES",
                   help="queued payload bytes per session (default 0 = only --max-queued)")
    p.add_argument("--max-connections", type=int, metavar="N", help="default 100000")
    p.add_argument("--max-session-expiry", type=int, metavar="SECONDS",
                   help="cap on the session expiry a client may ask for (default: none)")
    p.add_argument("--connect-timeout", type=float, metavar="SECONDS",
                   help="close sockets that send no CONNECT in time (default 10)")
    # before authentication (issue 16)
    p.add_argument("--max-connect-size", type=int, metavar="BYTES",
                   help="largest CONNECT accepted, will message included; a larger one is refused from its "
                        "fixed header (v5: CONNACK 0x95) (default 65536; --max-packet-size if that is smaller)")
    p.add_argument("--preauth-budget", type=int, metavar="BYTES",
                   help="bytes of incomplete CONNECTs the node holds for all connections together; the "
                        "connection whose bytes would pass it is closed (default 16777216)")
    p.add_argument("--topic-alias-maximum", type=int, metavar="N", help="topic aliases a v5 client may use (64)")
    p.add_argument("--no-queue-qos0", dest="queue_qos0", action="store_false", default=None,
                   help="do not queue QoS 0 messages for offline persistent sessions")
    p.add_argument("--shared-subscription-strategy", choices=["round_robin", "random"])
    p.add_argument("--response-information", metavar="PREFIX",
                   help="v5 Response Information returned when a client asks (PREFIX + client id)")
    p.add_argument("--queue-budget", type=int, metavar="BYTES",
                   help="bytes (payload + 256 per message) queued for all sessions of the node before it stops "
                        "reading from the publishers that fill them until half has drained (default 67108864; 0 = no budget)")
    p.add_argument("--store", metavar="URL",
                   help="where persistent sessions and retained messages live: memory:// (default, none "
                        "survive a restart), sqlite:///PATH (relative; sqlite:////PATH absolute; "
                        "?synchronous=full for power-loss safety) or hbase://HOST:PORT?table_prefix=NAME")
    p.add_argument("--control-plane", metavar="URL",
                   help="the console's database, whose tenants, credentials, ACLs and quotas this node enforces "
                        "(sqlite:///PATH or postgres://...; default: $DATABASE_URL if set; 'none' disables)")
    p.add_argument("--admin", metavar="HOST:PORT",
                   help="serve the admin API (HTTP + JSON, bearer tokens from the console or $BROKERD_ADMIN_TOKEN)")
    p.add_argument("--admin-max-connections", type=int, metavar="N",
                   help="admin API connections open at once; more are closed at accept, so the admin port can "
                        "never take the descriptors MQTT clients and the store need (default 64)")
    p.add_argument("--admin-timeout", type=float, metavar="SECONDS",
                   help="an admin API connection that has not sent a whole request this long after it opened "
                        "or after its last answer is closed (default 10)")
    p.add_argument("--admin-body-budget", type=int, metavar="BYTES",
                   help="request bodies the admin API holds at once, all connections together; a request that "
                        "would pass it gets 503 before its body is read (default 16777216; one body: at most "
                        "4 MiB)")
    p.add_argument("--cluster", metavar="URL",
                   help="join the cluster whose bus is this Redis (redis://HOST:PORT/DB[?prefix=NAME]); nodes "
                        "need a shared --store and distinct --node-id")
    p.add_argument("--cluster-listen", metavar="HOST:PORT",
                   help="address of this node's links to the other nodes (default 127.0.0.1:0)")
    p.add_argument("--cluster-secret-file", metavar="FILE",
                   help="file holding the cluster secret the node links prove (an HMAC challenge-response, the "
                        "secret never on the wire); or set BROKERD_CLUSTER_SECRET. Same on every node")
    p.add_argument("--cluster-tls-cert", metavar="PEM", help="this node's certificate for mutual TLS on the links")
    p.add_argument("--cluster-tls-key", metavar="PEM", help="its private key")
    p.add_argument("--cluster-tls-ca", metavar="PEM",
                   help="the cluster's CA: a link's other end must present a certificate it signed")
    p.add_argument("--cluster-claim-gap", type=float, metavar="SECONDS",
                   help="in a connect storm, the claims of client ids made while a claim call of several is on "
                        "its way to Redis wait until this long after its start and go together: less CPU per "
                        "CONNECT for up to this much CONNACK latency; a claim made when no call is on its way, "
                        "or after a call of one, goes at once (default 0.005; 0: no gap)")
    p.add_argument("--advertise-host", metavar="HOST",
                   help="name or address the other nodes reach this node's cluster link and admin API at "
                        "(default: the address they are bound to; this host's name when bound to 0.0.0.0 or ::)")
    p.add_argument("--server-reference", metavar="HOST:PORT",
                   help="where the other nodes send MQTT 5 clients they move to this node (DISCONNECT 0x9C "
                        "Server Reference; default: this node's first mqtt:// listener as advertised)")
    p.add_argument("--anonymous-tenant", metavar="SLUG",
                   help="tenant of clients without credentials when --allow-anonymous (default 'default')")
    p.add_argument("--workers", metavar="N",
                   help="worker processes on this host sharing every listener (SO_REUSEPORT), each a member of "
                        "the cluster; 'auto' = the usable cores. More than 1 needs --cluster and a shared --store "
                        "(default 1: one process)")
    p.add_argument("--sys-interval", type=float, metavar="SECONDS",
                   help="$SYS/broker publication interval, 0 disables (default 10)")
    p.add_argument("--usage-dir", metavar="PATH",
                   help="write the usage log (connections, per-minute traffic per tenant and topic; JSON Lines) "
                        "under PATH for the Spark reports (default: off)")
    p.add_argument("--usage-checkpoint", type=float, metavar="SECONDS",
                   help="rewrite the current minute's usage file with what it has counted so far every SECONDS, "
                        "so a crash loses at most that much of the usage log (default 5; 0: once a minute)")
    p.add_argument("--history-interval", type=float, metavar="SECONDS",
                   help="metrics history rows into the control plane's metrics_sample table every SECONDS "
                        "(default 60: per minute, as the console's charts expect; 0 disables)")
    p.add_argument("--rules-webhook-allow", metavar="LIST",
                   help="where rules' webhooks may go: 'public' (global addresses), addresses/CIDRs, host names "
                        "('.example.com': its subdomains), separated by commas (default: public; '' or 'none': "
                        "nowhere). Loopback, private and link-local addresses only if listed")
    p.add_argument("--rules-webhook-buffer", type=int, metavar="BYTES",
                   help="webhook requests waiting on this node, in bytes; the oldest is dropped past it (16 MiB)")
    p.add_argument("--rules-webhook-tenant-buffer", type=int, metavar="BYTES",
                   help="webhook requests waiting per tenant, in bytes; its oldest is dropped past it (1 MiB)")
    p.add_argument("--rules-webhook-concurrency", type=int, metavar="N",
                   help="webhook requests in flight on this node (16)")
    p.add_argument("--rules-store-buffer", type=int, metavar="BYTES",
                   help="store rules' rows waiting to be written on this node, in bytes; the oldest is dropped "
                        "past it (64 MiB)")
    p.add_argument("--rules-store-tenant-buffer", type=int, metavar="BYTES",
                   help="store rules' rows waiting per tenant, in bytes; its oldest is dropped past it (8 MiB)")
    p.add_argument("--rules-store-interval", type=float, metavar="SECONDS",
                   help="store rules' rows are written under --usage-dir/telemetry every SECONDS (5; a crash "
                        "loses at most that much)")
    p.add_argument("--max-delayed", type=int, metavar="N",
                   help="$delayed/{seconds}/{topic} messages pending per tenant (100000; a tenant's quota may "
                        "lower it); 0 turns delayed publish off")
    return p


def load(argv=None, environ=None) -> Config:
    import os

    environ = os.environ if environ is None else environ
    parser = _build_parser()
    args = parser.parse_args(argv)
    values = {}
    if environ.get("DATABASE_URL"):
        values["control_plane"] = environ["DATABASE_URL"]
    names = {f.name for f in dataclasses.fields(Config)}
    if not args.config and environ.get(ENV_PREFIX + "CONFIG"):
        args.config = environ[ENV_PREFIX + "CONFIG"]
    if args.config:
        try:
            with open(args.config, "rb") as fh:
                data = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read {args.config}: {exc}")
        for key, value in data.items():
            key = key.replace("-", "_")
            if key not in names:
                raise ConfigError(f"{args.config}: unknown setting {key!r}")
            values[key] = _check_type(key, value, args.config)
    values.update(from_environ(environ))
    for key, value in vars(args).items():
        if key != "config" and value is not None:
            values[key] = value
    if values.get("control_plane") in ("none", ""):
        values["control_plane"] = None
    return Config(**values).validate()

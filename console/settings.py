"""Console settings, all from the environment (see .env.example).

Embedded defaults need nothing: SQLite under var/, a generated secret key
under var/, in-memory channel layer. ``PRODUCTION=true`` (the container
image's default, docs/operations.md) generates nothing and guesses nothing:
SECRET_KEY, ALLOWED_HOSTS, DATABASE_URL and BROKERD_ADMIN_TOKEN must be
set (else the process stops with ImproperlyConfigured naming them), cookies
are secure, HSTS is sent on HTTPS requests, static files are served
compressed with hashed names from ``collectstatic``, logs are JSON lines.
"""

from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from core.brokerd_client import admin_urls
from spark_reports.spark import spark_conf
from tenants.onboarding import public_urls

from .env import console_public_url, envbool, envfloat, envint, envlist, envsecret, envstr, generated_secret
from .forwarded import parse_networks

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(envstr("VAR_DIR", str(BASE_DIR / "var")))

PRODUCTION = envbool("PRODUCTION", False)
_missing = [name for name, present in (
    ("SECRET_KEY", envsecret("SECRET_KEY")), ("ALLOWED_HOSTS", envstr("ALLOWED_HOSTS").strip()),
    ("DATABASE_URL", envsecret("DATABASE_URL")), ("BROKERD_ADMIN_TOKEN", envsecret("BROKERD_ADMIN_TOKEN")),
) if not present]
if PRODUCTION and _missing:
    raise ImproperlyConfigured(f"PRODUCTION=true needs {', '.join(_missing)} (or NAME_FILE) in the environment")

DEBUG = envbool("DEBUG", False)
SECRET_KEY = envsecret("SECRET_KEY") or generated_secret(VAR_DIR / "secret_key")
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    # the project's apps, ground floor first: core imports none of the others,
    # tenants/metrics/spark_reports import core (never console), console imports all
    "core",
    "tenants",
    "metrics",
    "spark_reports",
    "console",
    "django_celery_beat",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # an htmx request after the session ended opens the sign-in page as a page (core.middleware)
    "core.middleware.HtmxSignInMiddleware",
]

ROOT_URLCONF = "console.urls"
ASGI_APPLICATION = "console.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.console",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        envsecret("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'console.sqlite3'}", conn_max_age=600,
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # SQLite is shared with brokerd (history, audit) and the Celery processes.
    # A DEFERRED transaction that reads before it writes cannot wait for
    # another writer; SQLite fails it at once with "database is locked". So
    # writes start with BEGIN IMMEDIATE, a busy writer is waited for up to
    # SQLITE_BUSY_TIMEOUT (20) s, and WAL keeps readers and the writer from
    # blocking each other.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        transaction_mode="IMMEDIATE", timeout=envfloat("SQLITE_BUSY_TIMEOUT", 20.0),
        init_command="PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
# Every time the console shows (pages, emails, CSV) is labelled UTC, and report periods and schedule
# hours are UTC days and hours: shown in another zone they were the day before, "UTC" still beside
# them (TIME_ZONE used to come from the environment). Not a setting.
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [p for p in [BASE_DIR / "static"] if p.is_dir()]
STATIC_ROOT = VAR_DIR / "static"
# served by WhiteNoise inside daphne; without `collectstatic` (development,
# tests) straight from static/; in production from STATIC_ROOT, compressed,
# with content hashes in their names (cached for a year)
STATIC_ROOT = Path(envstr("STATIC_ROOT", str(STATIC_ROOT)))
WHITENOISE_USE_FINDERS = not PRODUCTION
if PRODUCTION:
    STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }

# The brokerd admin APIs the console acts through and its write-scoped token;
# `make run` shares a generated one with brokerd through var/admin_token. Any
# node answers for the cluster: BROKERD_ADMIN_URL lists nodes (comma-separated;
# one is enough to start), the console learns the others from the cluster's
# membership (GET /api/v1/nodes every BROKERD_ADMIN_DISCOVERY_INTERVAL seconds,
# 0: only the list), asks the node that answered last and fails over to the
# next when one gives no connection within BROKERD_ADMIN_CONNECT_TIMEOUT
# seconds (core/brokerd_client.py: which requests are repeated on another node).
BROKERD_ADMIN_URL = envstr("BROKERD_ADMIN_URL", "http://127.0.0.1:18083")
try:
    admin_urls(BROKERD_ADMIN_URL)
except ValueError as exc:
    raise ImproperlyConfigured(str(exc)) from None
BROKERD_ADMIN_CONNECT_TIMEOUT = envfloat("BROKERD_ADMIN_CONNECT_TIMEOUT", 1.0)
BROKERD_ADMIN_DISCOVERY_INTERVAL = envfloat("BROKERD_ADMIN_DISCOVERY_INTERVAL", 10.0)
BROKERD_ADMIN_TOKEN = envsecret("BROKERD_ADMIN_TOKEN") or generated_secret(VAR_DIR / "admin_token")
# Where devices reach the broker, as the "Connect this device" panel shows it
# (tenants/onboarding.py): comma-separated mqtt://, mqtts://, ws://, wss://
# URLs. Empty (the default): the URLs the live nodes advertise (GET
# /api/v1/nodes, each node's listeners with --advertise-host); set it when
# devices reach the nodes under other names or ports (containers, NAT, a load
# balancer), and the page needs no answer from brokerd.
try:
    MQTT_PUBLIC_URLS = public_urls(envstr("MQTT_PUBLIC_URLS", ""))
except ValueError as exc:
    raise ImproperlyConfigured(str(exc)) from None

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"
SESSION_COOKIE_HTTPONLY = True
# Behind TLS (daphne's own TLS port, or a proxy that terminates TLS and says so
# in X-Forwarded-Proto with TRUST_X_FORWARDED_PROTO=true): secure cookies and
# HSTS (SecurityMiddleware sends it on HTTPS requests only).
SESSION_COOKIE_SECURE = envbool("SECURE_COOKIES", PRODUCTION)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SESSION_COOKIE_SAMESITE = "Lax"
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 31536000 if SESSION_COOKIE_SECURE else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", False)
# whether every subdomain is HTTPS-only, and asking for the browsers' preload
# list, are the domain owner's decisions: off unless set, and not warned about
SILENCED_SYSTEM_CHECKS = ["security.W005", "security.W021"]
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", PRODUCTION)
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]            # health checks come over plain HTTP from inside
if envbool("TRUST_X_FORWARDED_PROTO", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# The proxies in front of daphne (addresses or networks, comma-separated):
# only a request from one of them has its X-Forwarded-For / X-Forwarded-Proto
# believed (console/forwarded.py). Empty (the default): the socket's peer is
# the client -- what the login throttle and the audit log record.
TRUSTED_PROXIES = envlist("TRUSTED_PROXIES")
parse_networks(TRUSTED_PROXIES)         # a typo stops the process here, not at the first request
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS")
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# failed logins: after LOGIN_FAILURE_LIMIT failures for a username or from an
# address within LOGIN_FAILURE_WINDOW seconds, that username/address waits the window out
LOGIN_FAILURE_LIMIT = envint("LOGIN_FAILURE_LIMIT", 5)
LOGIN_FAILURE_WINDOW = envint("LOGIN_FAILURE_WINDOW", 900)

REDIS_URL = envsecret("REDIS_URL") or ""
if REDIS_URL:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                  "CONFIG": {"hosts": [REDIS_URL]}}}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Live metrics (metrics/hub.py): each console process polls brokerd's
# GET /api/v1/metrics every METRICS_POLL_INTERVAL seconds, streams the
# dashboards over websockets and raises/clears alarms: a tenant at
# METRICS_ALARM_QUOTA_PERCENT of a quota (rate quotas for 5 s), a node not ok
# for METRICS_ALARM_NODE_DOWN_AFTER seconds, a tenant dropping at least
# METRICS_ALARM_DROPS_RATE messages/s (not counting "no subscribers") for
# METRICS_ALARM_DROPS_FOR seconds (cleared after METRICS_ALARM_DROPS_CLEAR_FOR
# seconds below). METRICS_HUB=false: no polling in this process.
METRICS_HUB = envbool("METRICS_HUB", True)
METRICS_POLL_INTERVAL = envfloat("METRICS_POLL_INTERVAL", 1.0)
METRICS_ALARMS = envbool("METRICS_ALARMS", True)
METRICS_ALARM_QUOTA_PERCENT = envfloat("METRICS_ALARM_QUOTA_PERCENT", 90)
METRICS_ALARM_NODE_DOWN_AFTER = envfloat("METRICS_ALARM_NODE_DOWN_AFTER", 3)
METRICS_ALARM_DROPS_RATE = envfloat("METRICS_ALARM_DROPS_RATE", 10)
METRICS_ALARM_DROPS_FOR = envfloat("METRICS_ALARM_DROPS_FOR", 10)
METRICS_ALARM_DROPS_CLEAR_FOR = envfloat("METRICS_ALARM_DROPS_CLEAR_FOR", 30)

# Usage reports (spark_reports, README *Usage reports*): PySpark jobs over the
# usage log brokerd writes under USAGE_DIR (a local path, or any Hadoop
# filesystem URI: hdfs://..., s3a://...), run by Celery workers. Celery's
# broker is Redis when REDIS_URL is set, else kombu's filesystem transport
# under CELERY_BROKER_DIR (no server); results live in ReportRun, not Celery.
# Beat reads its schedule from the database (django-celery-beat): one periodic
# task every REPORTS_DISPATCH_INTERVAL seconds starts the ReportSchedules due.
USAGE_DIR = envstr("USAGE_DIR", str(VAR_DIR / "usage"))
SPARK_MASTER = envstr("SPARK_MASTER", "local[*]")
SPARK_SHUFFLE_PARTITIONS = envint("SPARK_SHUFFLE_PARTITIONS", 4)
SPARK_DRIVER_MEMORY = envstr("SPARK_DRIVER_MEMORY", "1g")
SPARK_CONF = envstr("SPARK_CONF", "")      # more Spark properties: spark.NAME=VALUE;spark.NAME=VALUE
# the driver JVM's class-data sharing archives (spark_reports/cds.py); "off": none
SPARK_CDS_DIR = envstr("SPARK_CDS_DIR", str(VAR_DIR / "spark-cds"))
try:
    spark_conf(SPARK_CONF)
except ValueError as exc:
    raise ImproperlyConfigured(str(exc)) from None
REPORTS_TOP_N = envint("REPORTS_TOP_N", 10)
REPORTS_MAX_RETRIES = envint("REPORTS_MAX_RETRIES", 3)
# rules a tenant may have (enabled or not): each rule matching a topic runs for every message of it, and
# every rule rides in the tenant's policy snapshot, which each node fetches and compiles
RULES_MAX_PER_TENANT = envint("RULES_MAX_PER_TENANT", 100)
REPORTS_RETRY_BACKOFF = envint("REPORTS_RETRY_BACKOFF", 30)  # seconds before the first retry, doubled each time
REPORTS_DISPATCH_INTERVAL = envint("REPORTS_DISPATCH_INTERVAL", 60)
# A schedule whose runs were missed (beat or the workers down) runs once per missed period, at most
# REPORTS_MAX_CATCH_UP of them (the latest) when dispatch comes back
REPORTS_MAX_CATCH_UP = envint("REPORTS_MAX_CATCH_UP", 7)
# A running report's worker marks it alive every REPORTS_HEARTBEAT seconds; beat's dispatch queues again
# a run not marked for REPORTS_STALLED_AFTER seconds (its worker was killed: a deploy, the OOM killer)
REPORTS_HEARTBEAT = envint("REPORTS_HEARTBEAT", 30)
REPORTS_STALLED_AFTER = envint("REPORTS_STALLED_AFTER", 300)
# A tenant's reports waiting or running at once: past it "Run report", "Send now" and "Retry" are refused
# (scheduled runs are not, and count); and the schedules a tenant may have
REPORTS_MAX_PENDING = envint("REPORTS_MAX_PENDING", 3)
REPORTS_MAX_SCHEDULES = envint("REPORTS_MAX_SCHEDULES", 20)
# A tenant's ACL rules: every node holds them and, for each client, checks a topic it has not seen
# against them one by one (100,000 ACL rules: 0.2 s a CONNECT and 0.3 s a PUBLISH to a new topic, the
# node's loop stopped for every tenant meanwhile); its rules: RULES_MAX_PER_TENANT
TENANT_MAX_ACL_RULES = envint("TENANT_MAX_ACL_RULES", 1000)
# The usage lake (spark_reports/lake.py): landed files compacted into Parquet
# under USAGE_LAKE (a path or Hadoop URI) every LAKE_COMPACT_INTERVAL seconds
# (0: never by beat), minutes LAKE_SETTLE s after they closed; a compacted
# landed file is deleted LAKE_KEEP_LANDED s after its commit.
USAGE_LAKE = envstr("USAGE_LAKE", "")          # "": USAGE_DIR/lake
LAKE_COMPACT_INTERVAL = envint("LAKE_COMPACT_INTERVAL", 300)
LAKE_SETTLE = envint("LAKE_SETTLE", 120)
LAKE_KEEP_LANDED = envint("LAKE_KEEP_LANDED", 900)
LAKE_ROW_GROUP_BYTES = envint("LAKE_ROW_GROUP_BYTES", 1 << 20)
CELERY_BROKER_URL = envstr("CELERY_BROKER_URL", REDIS_URL or "filesystem://")
CELERY_BROKER_DIR = Path(envstr("CELERY_BROKER_DIR", str(VAR_DIR / "celery")))
if CELERY_BROKER_URL.startswith("filesystem:"):
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(CELERY_BROKER_DIR / "queue"),
        "data_folder_out": str(CELERY_BROKER_DIR / "queue"),
        "control_folder": str(CELERY_BROKER_DIR / "control"),
        "store_processed": False,
    }
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = TIME_ZONE
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# Email (scheduled reports): files under EMAIL_FILE_PATH by default; SMTP with
# EMAIL_URL (smtp://USER:PASSWORD@HOST:587?tls=true, smtps://...:465) or
# EMAIL_HOST / EMAIL_PORT / EMAIL_HOST_USER / EMAIL_HOST_PASSWORD / EMAIL_USE_TLS.
DEFAULT_FROM_EMAIL = envstr("DEFAULT_FROM_EMAIL", "mqtthub reports <reports@localhost>")
EMAIL_FILE_PATH = envstr("EMAIL_FILE_PATH", str(VAR_DIR / "mail"))
EMAIL_TIMEOUT = envint("EMAIL_TIMEOUT", 30)
_email_url = envsecret("EMAIL_URL")
if _email_url:
    from urllib.parse import parse_qs, unquote, urlsplit

    _u = urlsplit(_email_url)
    _q = {k: v[-1].lower() for k, v in parse_qs(_u.query).items()}
    EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    EMAIL_HOST = _u.hostname or "localhost"
    EMAIL_USE_SSL = _u.scheme == "smtps"
    EMAIL_USE_TLS = not EMAIL_USE_SSL and _q.get("tls", "false") in ("1", "true", "yes", "on")
    EMAIL_PORT = _u.port or (465 if EMAIL_USE_SSL else 587 if EMAIL_USE_TLS else 25)
    EMAIL_HOST_USER = unquote(_u.username or "")
    EMAIL_HOST_PASSWORD = unquote(_u.password or "")
elif envstr("EMAIL_HOST"):
    EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    EMAIL_HOST = envstr("EMAIL_HOST")
    EMAIL_PORT = envint("EMAIL_PORT", 587)
    EMAIL_HOST_USER = envstr("EMAIL_HOST_USER", envstr("EMAIL_USER"))
    EMAIL_HOST_PASSWORD = envsecret("EMAIL_HOST_PASSWORD") or envsecret("EMAIL_PASSWORD") or ""
    EMAIL_USE_TLS = envbool("EMAIL_USE_TLS", True)
else:
    EMAIL_BACKEND = envstr("EMAIL_BACKEND", "django.core.mail.backends.filebased.EmailBackend")
# Where people reach the console: the links in emails (a scheduled report's
# "Open the report"). Default: the address `make run` serves on (CONSOLE_HOST,
# CONSOLE_PORT); in production https:// and the first of ALLOWED_HOSTS.
CONSOLE_PUBLIC_URL = console_public_url(envstr("CONSOLE_PUBLIC_URL", ""), PRODUCTION, ALLOWED_HOSTS,
                                        envstr("CONSOLE_HOST", "127.0.0.1"), envstr("CONSOLE_PORT", "8000"))
# The tenant brokerd puts clients without a user name in (brokerd
# --allow-anonymous --anonymous-tenant): a real tenant in the console, made by
# `manage.py console_bootstrap` (make run) and marked "anonymous clients".
# Empty (production's default, where brokerd refuses anonymous clients): none.
ANONYMOUS_TENANT = envstr("ANONYMOUS_TENANT", "" if PRODUCTION else "default")

# Logs go to stdout; LOG_FORMAT=json (production's default) writes one JSON
# object a line (time, level, logger, message, and any extra fields) for a log
# collector, text a plain line for people.
LOG_FORMAT = envstr("LOG_FORMAT", "json" if PRODUCTION else "text")
if LOG_FORMAT not in ("json", "text"):
    raise ImproperlyConfigured(f"LOG_FORMAT={LOG_FORMAT!r}: expected json or text")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "pythonjsonlogger.json.JsonFormatter",
                 "fmt": "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s",
                 "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger", "process": "pid"}},
        "text": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
    },
    "filters": {"quiet_403": {"()": "core.logfilters.PermissionDeniedWithoutTraceback"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "stream": "ext://sys.stdout",
                             "formatter": LOG_FORMAT}},
    "loggers": {"django.request": {"filters": ["quiet_403"]}},
    "root": {"handlers": ["console"], "level": envstr("LOG_LEVEL", "INFO").upper()},
}

"""docker/compose.yaml and docker/Dockerfile checked against the code they run.

No Docker engine runs here (docs/operations.md), so these tests read the
compose file as compose would (tests/deploy/compose.py) and hold every
service's command, environment and ports against what the code reads: the
entry point's roles, brokerd's own configuration loader, the console's
production settings loaded in a real Django process, and the Dockerfile.
"""

import json
import os
import re
import secrets
import subprocess
import sys
from urllib.parse import parse_qs, urlsplit

import pytest

from brokerd.config import ENV_PREFIX, Config, from_environ
from brokerd.config import load as load_brokerd_config
from tenants.onboarding import public_urls

from .compose import (
    DOCKER,
    IMAGE_SERVICES,
    ROOT,
    MissingVariable,
    environment,
    interpolate,
    load,
    read_env_file,
)

BROKERD_NODES = ("brokerd1", "brokerd2", "brokerd3")
DJANGO_SERVICES = ("migrate", "console", "worker", "beat")
CODE_DIRS = ("core", "console", "tenants", "metrics", "spark_reports", "brokerd")


def filled_in(env: dict[str, str]) -> dict[str, str]:
    """docker/.env.example with every "change-me" replaced, as docs/operations.md
    has the operator do (``openssl rand -hex 32``)."""
    return {k: secrets.token_hex(32) if v == "change-me" else v for k, v in env.items()}


@pytest.fixture(scope="module")
def compose():
    return load(filled_in(read_env_file(DOCKER / ".env.example")))


@pytest.fixture(scope="module")
def env_example():
    return read_env_file(DOCKER / ".env.example")


def entrypoint_roles() -> set[str]:
    text = (DOCKER / "entrypoint.sh").read_text()
    return set(re.findall(r"^    ([a-z-]+)\)$", text, re.M))


def published(service: dict) -> dict[int, int]:
    """container port -> host port"""
    out = {}
    for spec in service.get("ports", ()):
        host, _, container = str(spec).rpartition(":")
        out[int(container)] = int(host)
    return out


def mounts(service: dict) -> dict[str, str]:
    """container path -> source (volume name or ./path)"""
    out = {}
    for spec in service.get("volumes", ()):
        source, target = spec.split(":")[:2]
        out[target] = source
    return out


# ------------------------------------------------------------------ the file itself

def test_compose_needs_every_secret_and_the_example_names_them(env_example):
    raw = "\n".join(ln for ln in (DOCKER / "compose.yaml").read_text().splitlines() if not ln.lstrip().startswith("#"))
    required = set(re.findall(r"\$\{([A-Z_]+):\?", raw))
    assert {"SECRET_KEY", "POSTGRES_PASSWORD", "REDIS_PASSWORD", "BROKERD_ADMIN_TOKEN", "ALLOWED_HOSTS",
            "CONSOLE_ADMIN_PASSWORD"} <= required
    assert required <= set(env_example), f"not in docker/.env.example: {required - set(env_example)}"
    for name in sorted(required):
        env = dict(env_example)
        del env[name]
        with pytest.raises(MissingVariable, match=name):
            load(env)
    # every variable of the example is used by the compose file (no dead settings)
    used = set(re.findall(r"\$\{([A-Z_0-9]+)", raw))
    assert set(env_example) <= used, f"docker/.env.example sets unused {set(env_example) - used}"


def test_interpolation_as_compose_does_it():
    env = {"A": "x", "E": ""}
    assert interpolate("${A}-${B:-d}-${E:-e}-${E-f}-$$A", env) == "x-d-e--$A"
    with pytest.raises(MissingVariable):
        interpolate("${E:?needed}", env)


def test_every_image_service_runs_a_role_of_the_entry_point(compose):
    roles = entrypoint_roles()
    assert {"brokerd", "console", "worker", "beat", "migrate", "spark-master", "spark-worker", "healthcheck"} <= roles
    services = compose["services"]
    assert set(IMAGE_SERVICES) <= set(services)
    for name in IMAGE_SERVICES:
        svc = services[name]
        assert svc["image"] == "mqtthub:latest" and svc["build"]["dockerfile"] == "docker/Dockerfile", name
        assert svc["command"][0] in roles, f"{name}: command {svc['command']} is no role of docker/entrypoint.sh"
    assert services["migrate"]["restart"] == "no"
    for name in ("console", "worker", "beat", *BROKERD_NODES):
        deps = services[name]["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully", name
    assert services["spark-master"]["profiles"] == services["spark-worker"]["profiles"] == ["spark"]


# ------------------------------------------------------------------ brokerd nodes

def test_brokerd_nodes_load_their_configuration_and_agree(compose):
    services = compose["services"]
    configs = {}
    for name in BROKERD_NODES:
        svc = services[name]
        env = environment(svc)
        unknown = [k for k in env if k.startswith(ENV_PREFIX) and k not in ("BROKERD_ADMIN_TOKEN", "BROKERD_ADMIN_TOKEN_PREVIOUS")
                   and k[len(ENV_PREFIX):].lower() not in Config.__dataclass_fields__]
        assert not unknown, f"{name}: brokerd reads no {unknown}"
        assert set(from_environ(env)) >= {"listen", "store", "cluster", "admin", "node_id", "advertise_host"}
        cfg = load_brokerd_config([], environ=env)          # validates like `python -m brokerd` does
        configs[name] = cfg
        # other nodes reach it by its service name; clients by the published port
        assert cfg.advertise_host == svc["hostname"] == name
        ports = published(svc)
        listener_ports = {lst.port for lst in cfg.listeners()}
        assert set(ports) == listener_ports, f"{name}: published {sorted(ports)}, listeners {sorted(listener_ports)}"
        assert {lst.scheme for lst in cfg.listeners()} == {"mqtt", "mqtts", "ws", "wss"}
        ref_host, _, ref_port = cfg.server_reference.rpartition(":")
        assert int(ref_port) == ports[1883] and ref_host == "localhost"
        # TLS files come from the mounted certificate directory
        tls_dir = os.path.dirname(cfg.tls_cert)
        assert mounts(svc)[tls_dir] == "./tls" and os.path.dirname(cfg.tls_key) == tls_dir
        # the usage log lands in the volume the report worker reads
        assert mounts(svc)[cfg.usage_dir] == "usage"
        assert cfg.allow_anonymous is False
    assert len({c.node_id for c in configs.values()}) == 3
    shared = {(c.store, c.cluster, c.control_plane, c.admin, c.cluster_listen) for c in configs.values()}
    assert len(shared) == 1, "the nodes must share one store, bus and control plane"
    store, cluster, control, admin, _ = shared.pop()
    assert urlsplit(store).hostname == "hbase" and urlsplit(store).port == 9090
    assert urlsplit(cluster).hostname == "redis" and urlsplit(cluster).password
    # the bus over TLS, the node links authenticated (secret and mutual TLS), certificates from ./tls
    assert urlsplit(cluster).scheme == "rediss"
    for cfg in configs.values():
        svc_mounts = mounts(services[cfg.advertise_host])
        assert cfg.link_secret() and len(cfg.link_secret()) >= 32
        ca = parse_qs(urlsplit(cfg.cluster).query)["ssl_ca_certs"][0]
        for path in (ca, cfg.cluster_tls_cert, cfg.cluster_tls_key, cfg.cluster_tls_ca):
            assert svc_mounts[os.path.dirname(path)] == "./tls", path
    assert urlsplit(control).hostname == "postgres"
    assert {urlsplit(u).hostname for u in (store, cluster, control)} <= set(services)
    # admin API and cluster links stay inside the network
    assert int(admin.rpartition(":")[2]) not in published(services["brokerd1"])


def test_the_console_and_the_nodes_share_the_database_token_and_admin_api(compose):
    services = compose["services"]
    node_env = environment(services["brokerd1"])
    node_cfg = load_brokerd_config([], environ=node_env)
    for name in DJANGO_SERVICES:
        env = environment(services[name])
        assert env["DATABASE_URL"] == node_cfg.control_plane, name
        assert env["BROKERD_ADMIN_TOKEN"] == node_env["BROKERD_ADMIN_TOKEN"], name
        # every node's admin API, so the console survives any one of them
        admins = [urlsplit(u.strip()) for u in env["BROKERD_ADMIN_URL"].split(",")]
        assert sorted(a.hostname for a in admins) == sorted(BROKERD_NODES), name
        assert {a.port for a in admins} == {int(node_cfg.admin.rpartition(":")[2])}, name
        assert urlsplit(env["REDIS_URL"]).hostname == "redis"
        assert urlsplit(env["REDIS_URL"]).password == urlsplit(node_cfg.cluster).password
    worker = services["worker"]
    assert mounts(worker)[environment(worker)["USAGE_DIR"]] == "usage"
    assert mounts(services["spark-worker"])["/data/usage"] == "usage"
    console = services["console"]
    cenv = environment(console)
    assert published(console) == {int(cenv["CONSOLE_PORT"]): 8443}
    assert mounts(console)[os.path.dirname(cenv["CONSOLE_TLS_CERT"])] == "./tls"


def test_the_console_tells_devices_every_nodes_published_listeners(compose):
    """The "Connect this device" panel's MQTT_PUBLIC_URLS: each node's listeners at PUBLIC_HOST on the
    ports published for them (the nodes themselves advertise their names inside the network)."""
    services = compose["services"]
    env = read_env_file(DOCKER / ".env.example")
    expected = set()
    for name in BROKERD_NODES:
        cfg = load_brokerd_config([], environ=environment(services[name]))
        ports = published(services[name])
        expected |= {f"{lst.scheme}://{env['PUBLIC_HOST']}:{ports[lst.port]}{lst.path}" for lst in cfg.listeners()}
    urls = public_urls(environment(services["console"])["MQTT_PUBLIC_URLS"])
    assert len(urls) == len(expected) == 12 and set(urls) == expected
    # a URL no device could use stops the console at start-up, naming the setting
    bad = {**environment(services["console"]), "MQTT_PUBLIC_URLS": "mqtt://0.0.0.0:1883"}
    proc = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], **bad}, timeout=60)
    assert proc.returncode != 0 and "MQTT_PUBLIC_URLS: 'mqtt://0.0.0.0:1883': no host a device can reach" \
        in proc.stderr, proc.stderr[-500:]


def _settings_of(env: dict) -> dict:
    code = ("import json, django; django.setup(); from django.conf import settings as s\n"
            "print(json.dumps({'PRODUCTION': s.PRODUCTION, 'DEBUG': s.DEBUG, 'db': s.DATABASES['default']['ENGINE'],"
            " 'db_host': s.DATABASES['default']['HOST'], 'layer': s.CHANNEL_LAYERS['default']['BACKEND'],"
            " 'celery': s.CELERY_BROKER_URL, 'secure': s.SESSION_COOKIE_SECURE and s.CSRF_COOKIE_SECURE,"
            " 'hsts': s.SECURE_HSTS_SECONDS, 'static': s.STORAGES['staticfiles']['BACKEND'],"
            " 'log': s.LOG_FORMAT, 'email': s.EMAIL_BACKEND, 'hosts': s.ALLOWED_HOSTS,"
            " 'usage': s.USAGE_DIR, 'spark': s.SPARK_MASTER}))")
    full = {"PATH": os.environ["PATH"], "DJANGO_SETTINGS_MODULE": "console.settings", **env}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_django_services_load_the_production_settings(compose):
    services = compose["services"]
    seen = {}
    for name in DJANGO_SERVICES:
        env = environment(services[name])
        key = json.dumps(sorted((k, v) for k, v in env.items() if not k.startswith("CONSOLE_")))
        if key not in seen:
            seen[key] = _settings_of(env)
        s = seen[key]
        assert s["PRODUCTION"] is True and s["DEBUG"] is False, name
        assert (s["db"], s["db_host"]) == ("django.db.backends.postgresql", "postgres"), name
        assert s["layer"] == "channels_redis.core.RedisChannelLayer", name
        assert s["celery"].startswith("rediss://") and urlsplit(s["celery"]).hostname == "redis", name
        assert s["secure"] and s["hsts"] >= 31536000, name
        assert s["static"] == "whitenoise.storage.CompressedManifestStaticFilesStorage"
        assert s["log"] == "json" and s["hosts"] == ["localhost"]
        assert s["usage"] == "/data/usage" and s["spark"] == "local[*]"
        assert s["email"] == "django.core.mail.backends.filebased.EmailBackend"   # EMAIL_URL empty in the example


def test_production_settings_refuse_to_start_without_their_secrets(compose):
    env = environment(compose["services"]["console"])
    for name in ("SECRET_KEY", "DATABASE_URL", "ALLOWED_HOSTS", "BROKERD_ADMIN_TOKEN"):
        partial = {k: v for k, v in env.items() if k != name}
        proc = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, capture_output=True, text=True,
                              env={"PATH": os.environ["PATH"], **partial}, timeout=60)
        assert proc.returncode != 0 and f"PRODUCTION=true needs {name}" in proc.stderr, proc.stderr[-500:]


def test_production_settings_pass_the_deploy_checks(compose):
    env = environment(compose["services"]["console"])
    env["SECRET_KEY"] = "x" * 20 + "-a-long-random-secret-key-for-the-deploy-check-only"
    proc = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], cwd=ROOT,
                          capture_output=True, text=True, env={"PATH": os.environ["PATH"], **env}, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _code_text() -> str:
    parts = [(DOCKER / "entrypoint.sh").read_text(), (DOCKER / "healthcheck.py").read_text()]
    for d in CODE_DIRS:
        parts += [p.read_text() for p in (ROOT / d).rglob("*.py")]
    return "\n".join(parts)


def test_every_variable_a_service_sets_is_read_by_the_code(compose):
    code = _code_text()
    for name in IMAGE_SERVICES:
        for var in environment(compose["services"][name]):
            if var.startswith(ENV_PREFIX) and var[len(ENV_PREFIX):].lower() in Config.__dataclass_fields__:
                continue            # brokerd flags, read through brokerd.config.from_environ
            assert re.search(rf"""["']{var}["']|\${{{var}\b|\${var}\b""", code), f"{name}: nothing reads {var}"


# ------------------------------------------------------------------ the image

def test_dockerfile_is_multi_stage_non_root_with_health_check(compose):
    text = (DOCKER / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    assert len(stages) >= 2, "a build stage and a runtime stage"
    final = stages[-1]
    assert "COPY --from=build /opt/venv /opt/venv" in final
    assert not re.search(r"build-essential|\bgcc\b|-dev\b", final), "no build tools in the final stage"
    user = re.findall(r"^USER (\S+)", final, re.M)
    assert user and user[-1] not in ("root", "0")
    assert re.search(r'^HEALTHCHECK .*CMD \["mqtthub", "healthcheck"\]', final, re.M)
    assert re.search(r'^ENTRYPOINT \["tini", "--", "mqtthub"\]', final, re.M)
    assert "openjdk-17-jre-headless" in final                       # PySpark in the worker
    # what the image copies exists in the repository
    for m in re.finditer(r"^COPY (?!--from)(?:--\S+ )*(.+) \S+$", text, re.M):
        for src in m.group(1).split():
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
    # every port a service publishes is one the image exposes
    exposed = {int(p) for line in re.findall(r"^EXPOSE (.+)$", final, re.M) for p in line.split()}
    for name in IMAGE_SERVICES:
        assert set(published(compose["services"][name])) <= exposed, name
    for role in ("brokerd", "console", "worker", "beat", "spark-master", "spark-worker"):
        assert role in (DOCKER / "healthcheck.py").read_text()


def test_entry_point_refuses_an_unknown_role():
    proc = subprocess.run([str(DOCKER / "entrypoint.sh"), "nope"], capture_output=True, text=True, timeout=10)
    assert proc.returncode == 64 and "unknown role 'nope'" in proc.stderr


def test_redis_speaks_only_tls_with_the_certificates_cluster_certs_makes(compose, tmp_path):
    """docker/cluster-certs.sh issues what the compose file mounts from ./tls,
    signed by one CA; Redis listens on TLS only, with a password, and every
    Django service that reaches it can read the CA."""
    subprocess.run([str(DOCKER / "cluster-certs.sh"), str(tmp_path)], check=True, capture_output=True, timeout=60)
    made = {p.name for p in tmp_path.iterdir()}
    services = compose["services"]
    redis = services["redis"]
    command = redis["command"]
    flags = dict(zip(command[1::2], command[2::2], strict=False))
    assert flags["--port"] == "0" and flags["--tls-port"] == "6379" and flags["--requirepass"]
    wanted = set()
    tls_mount = {v: k for k, v in mounts(redis).items()}["./tls"]
    for flag in ("--tls-cert-file", "--tls-key-file", "--tls-ca-cert-file"):
        assert os.path.dirname(flags[flag]) == tls_mount
        wanted.add(os.path.basename(flags[flag]))
    for name in (*BROKERD_NODES, *DJANGO_SERVICES):
        for key, value in environment(services[name]).items():
            for path in re.findall(r"/run/tls/([\w.-]+)", value):
                if name != "migrate":              # migrate never opens Redis
                    assert mounts(services[name])["/run/tls"] == "./tls", (name, key)
                wanted.add(path)
    wanted -= {"server.crt", "server.key"}       # the public certificate, the operator's own
    assert wanted <= made, f"compose mounts {wanted - made}, which cluster-certs.sh does not make"
    for cert in ("redis.crt", "cluster-node.crt"):
        proc = subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "cluster-ca.crt"), str(tmp_path / cert)],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stdout + proc.stderr

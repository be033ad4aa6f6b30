"""Reading settings from the environment (after healthchecks' hc/settings.py).

Every ``envsecret`` also accepts ``NAME_FILE`` naming a file that holds the
value, for Docker/Kubernetes secrets.
"""

import os
import secrets
from pathlib import Path


def envbool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={value!r}: expected true/false")


def envint(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def envfloat(name: str, default: float) -> float:
    value = os.environ.get(name)
    return default if value in (None, "") else float(value)


def envstr(name: str, default: str = "") -> str:
    value = os.environ.get(name)
    return default if value is None else value


def envlist(name: str, default: str = "") -> list[str]:
    return [v.strip() for v in envstr(name, default).split(",") if v.strip()]


def envsecret(name: str) -> str | None:
    value = os.environ.get(name)
    if value:
        return value
    path = os.environ.get(name + "_FILE")
    if path:
        return Path(path).read_text().strip()
    return None


def generated_secret(path: Path) -> str:
    """A random secret kept in ``path`` (created 0600 on first use): the
    embedded default for a single machine. Production sets the variable."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        value = secrets.token_urlsafe(50)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(value)
        return value


def console_public_url(value: str, production: bool, allowed_hosts: list[str], host: str, port: str) -> str:
    """The console's address as people reach it, ending in "/": ``value`` when
    set (http:// or https://, else ImproperlyConfigured), else in production
    https:// and the first concrete name of ALLOWED_HOSTS, else the address
    daphne listens on (CONSOLE_HOST, CONSOLE_PORT)."""
    from urllib.parse import urlsplit

    from django.core.exceptions import ImproperlyConfigured

    if value:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ImproperlyConfigured(f"CONSOLE_PUBLIC_URL={value!r}: expected http(s)://HOST[:PORT][/PATH]")
        return value if value.endswith("/") else value + "/"
    names = [h for h in allowed_hosts if h and h != "*" and not h.startswith(".")]
    if production and names:
        return f"https://{names[0]}/"
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}/"

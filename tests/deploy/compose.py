"""Reading docker/compose.yaml as ``docker compose`` would, without Docker:
``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?error}`` and
``$$`` interpolated from an environment (docker/.env.example's values in the
tests), YAML merge keys resolved by the YAML loader."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
DOCKER = ROOT / "docker"
IMAGE_SERVICES = ("migrate", "brokerd1", "brokerd2", "brokerd3", "console", "worker", "beat",
                  "spark-master", "spark-worker")

_VAR = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


class MissingVariable(KeyError):
    pass


def read_env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


def interpolate(value, env: dict[str, str]):
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m):
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group("name"), m.group("op"), m.group("arg")
        present = env.get(name)
        unset = present is None or (op is not None and op.startswith(":") and present == "")
        if op in (":?", "?") and unset:
            raise MissingVariable(f"{name}: {arg}")
        if op in (":-", "-") and unset:
            return interpolate(arg, env)
        return present or ""

    return _VAR.sub(sub, value)


def load(env: dict[str, str] | None = None) -> dict:
    raw = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    env = read_env_file(DOCKER / ".env.example") if env is None else env
    return interpolate(raw, env)


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}

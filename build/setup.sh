#!/usr/bin/env bash
# Installs what `make run` / `make test` need and is missing: Debian packages
# (when running as root), the virtualenv and the pinned Python packages.
# Idempotent: a stamp file records the hash of pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

missing=""
for cmd_pkg in mosquitto:mosquitto mosquitto_pub:mosquitto-clients redis-server:redis-server chromium:chromium java:openjdk-17-jre-headless; do
  cmd=${cmd_pkg%%:*}; pkg=${cmd_pkg#*:}
  command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || missing="$missing $pkg"
done
# PostgreSQL's server binaries (tests/deploy starts a private cluster with them)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$missing postgresql"
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing Debian packages:$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || true
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
  else
    echo "setup: missing Debian packages:$missing (run as root or: sudo apt-get install$missing)" >&2
  fi
fi

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "setup: $PYTHON is not Python 3.11 or later ($("$PYTHON" --version 2>&1 | head -1)); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
# A virtualenv needs ensurepip, which Debian ships apart (python3.X-venv): without it `python3 -m venv`
# fails half-way, leaving a .venv with a python and no pip.
if [ ! -x "$VENV/bin/python" ] || [ ! -x "$VENV/bin/pip" ]; then
  if ! "$PYTHON" -c 'import ensurepip' >/dev/null 2>&1; then
    pkg="python$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "setup: installing Debian package $pkg (venv's ensurepip)"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq || true
      apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null
    else
      echo "setup: $PYTHON cannot make a virtualenv (no ensurepip): run as root or: sudo apt-get install $pkg" >&2
      exit 1
    fi
  fi
  echo "setup: creating $VENV"
  "$PYTHON" -m venv --clear "$VENV"        # (--clear: the half-made one too, with its stamp)
fi
stamp="$VENV/.installed-$(sha256sum pyproject.toml build/constraints-mqtt-codec.txt | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "setup: installing Python packages (pinned in pyproject.toml)"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade "pip>=23" wheel
  # mqtt-codec is sdist-only and its setup.py needs setuptools<58 in its build env:
  # PIP_CONSTRAINT reaches the build env up to pip 26.1, PIP_BUILD_CONSTRAINT from pip 25.3 on.
  codec=$("$VENV/bin/python" build/requirements.py | grep '^mqtt-codec')
  PIP_CONSTRAINT="$PWD/build/constraints-mqtt-codec.txt" PIP_BUILD_CONSTRAINT="$PWD/build/constraints-mqtt-codec.txt" \
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$codec"
  "$VENV/bin/python" build/requirements.py test > "$VENV/requirements.txt"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$VENV/requirements.txt"
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
mkdir -p var

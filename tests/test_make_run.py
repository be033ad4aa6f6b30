"""`make run` (build/run.py) on a fresh directory: everything starts, the
banner tells how to reach it, and the parts reach each other."""

import http.cookiejar
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.parse
import urllib.request

import pytest

from .mqtt import PahoClient
from .procs import ROOT, free_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    var = tmp_path_factory.mktemp("var")
    ports = {k: free_port() for k in ("BROKERD_MQTT_PORT", "BROKERD_WS_PORT", "BROKERD_ADMIN_PORT", "CONSOLE_PORT")}
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "BROKERD_ADMIN_TOKEN", "REDIS_URL")}
    env.update({k: str(v) for k, v in ports.items()}, VAR_DIR=str(var), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "build/run.py"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
    # a thread reads the output: select() on the pipe misses lines already in the reader's buffer
    out: list[str] = []
    banner_seen = threading.Event()

    def read():
        for line in proc.stdout:
            out.append(line)
            if "Ctrl-C stops everything" in line:
                banner_seen.set()

    threading.Thread(target=read, daemon=True).start()
    banner_seen.wait(90)
    text = "".join(out)
    if not banner_seen.is_set():
        os.killpg(proc.pid, signal.SIGKILL)          # run.py and the services it started
        proc.wait(10)
        pytest.fail(f"make run did not come up:\n{text}")
    yield {"banner": text, "ports": ports, "var": var, "proc": proc}
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def test_banner_names_every_address_and_the_first_login(system):
    banner, ports = system["banner"], system["ports"]
    assert f"http://127.0.0.1:{ports['CONSOLE_PORT']}/" in banner
    assert f"mqtt://127.0.0.1:{ports['BROKERD_MQTT_PORT']}" in banner
    assert f"ws://127.0.0.1:{ports['BROKERD_WS_PORT']}/mqtt" in banner
    assert f"http://127.0.0.1:{ports['BROKERD_ADMIN_PORT']}/api/v1/" in banner
    m = re.search(r"log in as\s+(\S+)\s+(\S+)", banner)
    assert m and m.group(1) == "admin" and len(m.group(2)) >= 12
    assert (system["var"] / "admin_password").read_text().strip() == m.group(2)
    assert oct((system["var"] / "admin_password").stat().st_mode & 0o777) == "0o600"


def test_console_serves_pages_and_static_files(system):
    port = system["ports"]["CONSOLE_PORT"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
        assert r.status == 200


def test_log_in_with_the_printed_credentials(system):
    """The banner's login works over plain HTTP (CSRF cookie + form), and the
    pages' stylesheet is served (WhiteNoise, after make run's collectstatic)."""
    base = f"http://127.0.0.1:{system['ports']['CONSOLE_PORT']}"
    user, password = re.search(r"log in as\s+(\S+)\s+(\S+)", system["banner"]).groups()
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with browser.open(f"{base}/login/", timeout=10) as r:
        assert r.status == 200
        form = r.read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    assert any(c.name == "csrftoken" for c in jar)
    data = urllib.parse.urlencode({"csrfmiddlewaretoken": token, "username": user, "password": password,
                                   "next": "/tenants/"}).encode()
    with browser.open(urllib.request.Request(f"{base}/login/", data=data, headers={"Referer": f"{base}/login/"}),
                      timeout=10) as r:
        # redirected to the page asked for, signed in
        assert r.status == 200 and r.url == f"{base}/tenants/"
        page = r.read().decode()
    assert "Sign out" in page and user in page
    assert any(c.name == "sessionid" for c in jar)
    with browser.open(f"{base}/overview/", timeout=10) as r:
        assert r.status == 200 and "Overview" in r.read().decode()
    css = re.search(r'<link rel="stylesheet" href="([^"]+\.css)"', page).group(1)
    with urllib.request.urlopen(urllib.parse.urljoin(base + "/", css), timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/css")
        assert b".sidebar" in r.read()


def test_admin_api_answers_with_the_generated_token(system):
    token = (system["var"] / "admin_token").read_text().strip()
    req = urllib.request.Request(f"http://127.0.0.1:{system['ports']['BROKERD_ADMIN_PORT']}/api/v1/nodes",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


def test_mqtt_round_trip(system):
    port = system["ports"]["BROKERD_MQTT_PORT"]
    sub = PahoClient("run-sub").connect(port)
    sub.subscribe("demo/#", qos=1)
    pub = PahoClient("run-pub").connect(port)
    pub.publish("demo/hello", b"world", qos=1)
    assert sub.expect().payload == b"world"
    sub.disconnect()
    pub.disconnect()

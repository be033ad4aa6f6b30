"""The console served for real, driven by a real browser.

``stack``: a fresh console database (migrated, with a platform administrator)
in a temporary VAR_DIR, brokerd using it as its control plane with the admin
API on, and the console under daphne pointed at that API -- the environment
`make run` (build/run.py) gives them, on free loopback ports.

``browser``: Debian's chromium driven by Playwright (no downloaded browsers).
When /usr/bin/chromium is missing it is installed with apt-get if we are
root, otherwise the tests are skipped with the reason.

``SCREENSHOTS=1`` saves full-page screenshots of the pages the tests walk
through under var/screenshots/ (``shot(page, name)``).
"""

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ..controlplane import PROVISION, migrated_sqlite
from ..procs import ROOT, BrokerProcess, free_port

CHROMIUM = "/usr/bin/chromium"
ADMIN_USER = "root"
ADMIN_PASSWORD = "browser-test-Passw0rd"
SCREENSHOT_DIR = ROOT / "var" / "screenshots"


class Stack:
    """The running system: ``url(path)``, ``manage(...)``, ``broker`` and the admin login."""

    broker_flags: tuple[str, ...] = ()          # more brokerd flags (a subclass's)
    anonymous = False                           # brokerd --allow-anonymous (as make run)

    def __init__(self, var: Path):
        self.var = var
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("DATABASE_URL", "BROKERD_ADMIN_TOKEN", "BROKERD_ADMIN_URL", "REDIS_URL", "DEBUG")}
        self.env.update(VAR_DIR=str(var), DATABASE_URL=f"sqlite:///{var}/console.sqlite3",
                        BROKERD_ADMIN_TOKEN=secrets.token_urlsafe(24), PYTHONUNBUFFERED="1",
                        CONSOLE_ADMIN_USER=ADMIN_USER, CONSOLE_ADMIN_PASSWORD=ADMIN_PASSWORD)
        self.broker: BrokerProcess | None = None
        self.console: subprocess.Popen | None = None
        self.port = free_port()
        self.log_path = var / "daphne.log"

    def manage(self, *args: str, stdin: str | None = None) -> str:
        proc = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True,
                              text=True, timeout=120, input=stdin)
        if proc.returncode != 0:
            raise AssertionError(f"manage.py {' '.join(args)} failed: {proc.stderr[-2000:]}")
        return proc.stdout

    def provision(self, plan: list[dict]) -> dict[str, str]:
        """Tenants, ACL rules and devices in one Django process (tests.controlplane's plan);
        -> {"tenant/device": secret}."""
        out = self.manage("shell", "-c", PROVISION, stdin=json.dumps(plan))
        return json.loads([ln for ln in out.splitlines() if ln.startswith("SECRETS ")][-1][len("SECRETS "):])

    def start(self) -> "Stack":
        migrated_sqlite(self.env["DATABASE_URL"], self.env)
        self.manage("console_bootstrap")
        self.broker = BrokerProcess("--sys-interval", "0", "--node-id", "web1", *self.broker_flags,
                                    "--control-plane", self.env["DATABASE_URL"], "--admin", "127.0.0.1:0",
                                    anonymous=self.anonymous, env=self.env).start()
        self.env["BROKERD_ADMIN_URL"] = self.broker.admin_url
        with open(self.log_path, "w") as log:       # the child keeps its own copy of the descriptor
            self.console = subprocess.Popen(
                [sys.executable, "-m", "console.serve", "-b", "127.0.0.1", "-p", str(self.port),
                 "console.asgi:application"], cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(self.url("/healthz"), timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if self.console.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"daphne did not come up:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.console is not None and self.console.poll() is None:
            self.console.terminate()
            try:
                self.console.wait(10)
            except subprocess.TimeoutExpired:
                self.console.kill()
                self.console.wait(5)
        if self.broker is not None:
            self.broker.stop()

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    @property
    def mqtt_port(self) -> int:
        return self.broker.port("mqtt")


def _chromium() -> str:
    if os.path.exists(CHROMIUM):
        return CHROMIUM
    if os.geteuid() != 0:
        pytest.skip(f"{CHROMIUM} is missing and we are not root to apt-get install chromium")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            pytest.skip(f"{' '.join(cmd)} failed, so no chromium: {proc.stderr[-500:]}")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"apt-get installed chromium but {CHROMIUM} is still missing")
    return CHROMIUM


@pytest.fixture(scope="session")
def chromium_path():
    return _chromium()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("browser-var")).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser(chromium_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def context(browser):
    ctx = browser.new_context(viewport={"width": 1366, "height": 860})
    ctx.set_default_timeout(15_000)
    yield ctx
    ctx.close()


@pytest.fixture
def page(context):
    return context.new_page()


def shot(page, name: str, settle_ms: int = 0) -> None:
    """A full-page screenshot under var/screenshots/NAME.png when SCREENSHOTS=1,
    after ``settle_ms`` for live charts to fill (waited only then)."""
    if os.environ.get("SCREENSHOTS") != "1":
        return
    page.wait_for_timeout(settle_ms)
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(SCREENSHOT_DIR / f"{name}.png"), full_page=True)

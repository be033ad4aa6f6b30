"""The Copy buttons next to a new device's secret (shown once) on a console
served over plain HTTP under a host name, as on a LAN: the browser's Clipboard
API exists only on HTTPS and localhost, and the button did nothing there."""

import pytest
from playwright.sync_api import expect

from .conftest import ADMIN_PASSWORD, ADMIN_USER, Stack
from .test_console import log_in

pytestmark = pytest.mark.slow

HOST = "console.test"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("browser-var"))
    s.env["ALLOWED_HOSTS"] = f"localhost,127.0.0.1,{HOST}"
    s.start()
    yield s
    s.stop()


@pytest.fixture
def lan_context(browser, chromium_path):
    """A browser that reaches the console as http://console.test:PORT (not a secure context)."""
    lan = browser.browser_type.launch(executable_path=chromium_path,
                                      args=["--no-sandbox", f"--host-resolver-rules=MAP {HOST} 127.0.0.1"])
    ctx = lan.new_context(viewport={"width": 390, "height": 844})
    ctx.set_default_timeout(15_000)
    yield ctx
    ctx.close()
    lan.close()


def test_copy_the_secret_over_plain_http(lan_context, stack):
    stack.provision([{"slug": "copyco", "default_acl": "deny", "devices": [], "acl": []}])
    page = lan_context.new_page()
    base = stack.url("/").replace("127.0.0.1", HOST).rstrip("/")
    page.goto(f"{base}/login/")
    assert page.evaluate("!window.isSecureContext && !navigator.clipboard")
    page.get_by_label("Username").fill(ADMIN_USER)
    page.get_by_label("Password").fill(ADMIN_PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.goto(f"{base}/tenants/copyco/devices/new/")
    page.locator("#id_name").fill("pump-1")
    page.get_by_role("button", name="Create device").click()
    expect(page.get_by_role("heading", name="Device pump-1 created")).to_be_visible()
    secret = page.locator("#secret").inner_text().strip()
    button = page.locator(".secret-box", has=page.locator("#secret")).get_by_role("button")
    button.click()
    expect(button).to_have_text("Copied")
    # what the clipboard holds, read on a secure origin of the same browser
    lan_context.grant_permissions(["clipboard-read", "clipboard-write"], origin=stack.url("/").rstrip("/"))
    reader = lan_context.new_page()
    reader.goto(stack.url("/healthz"))
    assert reader.evaluate("navigator.clipboard.readText()").strip() == secret
    expect(button).to_have_text("Copy", timeout=5_000)        # and back to its name


def test_copy_on_localhost_still_uses_the_clipboard_api(page, context, stack):
    stack.provision([{"slug": "copyco2", "default_acl": "deny", "devices": ["d1"], "acl": []}])
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=stack.url("/").rstrip("/"))
    log_in(page, stack, ADMIN_USER, ADMIN_PASSWORD)
    page.goto(stack.url("/tenants/copyco2/devices/d1/"))
    box = page.locator(".code-box", has=page.locator("#connect-sub"))
    box.get_by_role("button", name="Copy").click()
    expect(box.get_by_role("button")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()").startswith("mosquitto_sub ")

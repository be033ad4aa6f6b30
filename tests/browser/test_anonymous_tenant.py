"""The tenant of anonymous clients in a real browser, against a brokerd that
admits them (``--allow-anonymous``, as `make run` starts it): made by
``console_bootstrap``, it is in the Tenants list and the tenant switch,
marked "anonymous clients" there, on its page, its Metrics page and in Live
metrics' tenant table once an anonymous client publishes -- at a phone's and
a laptop's width.
"""

import pytest
from playwright.sync_api import expect

from ..integration.helpers import Client
from .conftest import ADMIN_PASSWORD, ADMIN_USER, Stack, shot
from .test_console import log_in

pytestmark = pytest.mark.slow

SIZES = {"phone": (390, 844), "laptop": (1366, 900)}


class AnonymousStack(Stack):
    anonymous = True


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = AnonymousStack(tmp_path_factory.mktemp("anonymous-var")).start()
    yield s
    s.stop()


def test_the_anonymous_tenant_is_listed_marked_and_live(page, stack):
    client = Client("anon-browser").connect(stack.mqtt_port)
    try:
        log_in(page, stack, ADMIN_USER, ADMIN_PASSWORD)
        page.goto(stack.url("/metrics/"))
        row = page.locator("[data-tenants] tr", has_text="default")
        for _ in range(3):
            client.publish("demo/hello", b"world")
        expect(row).to_contain_text("anonymous clients")
        expect(row).to_contain_text("1")                         # its connection
        shot(page, "anonymous-live-metrics", settle_ms=1500)
        row.get_by_role("link", name="default").click()
        expect(page.locator(".subtitle")).to_contain_text("anonymous clients")
        for size, (w, h) in SIZES.items():
            page.set_viewport_size({"width": w, "height": h})
            for path, name in (("/tenants/", "list"), ("/tenants/default/", "overview")):
                page.goto(stack.url(path))
                assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), (path, size)
                shot(page, f"anonymous-{name}-{size}")
            expect(page.locator("#anonymous-tenant")).to_contain_text("Clients that connect without a user name")
        page.goto(stack.url("/tenants/"))
        expect(page.locator("#tenant-table tbody tr", has_text="default")).to_contain_text("anonymous clients")
        expect(page.locator(".tenant-switch option", has_text="default")).to_have_text("default (anonymous clients)")
        page.goto(stack.url("/"))
        expect(page.locator(".stat").first).to_contain_text("default (anonymous clients)")
    finally:
        client.disconnect()

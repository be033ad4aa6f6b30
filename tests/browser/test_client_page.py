"""A client's page follows the client: it refreshes every 5 s, and when the
client leaves the page says so -- its state under the heading too, which is
outside the refreshed part -- instead of showing it connected for as long as
the page stays open. Real paho clients against the real system."""

import time

import pytest
from playwright.sync_api import expect

from ..integration.helpers import Client
from .conftest import ADMIN_PASSWORD, ADMIN_USER
from .test_console import connect_device, log_in

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def secrets(stack):
    return stack.provision([{"slug": "followco", "default_acl": "allow", "devices": ["clean", "kept"], "acl": []}])


def _connect_kept(stack, client_id, username, password, timeout=10.0) -> Client:
    """A client with a session kept after it disconnects (clean session off), retried while
    brokerd has not yet read the new device from the database."""
    deadline = time.monotonic() + timeout
    while True:
        c = Client(client_id, username=username, password=password, clean=False)
        try:
            return c.connect(stack.mqtt_port)
        except ConnectionError:
            c.client.loop_stop()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def test_a_client_that_leaves_without_a_session_is_shown_gone(page, stack, secrets):
    device = connect_device(stack, "leaves-clean", "followco/clean", secrets["followco/clean"])
    log_in(page, stack, ADMIN_USER, ADMIN_PASSWORD)
    page.goto(stack.url("/tenants/followco/clients/leaves-clean/"))
    state = page.locator("#client-state")
    expect(state.locator(".badge")).to_have_text("connected")
    expect(page.get_by_role("link", name="Kick…")).to_be_visible()
    device.disconnect()
    expect(page.locator("#session")).to_contain_text("not connected and has no stored session", timeout=15_000)
    expect(state.locator(".badge")).to_have_text("gone")
    expect(page.get_by_role("link", name="Kick…")).to_have_count(0)
    expect(page.locator("[role=alert]")).to_have_count(0)       # an answer, not a failed request


def test_a_client_that_leaves_its_session_behind_is_shown_offline(page, stack, secrets):
    device = _connect_kept(stack, "leaves-kept", "followco/kept", secrets["followco/kept"])
    # (a subscription's Remove form holds a hidden "filter" input, which stopped the refresh: it was
    # taken for the subscribe box being typed in)
    device.subscribe("kept/#", qos=1)
    log_in(page, stack, ADMIN_USER, ADMIN_PASSWORD)
    page.goto(stack.url("/tenants/followco/clients/leaves-kept/"))
    state = page.locator("#client-state")
    expect(state.locator(".badge")).to_have_text("connected")
    device.disconnect()
    expect(state.locator(".badge")).to_have_text("offline", timeout=15_000)
    expect(page.locator("#session")).to_contain_text("kept/#")       # the stored session is still shown
    expect(page.get_by_role("link", name="Kick…")).to_be_visible()   # (kick clears a stored session)

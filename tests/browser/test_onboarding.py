"""Onboarding a device in a real browser against the real system (issue 21,
defect 5): a new tenant says its devices may do nothing; the page that shows
a new device's secret has a "Connect this device" panel whose URL, user name
and secret let a real MQTT client in, whose publishes the tenant's default
deny refuses until the one-click rule ``allow both {device}/#`` -- clicked on
that same page, which keeps the secret on screen -- lets them through; the
panel's own mosquitto_pub command is run as shown. At 390 and 1366 px the page
never scrolls sideways: the code blocks scroll inside themselves.

``SCREENSHOTS=1`` saves the pages under var/screenshots/onboard-*.png.
"""

import re
import shlex
import shutil
import subprocess
import time
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from ..integration.helpers import Client
from ..mqtt import V5
from .conftest import ADMIN_PASSWORD, ADMIN_USER, shot
from .test_console import log_in, subscribe_granted

pytestmark = pytest.mark.slow

WIDTHS = ((390, 844, "phone"), (1366, 900, "laptop"))
BUTTON = "Allow each device its own topics"
NOT_AUTHORIZED = 0x87


def no_sideways_scroll(page, name: str) -> None:
    """At a phone's and a laptop's width the page is no wider than the window; screenshots of both."""
    for w, h, size in WIDTHS:
        page.set_viewport_size({"width": w, "height": h})
        page.evaluate("window.scrollTo(0, 0)")
        width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], f"{name} at {size}: the page is {width[0]} px wide in a {width[1]} px window"
        shot(page, f"{name}-{size}")
    page.set_viewport_size({"width": 1366, "height": 900})


def connect(host, port, client_id, username, password, timeout=10.0) -> Client:
    """An MQTT 5 client (PUBACK reason codes); retried while brokerd has not yet read the new device."""
    deadline = time.monotonic() + timeout
    while True:
        c = Client(client_id, version=V5, username=username, password=password)
        try:
            return c.connect(port, host=host)
        except ConnectionError:
            c.client.loop_stop()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def puback(client, topic, payload) -> int:
    info = client.publish(topic, payload, qos=1, wait=False)
    return client.publish_result(info)[0].value


def test_connect_a_new_device_with_the_panel_and_the_one_click_rule(page, stack):
    if shutil.which("mosquitto_pub") is None:
        pytest.skip("mosquitto_pub is not installed (apt-get install mosquitto-clients)")
    stack.manage("tenants", "create", "initech", "--name", "Initech")
    log_in(page, stack, ADMIN_USER, ADMIN_PASSWORD)
    page.set_viewport_size({"width": 1366, "height": 900})

    # a new tenant denies by default and has no rule: its overview says so
    page.goto(stack.url("/tenants/initech/"))
    notice = page.locator(".acl-notice")
    expect(notice).to_contain_text("Devices of initech can neither publish nor subscribe.")
    expect(notice.get_by_role("button", name=BUTTON)).to_be_visible()
    no_sideways_scroll(page, "onboard-01-tenant-overview")

    # a device with its first credential: the secret, and how to connect with it
    page.get_by_role("link", name="New device").first.click()
    page.locator("#id_name").fill("valve-3")
    page.get_by_role("button", name="Create device").click()
    expect(page.get_by_role("heading", name="Device valve-3 created")).to_be_visible()
    secret = page.locator("#secret").inner_text().strip()
    panel = page.locator("#connect")
    expect(panel.get_by_role("heading", name="Connect this device")).to_be_visible()
    mqtt_url = panel.locator(".broker-url[data-scheme=mqtt]").first.inner_text().strip()
    ws_url = panel.locator(".broker-url[data-scheme=ws]").first.inner_text().strip()
    assert mqtt_url == f"mqtt://127.0.0.1:{stack.mqtt_port}"              # what brokerd advertises
    assert ws_url == f"ws://127.0.0.1:{stack.broker.port('ws')}/mqtt"
    username = panel.locator("#connect-username").inner_text().strip()
    assert username == "initech/valve-3"
    pub_command = panel.locator("#connect-pub").inner_text().strip()
    assert secret in pub_command and secret in panel.locator("#connect-paho").inner_text()
    expect(panel.locator(".acl-notice")).to_contain_text("The tenant's ACL refuses this device's examples.")
    no_sideways_scroll(page, "onboard-02-secret-page")
    # at 390 px the long lines scroll inside their block, not the page
    page.set_viewport_size({"width": 390, "height": 844})
    paho = page.locator("#connect-paho")
    assert paho.evaluate("e => e.scrollWidth > e.clientWidth && getComputedStyle(e).overflowX == 'auto'")
    page.set_viewport_size({"width": 1366, "height": 900})

    # a real client gets in with what the panel shows, and the default deny refuses its publish
    url = urlsplit(mqtt_url)
    device = connect(url.hostname, url.port, "valve-3", username, secret)
    listener = connect(url.hostname, url.port, "valve-3-listen", username, secret)
    try:
        assert puback(device, "valve-3/x", b"before") == NOT_AUTHORIZED

        # one click, on this page: the notice is swapped in place, the secret stays on screen
        panel.get_by_role("button", name=BUTTON).click()
        expect(panel.locator(".acl-notice")).to_contain_text(re.compile(r"ACL rule \d+ added at position 1:"))
        expect(page.locator("#secret")).to_have_text(secret)
        shot(page, "onboard-03-after-one-click-laptop")

        # brokerd reads the rule with its next poll of the database (every 0.5 s)
        subscribe_granted(listener, "valve-3/#", qos=1)
        assert puback(device, "valve-3/x", b"after") < 0x80
        msg = listener.expect()
        assert (msg.topic, msg.payload) == ("valve-3/x", b"after")

        # the panel's mosquitto_pub command, run as shown
        proc = subprocess.run(shlex.split(pub_command), capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        msg = listener.expect()
        assert (msg.topic, msg.payload) == ("valve-3/hello", b"hello from valve-3")
    finally:
        device.disconnect()
        listener.disconnect()

    # the device page: the same panel, the secret replaced by a variable, no notice any more
    page.get_by_role("link", name="I have copied it").click()
    expect(page.locator("#connect-pub")).to_contain_text('-P "$MQTT_PASSWORD"')
    expect(page.locator("body")).not_to_contain_text(secret)
    expect(page.locator(".acl-notice")).to_have_count(0)
    no_sideways_scroll(page, "onboard-04-device-page")
    page.goto(stack.url("/tenants/initech/"))
    expect(page.locator(".acl-notice")).to_have_count(0)

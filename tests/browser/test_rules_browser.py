"""The Rules page in a real browser against the real system (daphne +
brokerd on one control-plane database): an administrator writes a rule,
sees a malformed statement's error under the editor, runs the tester, saves
the rule, and sees the counters brokerd reports move after a paho device
publishes -- and the republished reading arrive. Then disable and delete.

With ``SCREENSHOTS=1`` the page is saved at a phone (390x844), a tablet
(768x1024) and a laptop (1366x900) size under var/screenshots/rules-*.png.
"""

import json
import time

import pytest
from playwright.sync_api import expect

from .conftest import ADMIN_PASSWORD, ADMIN_USER, shot
from .test_console import connect_device, log_in, subscribe_granted

pytestmark = pytest.mark.slow

SIZES = {"phone": (390, 844), "tablet": (768, 1024), "laptop": (1366, 900)}
GOOD = 'SELECT payload.temp AS t, clientid\nFROM "sensors/+/temp"\nWHERE t > 30'
BAD = 'SELECT payload.temp AS t, clientid\nFROM "sensors/+/temp"\nWHERE tmep > 30'


def shots(page, name):
    for size, (w, h) in SIZES.items():
        page.set_viewport_size({"width": w, "height": h})
        page.evaluate("window.scrollTo(0, 0)")   # sticky bars are drawn where the scroll left them
        shot(page, f"rules-{name}-{size}")
    page.set_viewport_size({"width": 1366, "height": 900})


def counters(page, rule_id) -> list[str]:
    """[matched, passed, no row, failed] as the table shows them."""
    return page.locator(f"#rule-{rule_id} td.num").all_inner_texts()[1:5]


def test_write_test_and_run_a_rule_and_watch_its_counters(page, stack):
    secrets = stack.provision([{"slug": "plant", "default_acl": "allow", "devices": ["t1", "watcher"]}])
    log_in(page, stack, ADMIN_USER, ADMIN_PASSWORD)
    page.set_viewport_size({"width": 1366, "height": 900})
    page.goto(stack.url("/tenants/plant/rules/"))
    expect(page.get_by_role("heading", name="No rules yet")).to_be_visible()
    shots(page, "01-empty")

    # a malformed statement: its line and column under the editor, what was typed kept
    page.locator("#id_sql").fill(BAD)
    page.get_by_label("Republish to").fill("alerts/${clientid}")
    page.get_by_label("QoS").select_option("1")
    page.get_by_role("button", name="Add rule").click()
    expect(page.locator("[data-statement-error]")).to_contain_text("Line 3, column 7: unknown field 'tmep'")
    expect(page.locator(".statement-error")).to_contain_text("3 | WHERE tmep > 30")
    expect(page.locator("#id_sql")).to_have_value(BAD)
    expect(page.get_by_label("Republish to")).to_have_value("alerts/${clientid}")
    shots(page, "02-inline-error")

    # the tester: an output row, then "no row", nothing saved
    page.locator("#id_sql").fill(GOOD)
    page.locator("#id_test_topic").fill("sensors/kitchen/temp")
    page.locator("#id_test_client_id").fill("t1")
    page.locator("#id_test_payload").fill('{"temp": 31.5}')
    page.get_by_role("button", name="Run test").click()
    expect(page.locator("#rule-test")).to_contain_text('{"t":31.5,"clientid":"t1"}')
    shots(page, "03-tester-row")
    page.locator("#id_test_payload").fill('{"temp": 20}')
    page.get_by_role("button", name="Run test").click()
    expect(page.locator("#rule-test")).to_contain_text("No row (WHERE not true)")
    expect(page.get_by_role("heading", name="No rules yet")).to_be_visible()

    page.get_by_role("button", name="Add rule").click()
    row = page.locator("table.rules tbody tr").first
    expect(row).to_contain_text("enabled")
    rule_id = int(row.get_attribute("id").removeprefix("rule-"))

    # a real device: hot readings are republished (once the rule reached the node), a cold one is not
    watcher = connect_device(stack, "watcher", "plant/watcher", secrets["plant/watcher"])
    device = connect_device(stack, "t1", "plant/t1", secrets["plant/t1"])
    try:
        subscribe_granted(watcher, "alerts/#", qos=1)
        deadline = time.monotonic() + 15
        while True:
            device.publish("sensors/kitchen/temp", b'{"temp": 31.5}', qos=1)
            try:
                msg = watcher.expect(timeout=0.5)
                break
            except AssertionError:
                assert time.monotonic() < deadline, "the rule never republished"
        assert msg.topic == "alerts/t1" and json.loads(msg.payload) == {"t": 31.5, "clientid": "t1"}
        device.publish("sensors/kitchen/temp", b'{"temp": 20}', qos=1)
        watcher.expect_none(timeout=0.5)
    finally:
        device.disconnect()
        watcher.disconnect()

    # the counters the nodes report, in the page
    deadline = time.monotonic() + 15
    while True:
        page.goto(stack.url("/tenants/plant/rules/"))
        matched, passed, no_row, failed = counters(page, rule_id)
        if passed != "0" and no_row != "0":
            break
        assert time.monotonic() < deadline, f"counters did not move: {matched, passed, no_row, failed}"
        time.sleep(0.5)
    assert int(matched) == int(passed) + int(no_row) and int(no_row) == 1 and failed == "0"
    expect(page.locator("[data-nodes-unreachable]")).to_have_count(0)
    shots(page, "04-counters")

    # disable, then delete (confirmed)
    row = page.locator(f"#rule-{rule_id}")
    row.get_by_role("button", name="Disable").click()
    expect(page.locator(f"#rule-{rule_id}")).to_contain_text("disabled")
    page.once("dialog", lambda d: d.accept())
    page.locator(f"#rule-{rule_id}").get_by_role("link", name="Delete").click()
    expect(page.get_by_role("heading", name="No rules yet")).to_be_visible()
    expect(page.locator("#messages")).to_contain_text(f"Rule {rule_id} deleted.")


def test_each_action_has_its_own_settings_checked_inline(page, stack):
    """The action chooser shows only the chosen action's settings; a refused URL is shown on its field with
    everything typed kept; a webhook and a store rule are saved and listed with their targets."""
    stack.provision([{"slug": "works", "default_acl": "allow", "devices": ["t1"]}])
    log_in(page, stack, ADMIN_USER, ADMIN_PASSWORD)
    page.set_viewport_size({"width": 1366, "height": 900})
    page.goto(stack.url("/tenants/works/rules/"))
    republish, webhook, store = (page.locator(f'fieldset.rule-action[data-action="{k}"]')
                                 for k in ("republish", "webhook", "store"))
    expect(republish).to_be_visible()
    expect(webhook).to_be_hidden()
    expect(store).to_be_hidden()

    page.locator("#id_sql").fill(GOOD)
    page.get_by_label("Webhook", exact=True).check()
    expect(webhook).to_be_visible()
    expect(republish).to_be_hidden()
    page.get_by_label("URL").fill("ftp://hooks.example.com/in")
    page.get_by_label("Method").select_option("PUT")
    page.get_by_label("Headers").fill("X-Device: ${clientid}")
    page.get_by_role("button", name="Add rule").click()
    expect(webhook.locator(".error")).to_contain_text("The URL must start with http:// or https://")
    expect(webhook).to_be_visible()                       # the chosen action stays chosen
    expect(page.get_by_label("Headers")).to_have_value("X-Device: ${clientid}")
    shots(page, "05-webhook-error")
    page.get_by_label("URL").fill("https://hooks.example.com/in/${clientid}")
    page.get_by_role("button", name="Add rule").click()
    expect(page.locator("table.rules")).to_contain_text("→ webhook PUT https://hooks.example.com/in/${clientid}")

    page.locator("#id_sql").fill(GOOD)
    page.get_by_label("Store to a dataset").check()
    expect(store).to_be_visible()
    expect(webhook).to_be_hidden()
    page.get_by_label("Dataset", exact=True).fill("temperatures")
    page.get_by_role("button", name="Add rule").click()
    expect(page.locator("table.rules")).to_contain_text("→ store to dataset temperatures")
    shots(page, "06-actions-listed")

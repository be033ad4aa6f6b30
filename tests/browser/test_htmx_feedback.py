"""What a person sees when a button that works in place (htmx) cannot do its
work: the ACL rule it names was deleted in another window, the page is older
than the user's last sign-in, the console is down. htmx swaps nothing for a
4xx/5xx answer or a network error, so without a word the click seemed to do
nothing; the console says why in an alert at the bottom of the screen."""

import re

import pytest
from playwright.sync_api import expect

from .conftest import ADMIN_PASSWORD, ADMIN_USER
from .test_console import log_in

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tenant(stack):
    stack.provision([{"slug": "feedbackco", "default_acl": "deny", "devices": ["d1"],
                      "acl": [{"topic": "first/#", "action": "both", "allow": True},
                              {"topic": "second/#", "action": "both", "allow": True},
                              {"topic": "third/#", "action": "both", "allow": True},
                              {"topic": "fourth/#", "action": "both", "allow": True}]}])
    return "feedbackco"


def _row(page, topic):
    return page.locator("#acl-editor tr", has_text=topic)


def test_deleting_a_rule_deleted_meanwhile_says_so(page, stack, tenant):
    log_in(page, stack, ADMIN_USER, ADMIN_PASSWORD)
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(stack.url(f"/tenants/{tenant}/acl/"))
    page.on("dialog", lambda d: d.accept())
    # another administrator deletes the rule while this page shows it
    stack.manage("shell", "-c", "from tenants.models import AclRule; "
                                "AclRule.objects.filter(tenant__slug='feedbackco', topic='first/#').delete()")
    _row(page, "first/#").get_by_role("link", name="Delete").click()
    alert = page.locator("[role=alert]", has_text="no longer there")
    expect(alert).to_be_visible()
    expect(alert).to_contain_text("Reload the page")
    # on the phone's screen, not above it where the page is scrolled away
    box = alert.bounding_box()
    assert box["y"] >= 0 and box["y"] + box["height"] <= 844 and box["x"] >= 0 and box["x"] + box["width"] <= 390
    alert.get_by_role("button", name="Dismiss").click()
    expect(alert).to_be_hidden()


def test_a_page_older_than_the_last_sign_in_says_reload(page, context, stack, tenant):
    log_in(page, stack, ADMIN_USER, ADMIN_PASSWORD)
    page.goto(stack.url(f"/tenants/{tenant}/acl/"))
    page.on("dialog", lambda d: d.accept())
    # in another tab the user signs out and in again: the first tab's form token is stale
    other = context.new_page()
    other.goto(stack.url("/"))
    other.get_by_role("button", name="Sign out").click()
    log_in(other, stack, ADMIN_USER, ADMIN_PASSWORD)
    other.close()
    _row(page, "second/#").get_by_role("link", name="Delete").click()
    expect(page.locator("[role=alert]", has_text="reload the page and try again")).to_be_visible()
    expect(_row(page, "second/#")).to_be_visible()          # nothing was deleted
    # reloaded, the same click works
    page.reload()
    _row(page, "second/#").get_by_role("link", name="Delete").click()
    expect(page.locator("#messages")).to_contain_text("deleted")
    expect(_row(page, "second/#")).to_have_count(0)


def test_the_console_not_answering_says_so(page, context, stack, tenant):
    log_in(page, stack, ADMIN_USER, ADMIN_PASSWORD)
    page.goto(stack.url(f"/tenants/{tenant}/acl/"))
    page.on("dialog", lambda d: d.accept())
    context.route("**/acl/*/move/", lambda route: route.abort("connectionrefused"))
    _row(page, "fourth/#").locator("button[title='Move up']").click()
    expect(page.locator("[role=alert]", has_text="did not answer")).to_be_visible()


def _sign_out_in_another_tab(context, stack):
    other = context.new_page()
    other.goto(stack.url("/"))
    other.get_by_role("button", name="Sign out").click()
    expect(other).to_have_url(re.compile(r"/login/"))
    other.close()


def test_a_click_after_the_session_ended_opens_the_sign_in_page(page, context, stack, tenant):
    """Not the sign-in form inside the ACL card under a top bar still naming the user:
    the sign-in page, which leads back to the page after signing in."""
    log_in(page, stack, ADMIN_USER, ADMIN_PASSWORD)
    page.goto(stack.url(f"/tenants/{tenant}/acl/"))
    _sign_out_in_another_tab(context, stack)
    _row(page, "third/#").get_by_role("link", name="Edit").click()
    expect(page).to_have_url(re.compile(r"/login/\?next=%2Ftenants%2Ffeedbackco%2Facl%2F$"))
    expect(page.get_by_role("button", name="Sign out")).to_have_count(0)
    page.get_by_label("Username").fill(ADMIN_USER)
    page.get_by_label("Password").fill(ADMIN_PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(stack.url(f"/tenants/{tenant}/acl/"))
    expect(page.get_by_role("heading", name="ACL rules")).to_be_visible()


def test_a_refreshing_page_goes_to_the_sign_in_page_when_the_session_ends(page, context, stack, tenant):
    log_in(page, stack, ADMIN_USER, ADMIN_PASSWORD)
    page.goto(stack.url(f"/tenants/{tenant}/clients/"))      # refreshed every 5 s
    expect(page.locator("#client-table")).to_be_visible()
    _sign_out_in_another_tab(context, stack)
    expect(page).to_have_url(re.compile(r"/login/\?next=%2Ftenants%2Ffeedbackco%2Fclients%2F$"), timeout=15_000)
    expect(page.locator("#client-table")).to_have_count(0)

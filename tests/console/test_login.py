"""Signing in and out, and the throttle on failed logins."""

import datetime as dt

import pytest
from django.test import Client
from django.utils import timezone

from console.models import LoginFailure
from core.models import AuditEvent

from .conftest import PASSWORD


def login(client, username, password, addr="10.0.0.1"):
    return client.post("/login/", {"username": username, "password": password}, REMOTE_ADDR=addr)


def test_login_page_is_styled_and_has_csrf(db):
    page = Client(enforce_csrf_checks=True).get("/login/")
    assert page.status_code == 200
    assert b"Sign in" in page.content and b"csrfmiddlewaretoken" in page.content
    assert b"console.css" in page.content and b"htmx.min.js" in page.content


def test_login_works_without_javascript(alice):
    c = Client()
    response = login(c, "alice", PASSWORD)
    assert response.status_code == 302 and response["Location"] == "/"
    assert c.get("/").status_code == 302          # home -> the tenant's page
    page = c.get("/tenants/acme/")
    assert b"alice" in page.content and b"tenant administrator" in page.content


def test_wrong_password_is_an_inline_error(alice):
    page = login(Client(), "alice", "nope")
    assert page.status_code == 200
    assert b"Please enter a correct username and password" in page.content
    assert LoginFailure.objects.filter(username="alice").count() == 1


def test_five_failures_lock_the_username_even_with_the_right_password(alice, bob):
    c = Client()
    for _ in range(5):
        login(c, "alice", "wrong")
    page = login(c, "alice", PASSWORD)
    assert page.status_code == 200
    text = page.content.decode()
    assert "Too many failed sign-in attempts. Try again in 15 minutes." in text
    assert "_auth_user_id" not in c.session
    # another user from another address is not affected
    assert login(Client(), "bob", PASSWORD, addr="10.0.0.2").status_code == 302
    # the lockout is audited once
    lockouts = AuditEvent.objects.filter(action="login.lockout")
    assert [(e.actor, e.object_id, e.remote_addr, e.source) for e in lockouts] == [
        ("alice", "alice", "10.0.0.1", "console")]


def test_failures_from_one_address_lock_that_address(alice, bob):
    for name in ("x1", "x2", "x3", "x4", "x5"):
        login(Client(), name, "wrong", addr="10.9.9.9")
    page = login(Client(), "bob", PASSWORD, addr="10.9.9.9")
    assert b"Too many failed sign-in attempts" in page.content
    assert login(Client(), "bob", PASSWORD, addr="10.9.9.10").status_code == 302


def test_lock_ends_when_failures_leave_the_window(alice, settings):
    settings.LOGIN_FAILURE_WINDOW = 60
    old = timezone.now() - dt.timedelta(seconds=61)
    LoginFailure.objects.bulk_create([LoginFailure(username="alice", remote_addr="10.0.0.1", at=old)] * 5)
    assert login(Client(), "alice", PASSWORD).status_code == 302


def test_wait_is_counted_from_the_failure_that_must_age_out(alice, settings):
    settings.LOGIN_FAILURE_WINDOW = 600
    now = timezone.now()
    LoginFailure.objects.bulk_create(
        [LoginFailure(username="alice", remote_addr="1.1.1.1", at=now - dt.timedelta(seconds=590))]
        + [LoginFailure(username="alice", remote_addr="1.1.1.1", at=now)] * 4)
    page = login(Client(), "alice", PASSWORD, addr="2.2.2.2")
    assert b"Try again in 10 seconds" in page.content or b"Try again in 9 seconds" in page.content


def test_success_clears_the_usernames_failures(alice):
    for _ in range(4):
        login(Client(), "alice", "wrong")
    assert login(Client(), "alice", PASSWORD, addr="10.0.0.3").status_code == 302
    assert not LoginFailure.objects.filter(username="alice").exists()


@pytest.mark.parametrize("limit", [2])
def test_limit_comes_from_settings(alice, settings, limit):
    settings.LOGIN_FAILURE_LIMIT = limit
    login(Client(), "alice", "wrong")
    login(Client(), "alice", "wrong")
    assert b"Too many failed" in login(Client(), "alice", PASSWORD).content


def test_logout_is_a_post(as_alice):
    assert as_alice.post("/logout/").status_code == 302
    assert as_alice.get("/tenants/acme/").status_code == 302


def test_password_change(as_alice, alice):
    response = as_alice.post("/account/password/", {"old_password": PASSWORD, "new_password1": "a-new-Secret-42",
                                                    "new_password2": "a-new-Secret-42"})
    assert response.status_code == 302
    alice.refresh_from_db()
    assert alice.check_password("a-new-Secret-42")
    assert AuditEvent.objects.filter(action="user.password_change", actor="alice").exists()

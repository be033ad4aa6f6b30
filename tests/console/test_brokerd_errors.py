"""What the pages say when brokerd's admin API fails, and to whom.

The admin API's addresses (``BROKERD_ADMIN_URL`` and the nodes learned from
the cluster) are the platform's internal network: the platform
administrators see them in the banner, to find the node that does not
answer; tenant users learn that brokerd did not answer, never where it runs
(as the tenant's live metrics socket, which says "brokerd does not answer").
"""

import re

import pytest

from core.brokerd_client import BrokerdClient, BrokerdError, BrokerdInterrupted
from tenants import services

from ..procs import free_port

INTERNAL = "10.77.3.9:18083"


@pytest.fixture
def internal_admin_api(settings):
    """Two admin APIs that refuse connections; the port names the second one."""
    port = free_port()
    settings.BROKERD_ADMIN_URL = f"http://127.0.0.1:{free_port()},http://127.0.0.1:{port}"
    return f"127.0.0.1:{port}"


TENANT_PAGES = ["/tenants/acme/", "/tenants/acme/devices/", "/tenants/acme/devices/sensor-1/",
                "/tenants/acme/clients/", "/tenants/acme/clients/c1/", "/tenants/acme/retained/",
                "/tenants/acme/retained/message/?topic=a", "/tenants/acme/rules/"]


@pytest.mark.parametrize("url", TENANT_PAGES)
def test_tenant_users_are_not_shown_the_admin_apis_addresses(as_alice, internal_admin_api, url):
    page = as_alice.get(url).content.decode()
    assert "unreachable" in page or "did not answer" in page
    assert internal_admin_api not in page and "Connection refused" not in page


def test_a_new_secrets_page_does_not_show_them_either(as_alice, acme, internal_admin_api):
    page = as_alice.post("/tenants/acme/devices/new/", {"name": "pump-9", "with_credential": "on"}).content.decode()
    assert "did not answer" in page and internal_admin_api not in page


def test_platform_administrators_still_see_which_node_failed(as_admin, acme, internal_admin_api):
    page = as_admin.get("/tenants/acme/clients/").content.decode()
    assert internal_admin_api in page


def test_a_write_cut_off_does_not_name_the_node_to_tenant_users(as_alice, as_admin, acme, monkeypatch):
    def call(self, method, path, query=None, body=None):
        raise BrokerdInterrupted(f"brokerd at http://{INTERNAL} stopped answering after the request was sent "
                                 "(timed out): it may have been carried out -- check before trying again")

    monkeypatch.setattr(BrokerdClient, "_call", call)
    services.update_tenant(acme, default_acl="allow")
    data = {"topic": "a/b", "payload": "x", "qos": "0"}
    page = as_alice.post("/tenants/acme/publish/", data).content.decode()
    assert "may have been carried out" in page and INTERNAL not in page
    page = as_admin.post("/tenants/acme/publish/", data).content.decode()
    assert INTERNAL in page


def test_a_server_error_of_the_api_does_not_name_nodes_to_tenant_users(as_alice, as_admin, acme, monkeypatch):
    def call(self, method, path, query=None, body=None):
        raise BrokerdError(502, f"node n2, which holds the session, did not answer: {INTERNAL} timed out")

    monkeypatch.setattr(BrokerdClient, "_call", call)
    page = as_alice.post("/tenants/acme/clients/c1/kick/").content.decode()
    # (the node's name as a word: a random CSRF token on the page may hold the letters "n2")
    assert "could not carry out the request" in page and INTERNAL not in page and not re.search(r"\bn2\b", page)
    page = as_admin.post("/tenants/acme/clients/c1/kick/").content.decode()
    assert INTERNAL in page

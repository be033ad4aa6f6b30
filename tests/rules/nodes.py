"""What the rules' end-to-end tests ask of a real brokerd: its paho clients
and the rules it runs, read through its admin API."""

import json
import time
import urllib.request

from ..mqtt import V5, PahoClient


def client(node, secrets, who, cid, version=V5) -> PahoClient:
    c = PahoClient(cid, version, username=who, password=secrets[who])
    c.connect(node.port())
    return c


def add_each(plane, tenant, *rules: tuple[str, ...]) -> list[int]:
    """``rules add`` for each rule's arguments, in one Django process; -> their ids."""
    return [int(out.strip()) for out in plane.manage_each(*(("rules", "add", tenant, *r) for r in rules))]


def delete_each(plane, tenant, rule_ids) -> None:
    """``rules delete`` of each rule, in one Django process."""
    plane.manage_each(*(("rules", "delete", tenant, str(rid)) for rid in rule_ids))


def rules_api(node, token, tenant) -> dict:
    req = urllib.request.Request(f"{node.admin_url}/api/v1/tenants/{tenant}/rules",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def rule_view(node, token, tenant, rule_id) -> dict | None:
    """The node's counters of one rule, None until it has the rule."""
    return next((r for r in rules_api(node, token, tenant)["items"] if r["id"] == rule_id), None)


def wait_for(pred, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def loaded(node, token, tenant, rule_id) -> dict:
    """The node has the rule (from the snapshot it polls every 0.5 s); -> its view."""
    return wait_for(lambda: rule_view(node, token, tenant, rule_id), what=f"rule {rule_id} on the node")

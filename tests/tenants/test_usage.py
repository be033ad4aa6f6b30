"""A tenant's live usage against its quotas (tenants.usage, plain Python)."""

from tenants import limits, usage

CLIENTS = [
    {"connected": True, "subscriptions": 2, "queued": 0, "messages_in": 10, "messages_out": 4, "bytes_in": 100,
     "bytes_out": 40},
    {"connected": False, "subscriptions": 1, "queued": 5, "messages_in": None, "bytes_out": 7},
    {"connected": True},
]


def test_client_totals():
    assert usage.client_totals(CLIENTS, 3) == {
        "connected": 2, "offline": 1, "subscriptions": 3, "queued": 5, "messages_in": 10, "messages_out": 4,
        "bytes_in": 100, "bytes_out": 47, "retained": 3}
    assert usage.client_totals([], None)["retained"] is None


def test_quota_rows():
    effective = dict.fromkeys(limits.QUOTA_FIELDS) | {"max_connections": 3, "max_retained": 0}
    rows = {r["field"]: r for r in usage.quota_rows(effective, usage.client_totals(CLIENTS * 2, 9))}
    assert [r["field"] for r in usage.quota_rows(effective, None)] == list(limits.QUOTA_FIELDS)
    assert rows["max_connections"] == {"field": "max_connections", "limit": 3, "used": 4, "percent": 100,
                                       "has_usage": True}                       # over: capped at 100 %
    assert rows["max_retained"] == {"field": "max_retained", "limit": 0, "used": 9, "percent": None,
                                    "has_usage": True}                          # 0: no limit to measure against
    others = [r for f, r in rows.items() if f not in ("max_connections", "max_retained")]
    assert all(r["used"] is None and r["percent"] is None and not r["has_usage"] for r in others)
    devices = {r["field"]: r for r in usage.quota_rows(effective | {"max_devices": 10}, None, 4)}
    assert devices["max_devices"] == {"field": "max_devices", "limit": 10, "used": 4, "percent": 40,
                                      "has_usage": True}                        # the console's own count
    unknown = {r["field"]: r for r in usage.quota_rows(effective, None)}      # brokerd did not answer
    assert unknown["max_connections"]["used"] is None and unknown["max_connections"]["has_usage"]

"""A tenant's rates on a host that runs ``--workers N`` are the host's, not each worker's
(``TenantControl.host_shares``, fed every membership round). Before, every worker applied the
tenant's whole rate: with 2 workers a tenant limited to 1,000 bytes/s sent 2,000, with
``--workers auto`` on 16 cores 16 times its quota. The end-to-end case, two real workers, is
``tests/cluster/test_workers.py::test_a_tenants_rates_are_the_hosts_not_each_workers``."""

from brokerd.tenancy.control import TenantControl


def _control(**quota) -> TenantControl:
    auth = TenantControl()
    auth.apply("acme", 1, {"schema": 1, "default_acl": "allow", "quota": quota})
    return auth


def test_a_tenants_byte_rate_is_shared_by_its_connections_on_each_worker():
    auth = _control(tenant_bytes_in=1000, client_bytes_in=400)
    auth.connected["acme"] = 1
    limit_in, _ = auth.limiters("acme", 0.0, "c1")
    rates = sorted(b.rate for b, _ in limit_in.buckets)
    assert rates == [400, 1000]                                 # alone on its host: the whole rate
    auth.host_shares({"acme": 3}, 2, 1.0)                       # 1 connection here, 3 on the other worker
    rates = sorted(b.rate for b, _ in limit_in.buckets)
    assert rates == [250, 400]                                  # the client's own rate is its own
    tenant_bucket = next(b for b, _ in limit_in.buckets if b.rate == 250)
    assert tenant_bucket.burst == 250 and tenant_bucket.tokens <= 250
    # a new client here gets the same shared bucket at the same share
    other, _ = auth.limiters("acme", 2.0, "c2")
    assert any(b is tenant_bucket for b, _ in other.buckets)
    auth.connected["acme"] = 3
    auth.host_shares({"acme": 1}, 2, 3.0)
    assert tenant_bucket.rate == 750
    auth.host_shares({}, 2, 4.0)                                # the tenant has no one on the other worker
    assert tenant_bucket.rate == 1000


def test_a_debt_survives_a_change_of_share():
    """A message that put the tenant's bucket in debt is still owed after a new share: the rate
    changes, not what was spent."""
    auth = _control(tenant_bytes_in=1000)
    auth.connected["acme"] = 1
    limit_in, _ = auth.limiters("acme", 0.0, "c1")
    assert limit_in.charge(1, 3000, 0.0) == 2.0                 # 2,000 bytes owed at 1,000/s
    auth.host_shares({"acme": 1}, 2, 0.5)                       # half the rate from t=0.5: 1,500 owed then
    assert limit_in.owing(0.5) == 3.0                           # 1,500 at 500/s


def test_a_tenants_connect_rate_is_shared_evenly_with_at_least_one_connect_each():
    auth = _control(connect_rate=10)
    auth.host_shares({}, 2, 0.0)
    bucket = _connect_bucket(auth, 0.0)
    assert (bucket.rate, bucket.burst) == (5, 5)
    auth.host_shares({}, 4, 1.0)
    assert (bucket.rate, bucket.burst) == (2.5, 2.5)
    slow = _control(connect_rate=1)
    slow.host_shares({}, 4, 0.0)
    bucket = _connect_bucket(slow, 0.0)
    assert (bucket.rate, bucket.burst) == (0.25, 1.0)           # one CONNECT every 4 s here, still one at a time



def _connect_bucket(auth: TenantControl, now: float):
    return auth.connect_bucket("acme", auth.policy("acme").limit("connect_rate"), now)

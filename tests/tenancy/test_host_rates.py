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


class Host:
    """``n`` workers' TenantControls of one tenant, exchanging connections and claims every round
    as ``cluster.membership`` has them do; each worker's clients want ``wants[i]`` bytes a second."""

    def __init__(self, n: int, conns: list[int], rate: int = 1000):
        self.workers = [_control(tenant_bytes_in=rate) for _ in range(n)]
        self.limiters = []
        for w, c in zip(self.workers, conns, strict=True):
            w.connected["acme"] = c
        self.now = 0.0
        self.round()                                            # they learn of each other's connections
        self.limiters = [w.limiters("acme", self.now, f"c{i}")[0] for i, w in enumerate(self.workers)]

    def rates(self) -> list[float]:
        return [next(b for b, _ in lim.buckets).rate for lim in self.limiters]

    def run(self, wants: list[float], seconds: int) -> None:
        """Each worker's clients send what they want, as their bucket lets them (a round a second)."""
        for _ in range(seconds):
            for lim, want in zip(self.limiters, wants, strict=True):
                t = self.now
                while want and t < self.now + 1:
                    wait = lim.charge(1, want / 20, t)          # 20 messages a second of want/20 bytes
                    t += max(wait, 1 / 20)
            self.now += 1
            self.round()

    def round(self) -> None:
        claims = [w.rate_weights(self.now) for w in self.workers]
        for i, w in enumerate(self.workers):
            others = sum(o.connected["acme"] for j, o in enumerate(self.workers) if j != i)
            theirs = sum(c.get("acme", {}).get("bytes_in", 0.0) for j, c in enumerate(claims) if j != i)
            w.host_shares({"acme": others} if others else {}, len(self.workers), self.now,
                          {"acme": {"bytes_in": theirs}})


def test_a_single_busy_device_gets_nearly_the_tenants_whole_rate_on_a_host_of_workers():
    """One device of a tenant sends all it may, its 99 fellow devices are idle, spread over 4
    workers. Shared by connections its worker had a quarter of the tenant's rate: the device was
    held to 250 of its tenant's 1,000 bytes/s (and disconnected with 0x96 after 10 s over it),
    although the tenant was far under its rate. Shared by the workers' claims its worker has
    nearly all of it within two rounds."""
    host = Host(4, [25, 25, 25, 25])
    assert [round(r) for r in host.rates()] == [250, 250, 250, 250]
    host.run([5000, 0, 0, 0], 3)
    busy, *idle = host.rates()
    assert busy > 900, host.rates()
    assert all(r >= 10 for r in idle)                           # room for an idle device to start
    assert sum(host.rates()) <= 1000 * 1.05


def test_workers_whose_clients_all_want_more_share_the_rate_by_connections():
    """A tenant over its rate on both workers (one busy device each, 30 and 10 connections): the
    shares converge to the connections' (750 and 250) from wherever they started, the one that came
    second included."""
    host = Host(2, [30, 10])
    host.run([5000, 0], 3)                                       # the first alone: nearly all of it
    assert host.rates()[0] > 900
    host.run([5000, 5000], 12)
    a, b = host.rates()
    assert abs(a - 750) < 60 and abs(b - 250) < 60, host.rates()


def test_a_policy_change_between_two_rounds_claims_nothing_strange():
    """The tenant's policy changes between two rounds (its buckets are made again, from 0): the
    worker's claim is not what the old bucket had spent taken from the new one's (a negative claim
    made a share below 0)."""
    host = Host(2, [1, 1])
    host.run([5000, 5000], 2)
    for w in host.workers:
        w.apply("acme", 2, {"schema": 1, "default_acl": "allow", "quota": {"tenant_bytes_in": 1000}})
    host.limiters = [w.limiters("acme", host.now, f"c{i}")[0] for i, w in enumerate(host.workers)]
    host.now += 1
    claims = [w.rate_weights(host.now) for w in host.workers]
    assert all(c["acme"]["bytes_in"] >= 0 for c in claims), claims


def test_a_policy_change_keeps_the_tenants_buckets_and_a_new_rate_keeps_their_debt():
    """Any change of the tenant's policy made its shared buckets again, full: a tenant whose
    administrators changed something (an ACL rule, a device) 4 times a second passed its rate
    several times over. Now a bucket whose limit is the same goes on as it was; one whose limit
    changed goes on at the new rate, its debt kept."""
    auth = _control(tenant_msgs_in=10, connect_rate=4)
    limit_in, _ = auth.limiters("acme", 0.0, "c1")
    assert limit_in.charge(30, 0, 0.0) == 2.0                   # 20 in debt: 2 s at 10/s
    assert auth.connect_bucket("acme", 4, 0.0).allow(0.0, 4)
    auth.apply("acme", 2, {"schema": 1, "default_acl": "deny", "quota": {"tenant_msgs_in": 10, "connect_rate": 4}},
               now=0.5)
    again, _ = auth.limiters("acme", 0.5, "c1")
    assert again.owing(0.5) == 1.5
    assert not auth.connect_bucket("acme", 4, 0.5).allow(0.5, 4)
    auth.apply("acme", 3, {"schema": 1, "default_acl": "deny", "quota": {"tenant_msgs_in": 5, "connect_rate": 4}},
               now=1.0)
    lowered, _ = auth.limiters("acme", 1.0, "c1")
    assert lowered.owing(1.0) == 2.0                            # 10 still owed, at 5/s
    auth.apply("acme", 4, {"schema": 1, "default_acl": "deny", "quota": {}}, now=1.5)
    assert auth.limiters("acme", 1.5, "c1") == (None, None)

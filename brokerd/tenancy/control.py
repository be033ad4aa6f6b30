"""The node's view of every tenant's policy, and the decisions made from it (pure).

``TenantControl`` is the broker's authenticator when a control plane is
configured: it answers a CONNECT from the cached policies (never from the
database: a console outage does not stop devices from connecting), counts
each tenant's connections and connect rate, throttles addresses and user
names that keep failing, and builds each client's ACL and rate limiters.
``apply`` swaps in a new snapshot and says what changed so the broker can
act on live clients.
"""

import dataclasses
import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from ..protocol import reason as rc
from ..routing.cache import CacheBudget
from .acl import ACL_CACHE_NODE_BYTES, ClientAcl
from .policy import TenantPolicy, open_policy
from .ratelimit import Bucket, Limiter

FAIL_LIMIT = 10          # failed CONNECTs per address or user name ...
FAIL_WINDOW = 60.0       # ... per this many seconds, before further attempts are refused unchecked


@dataclass(slots=True)
class Identity:
    """Who a connection authenticated as."""

    tenant: str
    device: str | None            # None: anonymous
    credential: int | None = None
    via_cert: bool = False
    # what it proved itself with, to tell whether that still holds after a policy change: the
    # credential's hash of then (a rotated secret keeps its credential id), or its certificate's
    # SHA-256 fingerprint and CN (a device's certificate replaced in the console)
    proof: str | None = None
    cert_cn: str | None = None

    @property
    def username(self) -> str:
        return f"{self.tenant}/{self.device}" if self.device else ""


class TenantControl:
    def __init__(self, allow_anonymous: bool = False, anonymous_tenant: str = "default"):
        self.allow_anonymous = allow_anonymous
        self.anonymous_tenant = anonymous_tenant
        self.policies: dict[str, TenantPolicy] = {}
        self.version = 0                              # newest snapshot applied
        self.loaded = False                           # a first full load happened
        self.connected: dict[str, int] = {}           # tenant -> live connections on this node
        self.remote_connected: dict[str, int] = {}    # tenant -> live connections on the other nodes
        self._fingerprints: dict[str, tuple[str, str]] = {}
        self._cns: dict[str, set[tuple[str, str]]] = {}      # certificate CN -> the devices naming it
        self._connect_buckets: dict[str, Bucket] = {}
        self._tenant_buckets: dict[tuple[str, str], Bucket] = {}
        # --workers: a tenant's rates are the host's, shared among its workers (``host_shares``)
        self._host_workers = 1                        # live workers on this host
        self._host_others: dict[str, int] = {}        # tenant -> its connections on the host's other workers
        self._weights: dict[tuple[str, str], float] = {}     # (tenant, bucket) -> this worker's claim on it
        self._spent_seen: dict[tuple[str, str], tuple] = {}  # (tenant, bucket) -> (it, its ``spent``) at the last round
        self._weighed_at: float | None = None
        # (tenant, client id) -> its own buckets left not full when it disconnected, oldest first: a
        # client that reconnects goes on with them (a new connection's full bucket forgave its debt)
        self._client_buckets: OrderedDict[tuple[str, str], dict] = OrderedDict()
        self._failures: dict[tuple, list] = {}        # key -> [count, window start]
        self.refused_throttled = 0
        self.acl_budget = CacheBudget(ACL_CACHE_NODE_BYTES)   # every client's ACL verdict caches

    # --------------------------------------------------------------- policy

    def policy(self, tenant: str) -> TenantPolicy:
        p = self.policies.get(tenant)
        if p is None and tenant == self.anonymous_tenant:
            return open_policy(tenant)
        return p

    @staticmethod
    def build(slug: str, version: int, data: dict, devices: dict | None = None) -> TenantPolicy | None:
        """The policy a snapshot makes (None: the tenant was deleted); pure, so the poller runs it in
        its thread: a tenant of 100,000 devices takes 0.3 s to build, which the node's loop must not
        wait out (ValueError, KeyError, TypeError for a snapshot it cannot read). ``devices``: a
        schema-2 snapshot's, from its device rows."""
        if data.get("status") == "deleted":
            return None
        return TenantPolicy.from_snapshot(slug, version, data, devices)

    def prepare(self, slug: str, version: int, data: dict, devices: dict | None = None) -> TenantPolicy | None:
        """``build``, and what changed from the tenant's policy of now if only devices did (the
        poller's thread: comparing 150,000 devices takes ~0.1 s)."""
        new = self.build(slug, version, data, devices)
        old = self.policies.get(slug)
        if new is not None and old is not None:
            new.changed_devices = device_changes(old, new)
            new.diff_base = old
        return new

    def prepare_devices(self, slug: str, version: int, entries: dict) -> TenantPolicy | None:
        """The tenant's policy of now with the devices of ``entries`` (name -> DevicePolicy, None: deleted)
        in their new state, as its device rows say (the poller's thread: what a device's change costs
        is its own, a copy of the tenant's table of devices aside); None: no such tenant here."""
        old = self.policies.get(slug)
        if old is None:
            return None
        devices = with_devices(old.devices, entries)
        new = dataclasses.replace(old, version=version, devices=devices, diff_base=old)
        new.changed_devices = _with_certificate_peers(set(entries), old.devices, devices)
        return new

    def apply(self, slug: str, version: int, data: dict, built=...,
              now: float | None = None) -> tuple[TenantPolicy | None, TenantPolicy | None]:
        """Install a snapshot (``built``: ``build``'s result for it, when made already); -> (old, new)
        policy (new None: tenant deleted). ``now``: the tenant's rate buckets of a limit that changed
        go on at the new rate from then (what they saved up or owe kept); without it they start again."""
        old = self.policies.get(slug)
        new = self.build(slug, version, data) if built is ... else built
        if new is not None:
            if new.diff_base is not old:        # (diffed against another policy: not known)
                new.changed_devices = None
            new.diff_base = None                # (not kept alive by its successor)
        if new is None:
            self.policies.pop(slug, None)
        else:
            self.policies[slug] = new
        self.version = max(self.version, version)
        # certificate fingerprints: this tenant's only (rebuilt from every tenant's devices, a change of
        # one tenant cost the node's loop 0.23 s with a million devices on the platform); a fingerprint
        # another tenant's device took meanwhile (a certificate moved) stays that device's
        # -- and of the devices that changed only, when only devices did (a device added to a tenant of
        # 150,000 went through them all, twice, on the node's loop)
        changed = new.changed_devices if new is not None and old is not None else None
        was = () if old is None else old.devices.values() if changed is None else [
            d for d in map(old.devices.get, changed) if d is not None]
        now_ = () if new is None else new.devices.values() if changed is None else [
            d for d in map(new.devices.get, changed) if d is not None]
        fps = self._fingerprints
        if old is not None:
            for d in was:
                if d.cert_fingerprint and fps.get(d.cert_fingerprint, ("",))[0] == slug:
                    del fps[d.cert_fingerprint]
        if new is not None:
            for d in now_:
                if d.cert_fingerprint:
                    fps[d.cert_fingerprint] = (slug, d.name)
        # certificate CNs, with every device that names each: a CN two devices name identifies neither
        cns = self._cns
        if old is not None:
            for d in was:
                owners = cns.get(d.cert_cn) if d.cert_cn else None
                if owners is not None:
                    owners.discard((slug, d.name))
                    if not owners:
                        del cns[d.cert_cn]
        if new is not None:
            for d in now_:
                if d.cert_cn:
                    cns.setdefault(d.cert_cn, set()).add((slug, d.name))
        # rate buckets follow the new limits -- a change of anything else (a device, an ACL rule) leaves
        # them as they are: made again, each gave the tenant a full second's worth and forgave its debt
        for key in [k for k in self._tenant_buckets if k[0] == slug]:
            field = f"tenant_{key[1]}"
            if not self._rate_kept(self._tenant_buckets[key], old, new, field, now):
                del self._tenant_buckets[key]
        if new is None:
            for key in [k for k in self._client_buckets if k[0] == slug]:
                del self._client_buckets[key]
        bucket = self._connect_buckets.get(slug)
        if bucket is not None and not self._rate_kept(bucket, old, new, "connect_rate", now, connects=True):
            del self._connect_buckets[slug]
        return old, new

    def _cert_matches(self, tenant: str, dev, fingerprint: str | None, cn: str | None) -> bool:
        """A verified client certificate (its SHA-256 ``fingerprint``, hex, and subject CN) identifies
        ``tenant``'s device ``dev`` by fingerprint, or by CN when no other device on the platform names
        that CN: the listener's CA is every tenant's, and a CN two tenants gave their devices let the
        holder of either certificate log in as the other tenant's device by its user name."""
        if dev.cert_fingerprint and fingerprint == dev.cert_fingerprint:
            return True
        return bool(dev.cert_cn) and cn == dev.cert_cn and self._cns.get(cn) == {(tenant, dev.name)}

    def by_fingerprint(self, fp: str) -> tuple[str, str] | None:
        """(tenant, device) whose certificate has the SHA-256 fingerprint ``fp`` (hex, lower case)."""
        return self._fingerprints.get(fp)

    @staticmethod
    def _rate_kept(bucket: Bucket, old, new, field: str, now: float | None, connects: bool = False) -> bool:
        """May ``bucket`` (of limit ``field``) go on under the tenant's ``new`` policy? Yes when the
        limit is the same; when it changed, at the new rate from ``now`` (scaled as this worker's
        share of it was)."""
        was = old.limit(field) if old is not None else None
        rate = new.limit(field) if new is not None else None
        if not rate or not was:
            return False
        if rate == was:
            return True
        if now is None:
            return False
        scaled = bucket.rate * rate / was
        _rescale(bucket, scaled, max(scaled, 1.0) if connects else scaled, now)
        return True

    # ------------------------------------------------------ authentication

    @property
    def throttling(self) -> bool:
        """Whether ``admit`` may refuse anyone: some address or user name failed logins lately."""
        return bool(self._failures)

    def admit(self, peer: str, now: float) -> tuple[int, str] | None:
        """Before a CONNECT is decoded: an address with FAIL_LIMIT refused
        credentials within FAIL_WINDOW is refused (0x9F) without its CONNECT
        being decoded -- a CONNECT full of user properties costs nothing then.
        -> (reason code, reason), or None. (User names are only known once
        decoded: their throttle is applied in ``authenticate``.)"""
        host = peer.rsplit(":", 1)[0] if peer else ""
        if self._throttled(("addr", host), now):
            self.refused_throttled += 1
            return rc.CONNECTION_RATE_EXCEEDED, "too many failed logins from this address"
        return None

    def authenticate(self, connect, channel, now: float, wall: float, replaces=None):
        """-> (reason code, tenant, Identity). A refused CONNECT names the
        tenant when it is known (for its counters), never an Identity.
        ``replaces(tenant, client_id)``: whether the CONNECT takes over a live connection of its
        client id on this node -- one that leaves as it comes in, not counted twice
        against the tenant's connection quota (in a cluster: perhaps on another node, the
        CONNECT admitted on that condition, which its claim decides)."""
        host = channel.peer.rsplit(":", 1)[0] if channel.peer else ""
        username = connect.username
        if self._throttled(("addr", host), now) or (username and self._throttled(("user", username), now)):
            self.refused_throttled += 1
            return rc.CONNECTION_RATE_EXCEEDED, None, None
        code, tenant, ident = self._check(connect, channel, wall)
        if code in (rc.BAD_USERNAME_OR_PASSWORD, rc.NOT_AUTHORIZED):
            # only guesses count towards the lock-out: a suspended tenant's or disabled device's
            # reconnecting devices (right secrets, 0x87) must not lock out others behind their address
            if code == rc.BAD_USERNAME_OR_PASSWORD:
                self._failed(("addr", host), now)
                if username:
                    self._failed(("user", username), now)
            return code, tenant or self._claimed_tenant(username), None
        if code != rc.SUCCESS:
            return code, tenant, None
        policy = self.policy(tenant)
        limit = policy.limit("max_connections")
        if limit is not None:
            count = self.connections(tenant)
            if count >= limit and not (count == limit and replaces is not None and connect.client_id
                                       and replaces(tenant, connect.client_id)):
                return rc.QUOTA_EXCEEDED, tenant, None
        rate = policy.limit("connect_rate")
        if rate and not self.connect_bucket(tenant, rate, now).allow(now):
            return rc.CONNECTION_RATE_EXCEEDED, tenant, None
        return rc.SUCCESS, tenant, ident

    def connect_bucket(self, tenant: str, rate: int, now: float) -> Bucket:
        """``tenant``'s CONNECTs on this node: ``rate`` a second (its worker's share of it, ``host_shares``)."""
        bucket = self._connect_buckets.get(tenant)
        if bucket is None:
            rate /= self._host_workers
            bucket = self._connect_buckets[tenant] = Bucket(rate, max(rate, 1.0), now)
        return bucket

    def _claimed_tenant(self, username) -> str | None:
        """The existing tenant a username "TENANT/DEVICE" names (None: none)."""
        if not username or "/" not in username:
            return None
        slug = username.split("/", 1)[0]
        return slug if self.policy(slug) is not None else None

    def _check(self, connect, channel, wall):
        username, password = connect.username, connect.password
        cert = getattr(channel, "cert", None)
        if not username and password is None and cert is None:
            if not self.allow_anonymous:
                return rc.NOT_AUTHORIZED, None, None
            policy = self.policy(self.anonymous_tenant)
            if policy is None or not policy.active:
                return rc.NOT_AUTHORIZED, None, None
            return rc.SUCCESS, self.anonymous_tenant, Identity(self.anonymous_tenant, None)
        if not username and cert is not None:
            fp = hashlib.sha256(cert).hexdigest()
            found = self.by_fingerprint(fp)
            if found is None:
                return rc.BAD_USERNAME_OR_PASSWORD, None, None
            username = f"{found[0]}/{found[1]}"
        tenant, sep, device = (username or "").partition("/")
        if not sep or not tenant or not device:
            return rc.BAD_USERNAME_OR_PASSWORD, None, None
        policy = self.policies.get(tenant)
        if policy is None:
            return rc.BAD_USERNAME_OR_PASSWORD, None, None
        if not policy.active:
            return rc.NOT_AUTHORIZED, None, None
        dev = policy.devices.get(device)
        if dev is None:
            return rc.BAD_USERNAME_OR_PASSWORD, None, None
        if not dev.enabled:
            return rc.NOT_AUTHORIZED, None, None
        if password is not None:
            cred = dev.check_secret(password, wall)
            if cred is None:
                return rc.BAD_USERNAME_OR_PASSWORD, None, None
            return rc.SUCCESS, tenant, Identity(tenant, device, cred.id, proof=cred.hash)
        cn = getattr(channel, "cert_cn", None)
        if cert is not None:
            fp = hashlib.sha256(cert).hexdigest()
            if self._cert_matches(tenant, dev, fp, cn):
                return rc.SUCCESS, tenant, Identity(tenant, device, None, True, fp, cn)
        return rc.BAD_USERNAME_OR_PASSWORD, None, None

    def still_valid(self, ident: Identity, wall: float) -> str | None:
        """Why a connected client may no longer stay (None: it may)."""
        policy = self.policy(ident.tenant)
        if policy is None:
            return "tenant deleted"
        if not policy.active:
            return "tenant suspended"
        if ident.device is None:
            return None if self.allow_anonymous else "anonymous access disabled"
        dev = policy.devices.get(ident.device)
        if dev is None:
            return "device deleted"
        if not dev.enabled:
            return "device disabled"
        if ident.via_cert:
            # its certificate, as the device's entry names it now (its fingerprint or CN changed: revoked)
            return None if self._cert_matches(ident.tenant, dev, ident.proof, ident.cert_cn) else "certificate revoked"
        for cred in dev.credentials:
            if cred.id == ident.credential:
                if ident.proof is not None and cred.hash != ident.proof:
                    return "credential rotated"          # the secret it connected with is not this one's any more
                return None if cred.valid(wall) else "credential revoked or expired"
        return "credential revoked"

    def _throttled(self, key, now) -> bool:
        entry = self._failures.get(key)
        if entry is None:
            return False
        if now - entry[1] > FAIL_WINDOW:
            del self._failures[key]
            return False
        return entry[0] >= FAIL_LIMIT

    def _failed(self, key, now) -> None:
        entry = self._failures.get(key)
        if entry is None or now - entry[1] > FAIL_WINDOW:
            self._failures[key] = [1, now]
        else:
            entry[0] += 1
        if len(self._failures) > 100_000:       # bounded under a distributed attack
            cutoff = now - FAIL_WINDOW
            self._failures = {k: v for k, v in self._failures.items() if v[1] >= cutoff}

    # --------------------------------------------------- per-client policy

    def connections(self, tenant: str) -> int:
        """The tenant's live connections, on this node and (as last summed) the others."""
        return self.connected.get(tenant, 0) + self.remote_connected.get(tenant, 0)

    def connected_delta(self, tenant: str, delta: int) -> None:
        self.connected[tenant] = self.connected.get(tenant, 0) + delta

    def client_acl(self, ident: Identity, client_id: str) -> ClientAcl | None:
        """The client's compiled ACL; None when everything is allowed."""
        policy = self.policy(ident.tenant)
        if policy is None:
            return None
        acl = ClientAcl(policy.acl, policy.default_allow, ident.device, client_id, self.acl_budget)
        return None if acl.open else acl

    def limiters(self, tenant: str, now: float, client_id: str | None = None) -> tuple[Limiter | None, Limiter | None]:
        """(inbound, outbound) rate limiters for a new client of ``tenant``: the
        buckets its client id left when it last disconnected, if they were not
        full again yet."""
        policy = self.policy(tenant)
        if policy is None or not policy.quota:
            return None, None
        saved = self._client_buckets.pop((tenant, client_id), None) if client_id is not None else None
        out = []
        for direction in ("in", "out"):
            buckets = []
            for unit in ("msgs", "bytes"):
                rate = policy.limit(f"client_{unit}_{direction}")
                if rate:
                    bucket = saved.get(f"{unit}_{direction}") if saved else None
                    if bucket is None or bucket.rate != rate:
                        bucket = Bucket(rate, rate, now)
                    buckets.append((bucket, unit))
                rate = policy.limit(f"tenant_{unit}_{direction}")
                if rate:
                    key = (tenant, f"{unit}_{direction}")
                    bucket = self._tenant_buckets.get(key)
                    if bucket is None:
                        rate *= self._share(tenant)
                        bucket = self._tenant_buckets[key] = Bucket(rate, rate, now)
                    buckets.append((bucket, unit))
            out.append(Limiter(buckets) if buckets else None)
        return out[0], out[1]

    # ------------------------------------------------- rates of a host's workers

    def rate_weights(self, now: float) -> dict[str, dict[str, float]]:
        """A worker of a host that runs ``--workers N``, every membership round: its claim on each of
        its tenants' host-wide rates, for the host's other workers (``host_shares``) -> {tenant:
        {bucket: tokens a second}}. A claim is what the worker's clients took since the last round,
        plus its fair share (the tenant's rate by its share of the tenant's connections) when they
        took nearly all it had (they want more), plus a twentieth of that fair share while the
        tenant has clients here (room for one to start)."""
        dt = now - self._weighed_at if self._weighed_at is not None else 0.0
        self._weighed_at = now
        out: dict[str, dict[str, float]] = {}
        seen = self._spent_seen
        for key, bucket in self._tenant_buckets.items():
            tenant, name = key
            policy = self.policy(tenant)
            full = policy.limit(f"tenant_{name}") if policy is not None else None
            if not full:
                continue
            last = seen.get(key)
            # (a bucket made again since -- the tenant's policy changed -- starts from its own 0)
            used = (bucket.spent - last[1]) / dt if last is not None and last[0] is bucket and dt > 0 else 0.0
            seen[key] = (bucket, bucket.spent)
            fair = full * self._share(tenant) if self.connected.get(tenant) else 0.0
            weight = used + fair / 20
            if used >= 0.9 * bucket.rate:
                weight += fair
            self._weights[key] = weight
            out.setdefault(tenant, {})[name] = round(weight, 3)
        for key in [k for k in seen if k not in self._tenant_buckets]:
            del seen[key]
            self._weights.pop(key, None)
        return out

    def host_shares(self, others: dict[str, int], workers: int, now: float,
                    weights: dict[str, dict[str, float]] | None = None) -> None:
        """A worker of a host that runs ``--workers N`` (every membership round): a tenant's rates
        are the host's, as if it were one node, not each worker's (N workers let a tenant through
        at N times its rate). ``others``: each tenant's connections on the host's other live
        workers; ``weights``: the other workers' claims on the tenants' rates (``rate_weights``,
        summed); ``workers``: how many live ones there are, this one included.

        A tenant's message and byte rates are shared by the workers' claims: a single busy device
        gets nearly the whole rate within a round or two wherever it is, and workers whose clients
        all want more converge to shares in proportion to their connections. Without claims (no
        traffic yet) by connections. Its connect rate is shared evenly (connections arrive evenly
        spread), each worker keeping a burst of at least one CONNECT."""
        self._host_others = others
        self._host_workers = max(workers, 1)
        weights = weights or {}
        for key, bucket in self._tenant_buckets.items():
            tenant, name = key
            policy = self.policy(tenant)
            rate = policy.limit(f"tenant_{name}") if policy is not None else None
            if rate:
                mine = self._weights.get(key, 0.0)
                theirs = max(weights.get(tenant, {}).get(name, 0.0), 0.0)
                share = mine / (mine + theirs) if mine + theirs > 0 else self._share(tenant)
                rate *= min(max(share, MIN_SHARE), 1.0)
                _rescale(bucket, rate, rate, now)
        for tenant, bucket in self._connect_buckets.items():
            policy = self.policy(tenant)
            rate = policy.limit("connect_rate") if policy is not None else None
            if rate:
                rate /= self._host_workers
                _rescale(bucket, rate, max(rate, 1.0), now)

    def _share(self, tenant: str) -> float:
        """This worker's share of ``tenant``'s connections on its host (1.0 alone on its host)."""
        others = self._host_others.get(tenant, 0)
        if not others:
            return 1.0
        mine = max(self.connected.get(tenant, 0), 1)
        return mine / (mine + others)

    def keep_limiters(self, tenant: str, client_id: str, limit_in, limit_out, now: float) -> None:
        """A client of ``tenant`` disconnects: its own buckets that are not full
        are kept for its next connection (at most MAX_KEPT_BUCKETS clients, the
        oldest dropped; those full again by now go first)."""
        saved = self._client_buckets
        while saved:
            key, oldest = next(iter(saved.items()))
            if len(saved) < MAX_KEPT_BUCKETS and not all(_full(b, now) for b in oldest.values()):
                break
            del saved[key]
        own = {}
        for direction, limiter in (("in", limit_in), ("out", limit_out)):
            for bucket, unit in limiter.buckets if limiter else ():
                name = f"{unit}_{direction}"
                if bucket is not self._tenant_buckets.get((tenant, name)) and not _full(bucket, now):
                    own[name] = bucket
        if own:
            saved[(tenant, client_id)] = own


MIN_SHARE = 0.01        # of a tenant's host-wide rate, the least a worker's bucket gets (never a rate of 0)
MAX_KEPT_BUCKETS = 20_000       # clients whose buckets are kept between connections, per node (~0.5 KB each)


def with_devices(devices: dict, entries: dict) -> dict:
    """A copy of ``devices`` with ``entries`` (name -> DevicePolicy, None: deleted) in it."""
    out = dict(devices)
    for name, entry in entries.items():
        if entry is None:
            out.pop(name, None)
        else:
            out[name] = entry
    return out


def device_changes(old: TenantPolicy, new: TenantPolicy) -> frozenset | None:
    """The names of the devices whose entries differ between two policies of a tenant (added,
    removed, changed, or naming a certificate CN or fingerprint a changed one names or named: whether
    a CN names one device or two decides whether it identifies one), when nothing but devices differs
    that a connection's rights depend on (status, ACL, default, quotas); else None."""
    if (old.status != new.status or old.default_allow != new.default_allow or old.acl != new.acl
            or old.quota != new.quota):
        return None
    was, now = old.devices, new.devices
    changed = {name for name, d in now.items() if was.get(name) != d}
    changed.update(name for name in was if name not in now)
    return _with_certificate_peers(changed, was, now)


def _with_certificate_peers(changed: set, was: dict, now: dict) -> frozenset:
    """``changed`` and the devices naming a certificate CN or fingerprint one of them names or named."""
    entries = [d for name in changed for d in (was.get(name), now.get(name)) if d is not None]
    cns = {d.cert_cn for d in entries if d.cert_cn}
    fps = {d.cert_fingerprint for d in entries if d.cert_fingerprint}
    if cns or fps:
        changed.update(name for name, d in now.items() if d.cert_cn in cns or d.cert_fingerprint in fps)
    return frozenset(changed)


def _rescale(bucket: Bucket, rate: float, burst: float, now: float) -> None:
    """``bucket`` fills at ``rate`` from ``now`` on (what it saved up or owes so far kept, up to ``burst``)."""
    if bucket.rate == rate and bucket.burst == burst:
        return
    tokens = bucket.tokens + (now - bucket.at) * bucket.rate
    bucket.tokens = tokens if tokens < burst else burst
    bucket.at = now
    bucket.rate = rate
    bucket.burst = burst


def _full(bucket: Bucket, now: float) -> bool:
    return bucket.tokens + (now - bucket.at) * bucket.rate >= bucket.burst



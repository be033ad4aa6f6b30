"""Messages between nodes: out to the nodes that want them, in from a link.

A message goes once to every other node with a matching route, over this
node's link to it (``peers.Peers``); a shared group's message goes to one
node, round robin over those with members (this node among them). When
that node holds stored sessions for the message, the publisher is
acknowledged only once that node has stored it too (a request id in the
PUBLISH frame and an ACK back; ``requests.Requests``). A node whose sessions
await adoption gets no QoS 1/2 message for them: it is refused (the
publisher is told, and sends again) rather than acknowledged for nobody.

In, a forwarded message goes to this node's subscribers (the broker's
``forwarded``), a TARGET one to the session that moved, and what a moving
session wants also to its holder (``handoff.Handoff``); the ACK follows the
local store commit and every holder's part. A node fenced off the cluster,
or whose store refuses writes, takes on no QoS 1/2 message it could lose.

The two hot paths of a cluster, ``forward`` and ``on_publish``, run once per
message: they keep to plain attribute reads and no per-message allocation
beyond the frame.
"""

import logging

from ..protocol import properties as P
from ..protocol import reason as rc
from ..protocol.codec import decode_properties, encode_properties
from ..protocol.packets import PUBLISH as PUBLISH_PROPS
from ..protocol.packets import Publish, RulePublish
from . import frames
from .handoff import Handoff
from .ports import Clock, ClusterBroker, FenceState
from .requests import ACK_TIMEOUT, Requests
from .routes import ClusterRoutes

REDELIVER_TRIES = 3      # nodes a message owed through a shared group is sent to, at most, until one stores it

log = logging.getLogger("brokerd.cluster")


class _Tenant:
    """A tenant's name where ``Forwarder._parts`` takes its namespace."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


class _Join:
    """Calls ``done(all ok)`` after ``n`` calls."""

    __slots__ = ("n", "ok", "done")

    def __init__(self, n: int, done):
        self.n, self.ok, self.done = n, True, done

    def __call__(self, ok: bool) -> None:
        self.ok = self.ok and ok
        self.n -= 1
        if self.n == 0:
            self.done(self.ok)


class Forwarder:
    def __init__(self, node_id: str, routes: ClusterRoutes, requests: Requests, send, handoff: Handoff,
                 orphaned: dict, broker: ClusterBroker, fence: FenceState, clock: Clock):
        self.id = node_id
        self.routes = routes
        self._tenants = routes.tenants    # tenants with routes on other nodes, plain or wildcard (per message)
        self.requests = requests
        self._ids = requests.ids
        self._send = send                 # send(node, frame): over this node's link to it
        self.handoff = handoff
        self._moving = handoff.moving     # tenant -> sessions moving through this node (read per message)
        self._orphaned = orphaned         # dead node -> until when its sessions await adoption
        self.broker = broker
        self.fence = fence
        self.clock = clock

    # ================================================================== out

    def forward(self, ns, msg: Publish, groups: list, now: float) -> tuple[int, list]:
        """Send ``msg`` to the other nodes that want it and decide the shared
        groups cluster-wide (local members through the broker). -> (deliveries
        counted, [request ids whose ACK the publisher waits for])."""
        if not groups and not self._moving and ns.name not in self._tenants:
            return 0, ()                 # no other node has a route of this tenant (a one-node cluster)
        if self.fence.fenced or msg.topic.startswith("$SYS/"):
            return self._local_groups(ns, msg, groups, now), []
        nodes, rgroups = self.routes.match(ns.name, msg.topic)
        holders = self._moving.get(ns.name) if self._moving else None
        if not nodes and not rgroups and not holders:
            return (self._local_groups(ns, msg, groups, now) if groups else 0), []
        count = 0
        waits = []
        parts = self._parts(ns, msg, now)
        if holders:
            count += self.handoff.held(holders, msg, parts, waits, nodes)
        for node, durable in nodes.items():
            if node in self._orphaned:
                if durable and msg.qos:          # for sessions awaiting adoption: refused (see adoption)
                    req = next(self._ids)
                    waits.append(req)
                    self.requests.expect_ack(req, node, 0.0)      # fails at the next timeout round
                continue
            req = next(self._ids) if durable and msg.qos else 0
            self._send(node, frames.publish(req, *parts))
            if req:
                self._wait_ack(req, node, waits)
            count += 1
        local = {(g.name, g.filter): g for g in groups}
        orphaned = self._orphaned
        for gname, filt, members in rgroups:
            group = local.pop((gname, filt), None)
            if orphaned and not orphaned.keys().isdisjoint(members):
                # members on dead nodes whose stored sessions await adoption: the live members take the
                # message; with none, it is refused (see adoption), as for a plain route of a stored session
                live = {n: m for n, m in members.items() if n not in orphaned}
                if not live and group is None:
                    if msg.qos:
                        req = next(self._ids)
                        waits.append(req)
                        self.requests.expect_ack(req, next(iter(members)), 0.0)   # fails at the next round
                    continue
                members = live
            target = self.routes.pick_group_node(ns.name, gname, filt, members, len(group.members) if group else 0,
                                                 group is not None and group.connected())
            if target is None:
                if group is not None and self.broker.deliver_shared(ns, group, msg, now):
                    count += 1
                continue
            req = next(self._ids) if msg.qos else 0
            self._send(target, frames.publish(req, *parts, gname.encode(), filt.encode()))
            if req:
                self._wait_ack(req, target, waits)
            count += 1
        return count + self._local_groups(ns, msg, list(local.values()), now), waits

    def redeliver(self, tenant: str, gname: str, filt: str, msg: Publish, now: float, exclude=None,
                  done=None, tries: int = REDELIVER_TRIES) -> bool:
        """A message for the shared group ``gname`` on ``filt`` that its member here did not take: the
        member's session ended (``exclude``: it is not picked again), or a node's routes sent it here
        after the last member here left. It goes to another member of the group cluster-wide -- here or
        on another node, as ``forward`` picks them -- marked REDIRECTED (a node that has no member for
        it either answers with an error rather than passing it on again). ``done(ok)``: once it is
        stored where it went (False at once when no member is known anywhere). Without ``done``, a
        node that fails to take it (an error, no answer) makes it try again, ``tries`` times in all.
        -> whether a member was found."""
        broker = self.broker
        local = broker.group_members(tenant, gname, filt, exclude)
        members = None
        if not self.fence.fenced:
            _, rgroups = self.routes.match(tenant, msg.topic)
            orphaned = self._orphaned
            for g, f, nodes in rgroups:
                if g == gname and f == filt:
                    members = {n: m for n, m in nodes.items() if n not in orphaned} if orphaned else nodes
                    break
        # (its members here, negative when none of them is online: a node with one online goes first)
        target = self.routes.pick_group_node(tenant, gname, filt, members or {}, abs(local), local > 0)
        if target is None:
            before = broker.writes_pending()
            found = bool(local) and broker.deliver_group(tenant, gname, filt, msg, now, exclude)
            if done is not None:
                if not found:
                    # the sender's routes said a member was here, this node's know of none: they are behind
                    # (a member moving, just subscribed elsewhere): the publisher is refused and sends again
                    done(False)
                elif broker.writes_pending() > before:
                    broker.when_durable(done)
                else:
                    done(True)
            if not found and exclude is not None:
                log.warning("a message of %s's shared group %s/%s found no other member: dropped", tenant, gname,
                            filt)
            return found
        parts = self._parts(_Tenant(tenant), msg, now)
        req = next(self._ids) if msg.qos else 0
        self._send(target, frames.publish(req, parts[0], parts[1] | frames.REDIRECTED, *parts[2:], gname.encode(),
                                          filt.encode()))
        if req:
            if done is None and tries > 1:
                def done(ok: bool) -> None:
                    if not ok:
                        self.redeliver(tenant, gname, filt, msg, self.clock(), exclude, None, tries - 1)
            self.requests.expect_ack(req, target, self.clock() + ACK_TIMEOUT, done)
        elif done is not None:
            done(True)
        return True

    def _local_groups(self, ns, msg, groups, now) -> int:
        return sum(1 for g in groups if self.broker.deliver_shared(ns, g, msg, now))

    @staticmethod
    def _parts(ns, msg: Publish, now: float) -> tuple:
        """The fields of a PUBLISH frame for ``msg`` (after the request id)."""
        expiry = -1 if msg.expiry_at is None else max(0, min(frames.EXPIRY_MAX, int(msg.expiry_at - now)))
        rule = 0 if msg.__class__ is Publish else frames.RULE       # (a RulePublish stays one there)
        raw = msg.enc3
        if raw is not None and not msg.qos and not msg.retain and not msg.properties:
            # its 3.x wire form goes as it is: the receiving node sends those bytes on (not for a
            # message with 5.0 properties: a 3.x subscriber's delivery made enc3 too, without them)
            return 0, frames.RAW | rule, expiry, ns.name.encode(), msg.topic.encode(), b"", raw
        props = encode_properties(msg.properties) if msg.properties else b""
        return msg.qos, (1 if msg.retain else 0) | rule, expiry, ns.name.encode(), msg.topic.encode(), props, msg.payload

    def _wait_ack(self, req: int, node: str, waits: list) -> None:
        waits.append(req)
        self.requests.expect_ack(req, node, self.clock() + ACK_TIMEOUT)

    # =================================================================== in

    def on_publish(self, link, req, qos, flags, expiry, tenant, topic, props, payload, group, gfilter) -> None:
        now = self.clock()
        cls = RulePublish if flags & frames.RULE else Publish
        if flags & frames.RAW:
            # the 3.x QoS 0 wire form: PUBLISH header, remaining length, topic, payload
            raw = payload
            i = 2
            while raw[i - 1] & 0x80:
                i += 1
            msg = cls(topic, raw[i + 2 + len(topic.encode()):], 0, False)
            msg.enc3 = raw
        else:
            properties = None
            if props:
                properties, _ = decode_properties(props, 0, len(props), PUBLISH_PROPS)
            msg = cls(topic, payload, qos, bool(flags & 1), False, 0, properties)
        if expiry >= 0:
            if expiry == frames.EXPIRY_MAX and msg.properties:
                # more seconds left than the field holds: the interval as published (up to
                # 0xFFFFFFFF), less what the message waited on its way -- not known here, and
                # nothing next to 68 years
                expiry = max(expiry, msg.properties.get(P.MESSAGE_EXPIRY_INTERVAL, 0))
            msg.expiry_at = now + expiry
        broker = self.broker
        if req and (self.fence.fenced or broker.store_refusing()):
            # a fenced node dropped its sessions (the others adopt them): it must not take on
            # anything it could lose -- the publisher's node answers its client with the error
            link.send(frames.ack(req, rc.IMPLEMENTATION_SPECIFIC_ERROR))
            return
        before = broker.writes_pending() if req else 0
        wanting = None
        if flags & frames.TARGET:
            # for one session that moved: the node it left sends what still came there
            if self.handoff.came_through_old(tenant, group, msg, self._acker(link, req) if req else None):
                return
            broker.deliver_to_client(tenant, group, msg, now)
        else:
            if not broker.forwarded(tenant, msg, group or None, gfilter or None, now):
                if group:
                    # no member of the group here any more (the sender's routes are behind): another member
                    # takes it, the sender's answer waits for where it went -- unless it was sent on already
                    if flags & frames.REDIRECTED:
                        if req:
                            link.send(frames.ack(req, rc.IMPLEMENTATION_SPECIFIC_ERROR))
                        return
                    self.redeliver(tenant, group, gfilter, msg, now, None, self._acker(link, req) if req else None)
                    return
                if req and self.id in self._orphaned:
                    # this node is still loading the stored sessions of its former run (``Adoption.take_up``):
                    # the message may be for one of them -- refused, the publisher sends it again
                    link.send(frames.ack(req, rc.IMPLEMENTATION_SPECIFIC_ERROR))
                    return
            if self._moving and not group:
                wanting = self.handoff.wanting(tenant, topic)
        if not req:
            if wanting:
                parts = (qos, flags, expiry, tenant.encode(), topic.encode(), props, payload)
                for h in wanting:
                    self.handoff.hold(h, msg, parts, None)
            return
        stored = broker.writes_pending() > before
        if not wanting:
            if stored:
                broker.when_durable(self._acker(link, req))
            else:
                link.send(frames.ack(req, 0))
            return
        join = _Join(int(stored) + len(wanting), self._acker(link, req))
        if stored:
            broker.when_durable(join)
        parts = (qos, flags, expiry, tenant.encode(), topic.encode(), props, payload)
        for h in wanting:
            self.handoff.hold(h, msg, parts, join)

    @staticmethod
    def _acker(link, req: int):
        return lambda ok: link.send(frames.ack(req, 0 if ok else rc.IMPLEMENTATION_SPECIFIC_ERROR))

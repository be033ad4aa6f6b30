"""``memory://``: the store interface over dicts, with no durability.

brokerd with ``--store memory://`` writes no journal at all (sessions live
only in the process); this class exists so that the same contract tests run
over every backend, and as the reference the others are checked against.
"""

import copy

from .base import Store, session_expired
from .records import SessionRecord, unpack_will


class MemoryStore(Store):
    durable = False
    scheme = "memory"

    def _open(self):
        if not hasattr(self, "sessions"):
            self.sessions: dict[tuple, SessionRecord] = {}
            self.retained: dict[tuple, object] = {}
            self.delayed: dict[str, list] = {}      # id -> [DelayedMessage, holder's lease end or None]

    def _apply(self, ops):
        for op in ops:
            kind = op[0]
            if kind == "retain":
                self.retained[(op[1], op[2])] = op[3]
                continue
            if kind == "retain_del":
                self.retained.pop((op[1], op[2]), None)
                continue
            key = (op[1], op[2])
            if kind == "session":
                rec = self.sessions.get(key)
                if rec is None:
                    rec = self.sessions[key] = SessionRecord(op[1], op[2], op[3])
                rec.expiry_interval, rec.disconnected_at = op[3], op[4]
                rec.will, rec.will_due = unpack_will(op[5]), op[6]
                rec.device = op[7] if len(op) > 7 else None
                rec.sent = op[8] if len(op) > 8 else None
                continue
            if kind == "session_del":
                self.sessions.pop(key, None)
                continue
            rec = self.sessions.get(key)
            if rec is None:          # rows of a session that is gone
                continue
            if kind == "sub":
                rec.subscriptions = [s for s in rec.subscriptions if s.filter != op[3].filter] + [op[3]]
            elif kind == "unsub":
                rec.subscriptions = [s for s in rec.subscriptions if s.filter != op[3]]
            elif kind == "q":
                rec.last_seq += 1
                op[3].seq = rec.last_seq
                rec.queue.append(copy.copy(op[3]))
            elif kind == "q_state":
                for e in rec.queue:
                    if e.seq == op[3].seq:
                        e.state = op[3].state
            elif kind == "q_del":
                rec.queue = [e for e in rec.queue if e.seq != op[3].seq]
            elif kind == "rel":
                rec.awaiting_rel.add(op[3])
            elif kind == "rel_del":
                rec.awaiting_rel.discard(op[3])
            else:
                raise ValueError(f"unknown journal operation {kind!r}")

    def _delayed_add(self, items):
        for m in items:
            self.delayed[m.id] = [copy.deepcopy(m), None]

    def _delayed_claim(self, now, owner, until, limit):
        due = sorted((e for e in self.delayed.values() if e[0].due <= now and (e[1] is None or e[1] <= now)),
                     key=lambda e: (e[0].due, e[0].id))[:limit]
        for e in due:
            e[1] = until
        return [copy.deepcopy(e[0]) for e in due]

    def _delayed_done(self, items):
        for m in items:
            self.delayed.pop(m.id, None)

    def _delayed_purge(self, tenant):
        gone = [k for k, (m, _) in self.delayed.items() if m.tenant == tenant]
        for k in gone:
            del self.delayed[k]
        return len(gone)

    def _delayed_counts(self):
        counts: dict[str, int] = {}
        for m, _ in self.delayed.values():
            counts[m.tenant] = counts.get(m.tenant, 0) + 1
        return counts

    def _get_meta(self, key):
        return getattr(self, "meta", {}).get(key)

    def _put_meta(self, key, value):
        if not hasattr(self, "meta"):
            self.meta = {}
        self.meta[key] = bytes(value)

    def _load(self):
        sessions = [copy.deepcopy(r) for r in self.sessions.values()]
        for r in sessions:
            r.queue.sort(key=lambda e: e.seq)
        return sessions, [(t, topic, m) for (t, topic), m in self.retained.items()]

    def _load_session(self, tenant, client_id):
        rec = self.sessions.get((tenant, client_id))
        return copy.deepcopy(rec) if rec else None

    def _session_keys(self, after, limit):
        keys = sorted(k for k in self.sessions if after is None or k > tuple(after))
        return keys[:limit]

    def _purge(self, now):
        gone = [k for k, r in self.sessions.items() if session_expired(r, now)]
        for k in gone:
            del self.sessions[k]
        n = len(gone)
        for r in self.sessions.values():
            keep = [e for e in r.queue if e.msg.expiry_at is None or e.msg.expiry_at > now or e.qos == 2]
            n += len(r.queue) - len(keep)
            r.queue = keep
        old = [k for k, m in self.retained.items() if m.expiry_at is not None and m.expiry_at <= now]
        for k in old:
            del self.retained[k]
        return n + len(old)

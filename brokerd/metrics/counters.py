"""Per-tenant counters, kept on each tenant's namespace.

Plain ints in slots, bumped where the node's own ``Stats`` are bumped (the
rare paths: connects, drops, denials); messages and bytes are counted per
connection by the channels and added in when a connection closes, so the
per-message path pays nothing more for tenants (see ``node_figures``).
"""

# what a tenant's messages were dropped or refused for: each is a counter below, a key of
# the admin API's "dropped" and a label of brokerd_messages_dropped_total (the console's
# metrics/core.py reads them from here)
DROP_REASONS = ("queue_full", "expired", "too_large", "no_subscribers", "acl_denied", "quota")


class TenantCounters:
    __slots__ = ("connects", "disconnects", "connections_max", "auth_failures",
                 "queue_full", "expired", "too_large", "no_subscribers", "acl_denied", "quota",
                 "msgs_in", "msgs_out", "bytes_in", "bytes_out", "q1_in", "q2_in", "q1_out", "q2_out")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0)

    def closed(self, ch) -> None:
        """A connection of this tenant closed: its counts become the tenant's."""
        self.disconnects += 1
        self.msgs_in += ch.msgs_in
        self.msgs_out += ch.msgs_out
        self.bytes_in += ch.bytes_in
        self.bytes_out += ch.bytes_out
        self.q1_in += ch.qos_in[1]
        self.q2_in += ch.qos_in[2]
        self.q1_out += ch.qos_out[1]
        self.q2_out += ch.qos_out[2]

"""What a :class:`~brokerd.protocol.channel.Channel` needs from the rest of
the node, declared (the ports of a sans-IO core, as in aioquic and h11).

A channel talks to exactly two collaborators:

- ``hooks`` (:class:`TransportHooks`): what only the transport can do --
  write soon, close, stop and resume reading, wait;
- ``broker`` (:class:`ChannelBroker`): every decision that needs the rest of
  the node -- authentication and the session (``connect``), routing a
  PUBLISH, subscriptions, the store's durability, the node-wide budgets and
  the counters of what was dropped.

Nothing else of the broker is reached from a channel: the channel never
reads the broker's attributes or writes into its sets. ``brokerd.broker.Broker``
implements ``ChannelBroker`` (``tests/protocol/test_ports.py`` checks that it
has every method, with these names); a test can give a channel any object that
does.
"""

from typing import Protocol


class TransportHooks(Protocol):
    def wake(self) -> None:
        """``channel.out`` went from empty to non-empty: flush it this iteration."""

    def close(self) -> None:
        """Flush ``channel.out``, then close the connection."""

    def pause_reading(self, why: int = ...) -> None: ...

    def resume_reading(self, why: int = ...) -> None: ...

    def throttle(self, wait: float) -> None:
        """Over the inbound rate: read nothing for ``wait`` s, then ``channel.resume_input``."""

    def throttle_output(self, wait: float) -> None:
        """Over the outbound rate: ``channel.resume_output`` in ``wait`` s."""

    def peer_address(self) -> str:
        """The client's address ("host:port"), for a Channel made with ``peer=None``."""

    def flush_now(self) -> None:
        """``channel.out`` holds many answers (``OUT_AT_ONCE``): write them now, not at the end of the
        loop's iteration, and read no more while the client does not read them."""

    def end_turn(self) -> None:
        """A read of ``TURN_BYTES`` or more was handled: read no more in this iteration of the loop."""


class ChannelBroker(Protocol):
    # tenant -> its rules, for the tenants with some: the channel only asks whether it is empty (an
    # acknowledged delivery costs nothing more while no tenant of the node has a rule: message_acked)
    rules: dict

    # ------------------------------------------------------------ connection
    def admit(self, channel, now: float) -> tuple[int, str] | None:
        """Before decoding anything: (reason code, reason) to refuse the
        connection with (the failed-login throttle of its address), or None."""

    def preauth_charge(self, delta: int) -> bool:
        """Bytes of an incomplete CONNECT held (+) or let go (-); False when
        holding ``delta`` more passes the node's pre-authentication budget."""

    def connect(self, channel, connect, now: float) -> None:
        """Decide a CONNECT: the broker calls ``channel.accept`` or ``channel.refuse``, maybe later."""

    def connect_aborted(self, channel) -> None:
        """The channel closed while its CONNECT was being decided."""

    def channel_closed(self, channel, now: float, will: bool) -> None:
        """An accepted channel closed (``will``: its will follows the usual rules)."""

    # ------------------------------------------------------------- messages in
    def publish(self, msg, channel, now: float, rel: int = 0) -> int | None:
        """Route a client's PUBLISH; -> the ack's reason code, or None when the
        ack waits (``channel.publish_done`` follows), or -- QoS 1 only -- the code
        plus ``reason.AFTER_COMMIT`` when the ack waits for the store's next commit
        alone (``channel.acks_committed`` follows). ``rel``: a QoS 2 id kept until PUBREL."""

    def rel_done(self, session, pid: int, fn) -> bool:
        """A QoS 2 id was released; True when PUBCOMP must wait for ``fn(ok)`` (the store)."""

    def rel_refused(self, session, pid: int) -> None:
        """A QoS 2 id's flow ended with a negative PUBREC: the id is free again (also in the store)."""

    def dropped(self, channel, msg, code: int) -> None:
        """A PUBLISH refused by the channel itself (e.g. a payload that is not UTF-8)."""

    # ------------------------------------------------------------ subscriptions
    def subscribe(self, channel, requests: list, sub_id: int | None, props, now: float) -> tuple[list, list]:
        """-> (reason codes, [(topic filter, iterator of (retained message, qos, subscription ids))]
        to send after the SUBACK: ``Channel.send_retained`` takes from each as the connection allows)."""

    def unsubscribe(self, channel, filters: list, now: float) -> list:
        """-> reason codes."""

    def deliver_retained(self, channel, msg, qos: int, sub_ids, now: float) -> None:
        """A retained message the SUBSCRIBE matched, to ``channel`` (QoS 1/2 to a stored
        session: through its stored queue, like any message it is owed)."""

    def durable_pending(self, session) -> bool:
        """Must the ack of what just changed in ``session`` wait for the store?"""

    def after_commit(self, fn) -> None:
        """``fn(ok)`` once what was written so far is durable."""

    # ------------------------------------------------------------ messages out
    def committed_generation(self) -> int | None:
        """The last journal batch known durable, or None without a store: a
        queued stored delivery with a later ``gen`` must not be sent yet."""

    def gate(self, channel) -> None:
        """``channel`` holds a stored delivery that waits for a commit: ``resume_output`` after it."""

    def acked(self, session, delivery) -> None:
        """The client acknowledged (or can never get) a stored delivery."""

    def released(self, session, delivery) -> None:
        """QoS 2 PUBREC of a stored delivery: PUBREL is owed now."""

    def queue_dropped(self, session, dropped: list, by=None) -> None:
        """The session's queue was full: these deliveries were dropped (``by``: the delivery whose
        put pushed them out -- itself among them when it was the one dropped)."""

    def discarded(self, session, delivery, expired: bool) -> None:
        """A queued delivery left unsent: expired, or too large for the client."""

    def expired(self, channel, msg, retain: bool) -> None:
        """A QoS 0 message expired before it could be sent (with ``retain`` its copy's flag)."""

    def message_acked(self, channel, delivery, now: float) -> None:
        """The client acknowledged a QoS 1 / 2 delivery (PUBACK / PUBCOMP), whatever its store
        (called only while ``rules`` is not empty: the tenants' ``$events/message_acked``)."""

    def too_large(self, channel, msg, qos: int, retain: bool) -> None:
        """A message above the client's Maximum Packet Size was not sent (at ``qos``, ``retain``)."""

    def congestion(self, delta: int) -> None:
        """Bytes a congested connection holds (+) or let go (-), for the node's queue budget."""

"""A client's session state, pure data: subscriptions, inflight window,
bounded message queue, QoS 2 packet ids awaiting PUBREL, expiry."""

from .session import Delivery, MemoryBudget, MessageQueue, Session, Subscription

__all__ = ["Delivery", "MemoryBudget", "MessageQueue", "Session", "Subscription"]

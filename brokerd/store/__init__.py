"""Durable state of brokerd: sessions, subscriptions, queues, retained messages.

One interface (:class:`brokerd.store.base.Store`), three backends chosen by
URL: ``memory://`` (no durability), ``sqlite:///PATH`` (embedded default) and
``hbase://HOST:PORT?table_prefix=NAME`` (HBase through its Thrift gateway).
"""

from .base import Store, StoreDataError, StoreError
from .journal import Journal


def open_store(url: str) -> Store:
    """The backend for ``url`` (not yet opened)."""
    scheme = url.split(":", 1)[0]
    if scheme == "memory":
        from .memory import MemoryStore

        return MemoryStore(url)
    if scheme == "sqlite":
        from .sqlite import SQLiteStore

        return SQLiteStore(url)
    if scheme == "hbase":
        from .hbase import HBaseStore

        return HBaseStore(url)
    raise ValueError(f"unknown store URL {url!r}: use memory://, sqlite:///PATH or hbase://HOST:PORT")


__all__ = ["Journal", "Store", "StoreDataError", "StoreError", "open_store"]

"""The sans-IO MQTT core: codec and per-connection state machine.

Nothing in this package imports asyncio, touches a socket or reads a clock:
callers pass bytes and ``now`` in and take bytes and events out.
"""

"""asyncio transports: the only code that touches sockets."""

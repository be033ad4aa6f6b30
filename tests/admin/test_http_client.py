"""The client a node asks the other nodes' admin APIs with (``brokerd.admin.http.request``):
an answer is bounded in time and in bytes (another node's answer is read whole)."""

import asyncio

import pytest

from brokerd.admin.http import request


async def _serve(answer: bytes):
    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_an_answer_larger_than_allowed_is_given_up_on():
    async def go():
        body = b"x" * 300_000
        server, port = await _serve(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        async with server:
            assert await request("127.0.0.1", port, "GET", "/", {}, max_bytes=400_000) == (200, body)
            with pytest.raises(ValueError, match="more than 100000 bytes"):
                await request("127.0.0.1", port, "GET", "/", {}, max_bytes=100_000)

    asyncio.run(asyncio.wait_for(go(), 20))

"""Claims and disconnect waves go to Redis on a connection of their own
(``bus.Line``), not through redis-py's per-command path. What a node relies
on must hold there too: a script Redis forgot is loaded again, and a call
that timed out never hands its late reply to the next call -- which would
give a client id to the wrong node."""

import asyncio
import time

from brokerd.cluster.bus import Bus, key_of


def run(coro):
    return asyncio.run(coro)


def test_claims_and_waves_work_after_redis_forgot_its_scripts(redis_server, tag):
    async def go():
        bus = Bus(redis_server.url(prefix=tag), "n1")
        try:
            assert await bus.try_claim("t", "a") is None
            assert await bus.owner("t", "a") == "n1"
            await bus.redis.script_flush()
            assert await bus.try_claim("t", "b") is None            # loaded again, then run
            assert await asyncio.gather(bus.try_claim("t", "c"), bus.try_claim("t", "d")) == [None, None]
            await bus.set_will("t", "b", b"will")
            await bus.redis.script_flush()
            await bus.gone("t", "a", ended=True, had_will=False)
            await bus.gone("t", "b", ended=False, had_will=True)
            assert await bus.owner("t", "a") is None
            assert await bus.owner("t", "b") == "n1"
            assert await bus.redis.hget(bus.k("wills", "n1"), key_of("t", "b")) is None
            assert [await bus.owner("t", c) for c in "cd"] == ["n1", "n1"]
        finally:
            await bus.close()

    run(go())


def test_calls_that_timed_out_are_sent_again_and_no_late_reply_answers_the_next_claim(redis_server, tag):
    """Redis stalls (CLIENT PAUSE) past the bus's 2 s socket timeout. A claim and a disconnect wave
    made meanwhile are sent again on a new connection and take effect (as redis-py's retry did); the
    first attempt's reply, which Redis sends once it resumes, is never read as a later call's answer."""
    async def go():
        n1, n2 = Bus(redis_server.url(prefix=tag), "n1"), Bus(redis_server.url(prefix=tag), "n2")
        try:
            assert await n1.try_claim("t", "x") is None
            assert await n1.try_claim("t", "w") is None
            await n1.set_will("t", "w", b"will")
            assert await n2.try_claim("t", "warm") is None          # n2's line is open
            redis_server.client().execute_command("CLIENT", "PAUSE", "2600", "ALL")
            t0 = time.monotonic()
            answer, _ = await asyncio.gather(n2.try_claim("t", "x"), n1.gone("t", "w", ended=True, had_will=True))
            assert time.monotonic() - t0 > 2.0                      # the first attempts timed out
            assert answer == "n1"
            assert await n1.owner("t", "w") is None                 # the wave let go of w and its will
            assert await n1.redis.hget(n1.k("wills", "n1"), key_of("t", "w")) is None
            assert await n2.try_claim("t", "y") is None             # y was free: not a late reply's "n1"
            assert await n2.owner("t", "y") == "n2"
            assert await n1.try_claim("t", "z") is None
        finally:
            await n1.close()
            await n2.close()

    run(go())


def test_a_bus_url_with_another_encoding_claims_the_keys_its_other_commands_read(redis_server, tag):
    async def go():
        bus = Bus(redis_server.url(prefix=tag) + "&encoding=latin-1", "n1")
        try:
            assert await bus.try_claim("t", "caf\u00e9") is None
            assert await bus.owner("t", "caf\u00e9") == "n1"
            assert await bus.redis.hkeys(bus.k("clients", "t")) == [b"caf\xe9"]
        finally:
            await bus.close()

    run(go())

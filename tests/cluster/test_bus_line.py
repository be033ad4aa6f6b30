"""Claims, disconnect waves and the event log go to Redis on connections of
their own (``bus.Line``), not through redis-py's per-command path. What a node relies
on must hold there too: a script Redis forgot is loaded again, and a call
that timed out never hands its late reply to the next call -- which would
give a client id to the wrong node."""

import asyncio
import contextlib
import time

import pytest

from brokerd.cluster.bus import Bus, key_of


def run(coro):
    return asyncio.run(coro)


@contextlib.asynccontextmanager
async def two_nodes(redis_server, tag):
    """The buses of nodes n1 and n2 on one Redis, closed after."""
    n1, n2 = Bus(redis_server.url(prefix=tag), "n1"), Bus(redis_server.url(prefix=tag), "n2")
    try:
        yield n1, n2
    finally:
        await n1.close()
        await n2.close()


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


def test_a_claim_answers_free_here_held_elsewhere_or_locked_alone_and_in_a_batch(redis_server, tag):
    """A free id becomes this node's, one already here stays so, one another node holds names that
    node, a locked one answers "!" -- the same whether the claim goes alone (one script) or with others
    (the batch script)."""
    async def go():
        async with two_nodes(redis_server, tag) as (n1, n2):
            assert await n2.try_claim("t", "theirs") is None
            assert await n2.lock("t", "locked") is not None
            for ids in (["free", "theirs", "locked"], ["free2", "free", "theirs2", "locked2"]):
                if "theirs2" in ids:
                    assert await n2.try_claim("t", "theirs2") is None
                    assert await n2.lock("t", "locked2") is not None
                alone = [await n1.try_claim("t", ids[0])]                       # one claim: one script
                together = await asyncio.gather(*(n1.try_claim("t", c) for c in ids[1:]))   # the batch
                answers = dict(zip(ids, alone + together, strict=True))
                for cid, answer in answers.items():
                    assert answer == {"fre": None, "the": "n2", "loc": "!"}[cid[:3]], (cid, answer)
            assert await n1.owner("t", "free") == "n1" and await n1.owner("t", "free2") == "n1"
            assert await n1.owner("t", "theirs") == "n2"
            assert await n1.owner("t", "locked") is None

    run(go())


def test_calls_that_timed_out_are_sent_again_and_no_late_reply_answers_the_next_claim(redis_server, tag):
    """Redis stalls (CLIENT PAUSE) past the bus's 2 s socket timeout. A claim and a disconnect wave
    made meanwhile are sent again on a new connection and take effect (as redis-py's retry did); the
    first attempt's reply, which Redis sends once it resumes, is never read as a later call's answer."""
    async def go():
        async with two_nodes(redis_server, tag) as (n1, n2):
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


def test_the_event_log_is_written_and_read_in_order_with_either_protocol(redis_server, tag):
    """The event log's reads and writes go on lines of their own too; Redis answers XREAD as a map
    (RESP3, redis-py's default here) or as a list (``?protocol=2``): both read the same events."""
    async def go(protocol):
        writer = Bus(redis_server.url(prefix=f"{tag}p{protocol}") + f"&protocol={protocol}", "n1")
        reader = Bus(redis_server.url(prefix=f"{tag}p{protocol}") + f"&protocol={protocol}", "n2")
        try:
            assert await reader.read_events("0-0", block_ms=50) == []
            ids = await writer.publish_events([{"t": "route", "n": "n1", "f": "a/b", "s": 1}, {"t": "gone", "of": "x"}])
            more = await asyncio.gather(*(writer.publish_events([{"t": "route", "n": "n1", "f": f"c/{i}", "s": 1}])
                                          for i in range(5)))        # writers take turns on the one line
            ids += [i for group in more for i in group]
            assert len(set(ids)) == 7
            events = await reader.read_events("0-0")
            assert [eid for eid, _ in events] == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
            assert events[0][1] == {"t": "route", "n": "n1", "f": "a/b", "s": 1}
            assert events[1][1] == {"t": "gone", "of": "x"}
            assert sorted(e["f"] for _, e in events[2:]) == [f"c/{i}" for i in range(5)]
            assert await reader.read_events(events[-1][0], block_ms=50) == []
            # a node reads past its own events unparsed (None), anyone else's whole; an entry written
            # before events named their node in a field of their own is read as before
            old = (await writer.redis.xadd(writer.k("events"), {"e": '{"t":"route","n":"n1","f":"d","s":1}'})).decode()
            mine = await writer.read_events("0-0", own="n1")
            assert [eid for eid, _ in mine] == [eid for eid, _ in events] + [old]
            assert [e for _, e in mine] == [None, {"t": "gone", "of": "x"}] + [None] * 5 + [
                {"t": "route", "n": "n1", "f": "d", "s": 1}]
            assert [e for _, e in await reader.read_events("0-0", own="n2")] == [e for _, e in events] + [
                {"t": "route", "n": "n1", "f": "d", "s": 1}]
        finally:
            await writer.close()
            await reader.close()

    for protocol in (2, 3):
        run(go(protocol))


def test_a_read_of_the_event_log_cut_short_hands_its_late_reply_to_no_one(redis_server, tag):
    """The node stopping (or the read's task cancelled) while a read waits on Redis: the line's
    connection is closed, so the events that read would have got are not taken as the next read's."""
    async def go():
        bus = Bus(redis_server.url(prefix=tag), "n1")
        try:
            first = await bus.publish_events([{"t": "gone", "of": "a"}])
            waiting = asyncio.ensure_future(bus.read_events(first[0], block_ms=1000))
            await asyncio.sleep(0.1)
            waiting.cancel()
            second = await bus.publish_events([{"t": "gone", "of": "b"}])
            assert await bus.read_events(second[0], block_ms=100) == []     # not the cancelled read's "b"
            assert [e for _, e in await bus.read_events(first[0])] == [{"t": "gone", "of": "b"}]
        finally:
            await bus.close()

    run(go())


def test_an_error_among_a_lines_replies_is_raised_after_all_are_read(redis_server, tag):
    """Several commands in one write: an error reply in the middle (WRONGTYPE) is raised once the
    replies after it have been read, so the next call gets its own reply."""
    from redis.exceptions import ResponseError

    async def go():
        bus = Bus(redis_server.url(prefix=tag), "n1")
        line = bus._events_out
        try:
            key = bus.k("plain")
            with pytest.raises(ResponseError, match="WRONGTYPE"):
                await line.calls([("SET", key, "v"), ("XADD", key, "*", "e", "{}"), ("GET", key)])
            assert await line.call("GET", key) == b"v"
            assert await line.calls([("STRLEN", key), ("EXISTS", key)]) == [1, 1]
        finally:
            await bus.close()

    run(go())


def test_an_unreadable_entry_of_the_event_log_is_passed_over_not_read_for_ever(redis_server, tag, caplog):
    """An entry without the event field, or whose event is not JSON, is skipped with a warning and the
    log is read on after it; before, every read failed on it again."""
    async def go():
        bus = Bus(redis_server.url(prefix=tag), "n1")
        try:
            key = bus.k("events")
            await bus.redis.xadd(key, {"x": "1"})
            await bus.redis.xadd(key, {"e": "{not json"})
            await bus.redis.xadd(key, {"e": "[1]"})
            good = await bus.publish_events([{"t": "gone", "of": "a"}])
            events = await bus.read_events("0-0")
            assert [e for _, e in events] == [{"t": "unreadable"}] * 3 + [{"t": "gone", "of": "a"}]
            assert events[-1][0] == good[0]
        finally:
            await bus.close()

    run(go())
    assert sum("unreadable, skipped" in r.getMessage() for r in caplog.records) == 3


def test_an_event_is_read_whole_whatever_its_text_and_what_json_refuses_is_passed_over(redis_server, tag, caplog):
    """Entries are parsed by the JSON decoder's scanner, not ``json.loads``: an event with text that
    is not ASCII (a topic's accents, its bytes longer than its characters), written with spaces
    around it or in another encoding ``json.loads`` detects (UTF-16, a UTF-8 BOM) is read whole, and
    what ``json.loads`` refuses (text after the object, not an object, not UTF-8) is passed over, in
    the entries as nodes write them now (``n`` first) and older ones (``e`` alone, or first: of two
    ``e`` fields the first is the event, as before)."""
    async def go():
        bus = Bus(redis_server.url(prefix=tag), "n1")
        try:
            key = bus.k("events")
            ids = await bus.publish_events([{"t": "route", "n": "n2", "tn": "t", "f": "caf\u00e9/\u6e29\u5ea6", "s": 1}])
            for text in (' {"t":"gone","of":"a"} ', '{"t":"gone","of":"b"} x', '"gone"', "[]", b"\xff{}",
                         '{"t":"gone","of":"\u00e9"}'):
                await bus.redis.xadd(key, {"n": "n2", "e": text})
            await bus.redis.xadd(key, {"n": "n2", "e": '{"t":"gone","of":"d"}'.encode("utf-16")})
            await bus.redis.xadd(key, {"n": "n2", "e": b'\xef\xbb\xbf{"t":"gone","of":"e"}'})
            await bus.redis.xadd(key, {"n": "n2", "e": b'{"t":"gone","of":"\xff"}'})
            await bus.redis.xadd(key, {"e": '{"t":"gone","of":"c"}\n'})
            await bus.redis.xadd(key, {"e": '{"t":"gone","of":"c"} x'})
            await bus.redis.execute_command("XADD", key, "*", "e", '{"t":"gone","of":"f"}', "e", "not json")
            events = await bus.read_events("0-0", own="n1")
            assert events[0] == (ids[0], {"t": "route", "n": "n2", "tn": "t", "f": "caf\u00e9/\u6e29\u5ea6", "s": 1})
            assert [e for _, e in events[1:]] == [{"t": "gone", "of": "a"}] + [{"t": "unreadable"}] * 4 + [
                {"t": "gone", "of": "\u00e9"}, {"t": "gone", "of": "d"}, {"t": "gone", "of": "e"},
                {"t": "unreadable"}, {"t": "gone", "of": "c"}, {"t": "unreadable"}, {"t": "gone", "of": "f"}]
        finally:
            await bus.close()

    run(go())
    assert sum("unreadable, skipped" in r.getMessage() for r in caplog.records) == 6


def test_a_call_cut_off_by_the_bus_closing_is_not_sent_again(redis_server, tag):
    """Closing the bus while a read waits on Redis ends that read with the connection's error; it
    is not sent again on a new connection that nothing would close."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    async def go():
        bus = Bus(redis_server.url(prefix=tag), "n1")
        first = await bus.publish_events([{"t": "gone", "of": "a"}])
        waiting = asyncio.ensure_future(bus.read_events(first[0], block_ms=1000))
        await asyncio.sleep(0.1)
        await bus.close()
        with pytest.raises(RedisConnectionError):
            await waiting
        assert not bus._events_in.conn.is_connected         # and left closed

    run(go())


def test_a_claim_held_back_by_the_gap_past_the_bus_closing_opens_no_connection(redis_server, tag):
    """A claim waiting for --cluster-claim-gap when the node stops gets an error, and no new Redis
    connection is opened for it (nothing would close it)."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    async def go():
        bus = Bus(redis_server.url(prefix=tag), "n1", claim_gap=0.3)
        batch = bus._claims.send
        calls = []

        async def slow(items):                 # the first call: a round trip of 50 ms
            calls.append(len(items))
            if len(calls) == 1:
                await asyncio.sleep(0.05)
            return await batch(items)

        bus._claims.send = slow
        storm = asyncio.gather(*(bus.try_claim("t", f"s{i}") for i in range(3)))
        await asyncio.sleep(0.02)
        held = asyncio.ensure_future(bus.try_claim("t", "late"))      # waits for the gap
        assert await storm == [None] * 3
        await asyncio.sleep(0.05)                                      # still held: the gap is 0.3 s
        assert calls == [3] and not held.done()
        await bus.close()
        with pytest.raises(RedisConnectionError):
            await held
        assert calls == [3, 1]                                         # the timer fired after the close
        assert not bus._claim_line.conn.is_connected

    run(go())


def test_in_a_connect_storm_claims_wait_for_the_gap_and_go_together_but_a_lone_claim_goes_at_once(
        redis_server, tag):
    """--cluster-claim-gap: the claims made while a call of several was on its way wait until the gap
    after its start and go in one call; a claim made when no call is on its way, or while a call of
    one is, is not held back."""
    gap = 1.0

    async def go():
        bus = Bus(redis_server.url(prefix=tag), "n1", claim_gap=gap)
        loop = asyncio.get_running_loop()
        starts = []                            # (loop time, claims carried) of each claim call
        batch = bus._claims.send

        async def slow(items):                 # a round trip of 50 ms: CONNECTs come in while it lasts
            starts.append((loop.time(), len(items)))
            await asyncio.sleep(0.05)
            return await batch(items)

        bus._claims.send = slow
        try:
            for cid in ("a", "b", "c"):                      # one at a time: no gap
                t0 = loop.time()
                assert await bus.try_claim("t", cid) is None
                assert loop.time() - t0 < gap / 2
            lone = asyncio.ensure_future(bus.try_claim("t", "d"))
            await asyncio.sleep(0.01)
            after_lone = asyncio.ensure_future(bus.try_claim("t", "e"))    # during a call of one claim
            assert await asyncio.gather(lone, after_lone) == [None, None]
            assert [n for _, n in starts] == [1, 1, 1, 1, 1]
            assert starts[4][0] - starts[3][0] < gap / 2
            starts.clear()
            first = asyncio.gather(*(bus.try_claim("t", f"s{i}") for i in range(5)))
            later = []
            for burst in range(3):                           # more CONNECTs while its call is on its way
                await asyncio.sleep(0.01)
                later += [asyncio.ensure_future(bus.try_claim("t", f"l{burst}{i}")) for i in range(4)]
            assert await first == [None] * 5
            assert await asyncio.gather(*later) == [None] * 12
            assert [n for _, n in starts] == [5, 12]
            assert starts[1][0] - starts[0][0] >= gap - 0.05   # (recorded an iteration after each start)
            t0 = loop.time()                                 # the storm over: no call on its way
            assert await bus.try_claim("t", "z") is None
            assert loop.time() - t0 < gap / 2
            owners = await bus.redis.hgetall(bus.k("clients", "t"))
            assert len(owners) == 23 and set(owners.values()) == {b"n1"}
        finally:
            await bus.close()

    run(go())

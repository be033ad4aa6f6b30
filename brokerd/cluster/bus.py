"""Redis as the cluster's bus (asyncio side).

Keys, all under a prefix (``brokerd`` by default, ``?prefix=NAME`` in the URL):

``node:{id}``           JSON of a live node (its link address, MQTT URLs), with a
                        TTL refreshed every second: a node whose key expired is dead
``events``              the cluster event log (a Redis Stream): routes, shared
                        groups, retained messages -- ordered and replayable
``clients:{tenant}``    client id -> node that holds its session (the registry)
``owned:{node}``        "tenant\\0client id" of the stored sessions a node holds
``wills:{node}``        "tenant\\0client id" -> will, of connected clients without a
                        stored session (published by a survivor if the node dies)
``conns:{tenant}``      node -> live connections (tenant quotas, cluster-wide)
``lock:{tenant}:{cid}`` short lock around a client id's connect (takeover)
``registry``            set once a walk of the store found every stored session held by a node (``Bus.
                        registry_complete``): gone, Redis lost the registry (restarted empty), and a stored
                        session may have no record in it
``reap:{node}``         which survivor adopts a dead node's sessions (once)
``stats:{node}``        the node's counters, for the cluster-wide ``$SYS`` tree
``left:{node}``         a node that left gracefully (its survivor publishes no wills)
``compact``, ``orphans`` leases: which node writes the route snapshot, adopts orphaned sessions
"""

import asyncio
import codecs
import json
import logging
import time
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger("brokerd.cluster")

_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# a client id's lock kept longer by its holder (ARGV: token, ttl ms) -> 1 if still held
_KEEP_LOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
# (HSETNX first: a free id -- the usual CONNECT -- takes two calls, not three) -> {answer, whether the
# registry is whole (KEYS[3], ``registry``)}
_TRY_CLAIM = """
local whole = redis.call('EXISTS', KEYS[3])
if redis.call('EXISTS', KEYS[2]) == 1 then return {'!', whole} end
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then return {'', whole} end
local owner = redis.call('HGET', KEYS[1], ARGV[1])
if owner ~= ARGV[2] then return {owner, whole} end
return {'', whole}
"""
# the claims gathered by ``Batches`` (an event-loop iteration's, a round trip's or a gap's) in one call: KEYS
# are (clients:{tenant}, lock:{tenant}:{cid}) pairs, then ``registry``; ARGV the node then the client ids;
# each claim is _TRY_CLAIM's, in order -> '!', the owner or '' per claim, then whether the registry is whole
_TRY_CLAIMS = """
local node = ARGV[1]
local out = {}
for i = 1, #KEYS - 1, 2 do
  local cid = ARGV[(i + 1) / 2 + 1]
  if redis.call('EXISTS', KEYS[i + 1]) == 1 then
    out[#out + 1] = '!'
  elseif redis.call('HSETNX', KEYS[i], cid, node) == 1 then
    out[#out + 1] = ''
  else
    local owner = redis.call('HGET', KEYS[i], cid)
    if owner ~= node then
      out[#out + 1] = owner
    else
      out[#out + 1] = ''
    end
  end
end
out[#out + 1] = redis.call('EXISTS', KEYS[#KEYS])
return out
"""
# a lease: taken when free, renewed by its holder (ARGV: holder, ttl ms) -> 1 if held now
_LEASE = """
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
"""
CLAIMS_PER_CALL = 500       # a burst of CONNECTs larger than this goes in several calls (a script blocks Redis)
# the claims waiting for a call, at most (bytes, as ``_claim_size`` counts them): while Redis is slow or
# stalled a connect storm (clients retrying) made the queue grow without end, each claim held until sent --
# also those of clients that gave up -- and a CONNECT waited behind all of them; one over is refused at once
CLAIMS_QUEUED_BYTES = 8 << 20


def _claim_size(item: tuple[str, str]) -> int:
    return 256 + len(item[0]) + len(item[1])      # the tuple, its future and callback, the strings


# the connections closed here in one event-loop iteration, in one call (see Bus.gone): KEYS are wills:{node},
# owned:{node}, then clients:{tenant} per connection; ARGV the node, then per connection its flags ('w': its
# will is no longer owed, 'e': its session ended), "tenant\0client id" and the client id. Each one, in order:
# the will dropped, then -- session ended -- the client id let go if this node still holds it, and the
# stored-session mark removed. -> the number of connections done
_GONE = """
local node = ARGV[1]
local n = 0
for i = 3, #KEYS do
  local a = (i - 3) * 3 + 2
  local flags, member, cid = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  if string.find(flags, 'w', 1, true) then redis.call('HDEL', KEYS[1], member) end
  if string.find(flags, 'e', 1, true) then
    if redis.call('HGET', KEYS[i], cid) == node then redis.call('HDEL', KEYS[i], cid) end
    redis.call('SREM', KEYS[2], member)
  end
  n = n + 1
end
return n
"""
_dumps = json.JSONEncoder(separators=(",", ":")).encode      # (json.dumps with an option builds one each call)
_raw_decode = json.JSONDecoder().raw_decode


def _event(value) -> dict:
    """An event log entry's JSON object (``ValueError`` if it is not one).

    Every node reads every other node's entries, so this runs once per entry
    per reader (five times per CONNECT's route on six workers): the decoder's
    own scanner on the text, 0.6 µs for a route, where ``json.loads`` on the
    bytes took 1.7 µs (its encoding detection and wrappers are Python). What
    the scanner does not take whole (whitespace around, another encoding)
    goes to ``json.loads``, which accepts or refuses it as before."""
    try:
        text = value.decode() if isinstance(value, (bytes, bytearray)) else value
        e, end = _raw_decode(text)
        if end != len(text):
            raise ValueError
    except ValueError:                                 # (UnicodeDecodeError and JSONDecodeError too)
        e = json.loads(value)
    if e.__class__ is not dict:
        raise ValueError("not an object")
    return e


GONE_PER_CALL = 500         # a disconnect wave larger than this goes in several calls (a script blocks Redis)


def redacted(url: str) -> str:
    """A Redis URL fit for a log line: no password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + host))


class Batches:
    """Requests to Redis sent together, as group commit does: the first one
    schedules a call (``loop.call_soon``: the requests made in the same
    event-loop iteration go with it); those made while a call is on its way
    go in the next, as soon as it is back (unless ``gap`` holds them).
    ``send(items)`` makes one call of at most ``per_call`` items and returns
    one answer per item; each caller gets its own answer, or the call's
    error. ``drop_given_up``: a request whose caller gave up before its call
    (its task cancelled) is not sent.
    ``gap``: in a burst, the requests made while a call was on its way wait
    until ``gap`` seconds after that call's start, and go with whatever came
    meanwhile. A burst is when that call carried several requests. A request
    made when no call is on its way, or after a call of one, goes at once:
    a device connecting alone, or a steady trickle, is not held back."""

    def __init__(self, send, per_call: int, drop_given_up: bool, gap: float = 0.0, max_bytes: int = 0,
                 size=None):
        self.send = send
        self.max_bytes = max_bytes          # 0: unbounded; else a request that would queue more fails at once
        self.size = size                    # size(item) -> bytes it holds while queued
        self.queued_bytes = 0
        self.per_call = per_call
        self.drop_given_up = drop_given_up
        self.gap = gap
        self.started = 0.0                  # loop time of the last call's start ...
        self.carried = 0                    # ... and how many requests it carried
        self.queued: list[tuple[tuple, asyncio.Future]] = []
        self.busy = False                   # a call is scheduled or on its way
        self.loop: asyncio.AbstractEventLoop | None = None      # the first caller's (asked once: a getpid each)

    def add(self, item: tuple) -> asyncio.Future:
        loop = self.loop
        if loop is None:
            loop = self.loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if self.max_bytes:
            n = self.size(item)
            if self.queued_bytes + n > self.max_bytes:
                fut.set_exception(RedisConnectionError(
                    f"{self.queued_bytes} bytes of requests wait for the cluster bus already"))
                return fut
            self.queued_bytes += n
        self.queued.append((item, fut))
        if not self.busy:
            self.busy = True
            loop.call_soon(self._next)
        return fut

    def _next(self) -> None:
        batch: list = []
        while self.queued and not batch:
            batch = self.queued[:self.per_call]
            del self.queued[:self.per_call]
            if self.max_bytes:
                size = self.size
                self.queued_bytes -= sum([size(item) for item, _ in batch])
            if self.drop_given_up:
                batch = [b for b in batch if not b[1].done()]
        if not batch:
            self.busy = False
            return
        task = asyncio.ensure_future(self._call(batch))
        if self.gap:
            self.started = task.get_loop().time()
            self.carried = len(batch)
        task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task) -> None:
        if not task.cancelled():
            task.exception()        # retrieved: every waiter got it
        if self.queued and self.gap:
            loop = task.get_loop()
            wait = self.started + self.gap - loop.time() if self.carried > 1 else 0.0
            if wait > 0:
                loop.call_later(wait, self._next)
                return
        self._next()                # what was asked meanwhile (or no call in flight any more)

    async def _call(self, batch: list[tuple[tuple, asyncio.Future]]) -> None:
        try:
            answers = await self.send([item for item, _ in batch])
            if len(answers) != len(batch):
                raise RuntimeError(f"{len(answers)} answers to {len(batch)} requests")
        except BaseException as exc:
            for _, fut in batch:
                if not fut.done():
                    if isinstance(exc, asyncio.CancelledError):
                        fut.cancel()
                    else:
                        fut.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, fut), answer in zip(batch, answers, strict=True):
            if not fut.done():
                fut.set_result(answer)


class Line:
    """One connection of the bus's pool, kept for one use (a batcher, the event
    log's reads, its writes): a call writes its command (or several: one
    write) and reads the replies on that connection, without redis-py's
    per-command machinery (the pool's checkout and return, the retry wrapper,
    the response callbacks, the metrics hooks: about 110 µs of CPU per call
    here, 60 without; claims and disconnect waves are a call per few clients,
    the event log a read and a write per route round of the nodes). Calls take
    turns.

    Errors keep redis-py's meaning and the pool's retry policy: the
    connection closes on any error but a reply from Redis (a timeout, a
    cancelled call, a broken socket), so a late reply is never read as the
    next call's; a call that timed out or whose connection broke is sent
    again, at most ``RETRIES`` times, each on a new connection."""

    RETRIES = 2
    BACKOFF = ExponentialBackoff(cap=0.2, base=0.01)

    def __init__(self, pool):
        self.pool = pool
        self.conn = None
        self.pack = None
        self.lock = asyncio.Lock()
        self.closed = False              # the bus closed: a failed call is not sent again

    async def evalsha(self, script, keys: list, args: list):
        """``script`` (redis-py's, for its sha and text) on ``keys`` and ``args``; loaded first if Redis
        does not know it (a restart or a SCRIPT FLUSH)."""
        n = len(keys)
        try:
            return await self.call("EVALSHA", script.sha, n, *keys, *args)
        except NoScriptError:
            await self.call("SCRIPT", "LOAD", script.script)
            return await self.call("EVALSHA", script.sha, n, *keys, *args)

    async def call(self, *command):
        return (await self.calls([command]))[0]

    async def calls(self, commands: list[tuple]) -> list:
        """Several commands in one write, their replies in order. A reply that is an error
        from Redis is raised once every reply has been read (the first such), so the line
        stays in step."""
        async with self.lock:
            return await self._calls(commands)

    async def _calls(self, commands: list[tuple]) -> list:
        if self.closed:                  # (a call made after: it would open a connection nothing closes)
            raise RedisConnectionError("the cluster bus is closed")
        if self.conn is None:
            conn = self.conn = await self.pool.get_connection()
            enc = conn.encoder
            if codecs.lookup(enc.encoding).name == "utf-8" and enc.encoding_errors == "strict":
                self.pack = hiredis.pack_command     # in C: redis-py's pack_command is Python, 18 µs a batch
            else:                                    # ?encoding=... in the URL: encode as redis-py does
                self.pack = lambda c: b"".join(conn.pack_command(*c))
        conn = self.conn
        pack = self.pack
        packed = pack(commands[0]) if len(commands) == 1 else b"".join([pack(c) for c in commands])
        failures = 0
        while True:
            try:
                await conn.send_packed_command(packed, check_health=False)
                replies = []
                error = None
                for _ in commands:
                    try:
                        replies.append(await conn.read_response())
                    except ResponseError as exc:
                        error = error or exc
                        replies.append(exc)
                if error is not None:
                    raise error
                return replies
            except (RedisConnectionError, RedisTimeoutError):
                failures += 1                # redis-py closed the connection: the next try opens a new one
                if failures > self.RETRIES or self.closed:
                    raise
                await asyncio.sleep(self.BACKOFF.compute(failures))


def key_of(tenant: str, client_id: str) -> str:
    return f"{tenant}\0{client_id}"


class Bus:
    def __init__(self, url: str, node: str, ttl: float = 5.0, claim_gap: float = 0.0):
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"cluster URL {url!r}: use redis://HOST:PORT/DB")
        opts = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        self.prefix = opts.pop("prefix", "brokerd")
        # the rest of the query goes to redis-py: rediss:// takes ssl_ca_certs, ssl_certfile, ssl_keyfile,
        # ssl_cert_reqs; a password comes as redis://:PASSWORD@HOST (or USER:PASSWORD with Redis ACLs)
        self.url = urlunsplit(parts._replace(query=urlencode(opts)))
        self.node = node
        self.ttl = ttl
        # a blocking pool: a burst of CONNECTs waits for a connection instead of failing
        # A pooled connection that Redis closed (a restart, a proxy's idle timeout, CLIENT KILL) fails
        # its next command with ConnectionError: that command is sent again on a new connection, twice at
        # most. A command that timed out is sent again too (redis-py's Retry covers TimeoutError whatever
        # retry_on_error says; the timed-out connection is closed first). ``Line`` does the same.
        retry = Retry(Line.BACKOFF, Line.RETRIES)
        pool = aioredis.BlockingConnectionPool.from_url(self.url, max_connections=64, timeout=5,
                                                        socket_timeout=2.0, socket_connect_timeout=2.0,
                                                        retry=retry, retry_on_error=[RedisConnectionError])
        self.redis = aioredis.Redis(connection_pool=pool)
        self._lines: list[Line] = []        # each a connection of the pool, for good (closed with the bus)
        self._try_claim = self.redis.register_script(_TRY_CLAIM)
        self._try_claims = self.redis.register_script(_TRY_CLAIMS)
        # in a connect storm the claims made while a call of several is on its way wait until ``claim_gap``
        # after its start (--cluster-claim-gap) and go together: fewer round trips and wake-ups of Redis for
        # up to that much more CONNACK latency
        self._claims = Batches(self._claim_batch, CLAIMS_PER_CALL, drop_given_up=True, gap=claim_gap,
                               max_bytes=CLAIMS_QUEUED_BYTES, size=_claim_size)
        self._claim_line = self._line(pool)
        # whether Redis's registry knew every stored session at the last claim's answer (``registry``): when
        # not, a stored session of a client id it calls free may be there all the same (``takeover``)
        self.registry_whole = True
        self._unlock = self.redis.register_script(_UNLOCK)
        self._keep_lock = self.redis.register_script(_KEEP_LOCK)
        self._lease = self.redis.register_script(_LEASE)
        self._gone = self.redis.register_script(_GONE)
        self._gones = Batches(self._gone_batch, GONE_PER_CALL, drop_given_up=False)
        self._gone_line = self._line(pool)
        # the event log: read by the node's event loop, written by a few (route rounds, resets); a line each way
        self._events_in = self._line(pool)
        self._events_out = self._line(pool)

    def _line(self, pool) -> Line:
        line = Line(pool)
        self._lines.append(line)
        return line

    def k(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    async def close(self) -> None:
        for line in self._lines:
            line.closed = True
        await self.redis.aclose(close_connection_pool=True)   # the pool is the bus's own (and so are its lines)

    # ------------------------------------------------------------ membership

    async def heartbeat(self, info: dict) -> None:
        await self.redis.set(self.k("node", self.node), json.dumps(info), px=int(self.ttl * 1000))

    async def members(self) -> dict[str, dict]:
        out = {}
        keys = [k async for k in self.redis.scan_iter(match=self.k("node", "*"), count=1000)]
        if keys:
            for key, value in zip(keys, await self.redis.mget(keys), strict=True):
                if value is not None:
                    out[key.decode().rsplit(":", 1)[1]] = json.loads(value)
        return out

    async def leave(self) -> None:
        pipe = self.redis.pipeline()
        pipe.set(self.k("left", self.node), "1", ex=3600)
        pipe.delete(self.k("node", self.node))
        await pipe.execute()

    async def forget_former(self) -> None:
        """This node's id is a member again: how a former node of that id ended (a survivor adopted it,
        ``reap:``; it left gracefully, ``left:``) says nothing of how this one will."""
        await self.redis.delete(self.k("reap", self.node), self.k("left", self.node))

    # ---------------------------------------------------------------- events

    async def publish_events(self, events: list[dict]) -> list[str]:
        """Append to the cluster event log; -> the events' ids. An event's node
        (its "n") is also a field of its entry of its own, before the event
        ("e"), so that the node reads past its own events without parsing them
        (``read_events``' ``own``)."""
        key = self.k("events")
        commands = [("XADD", key, "*", "n", e["n"], "e", _dumps(e)) if isinstance(e.get("n"), str)
                    else ("XADD", key, "*", "e", _dumps(e)) for e in events]
        ids = await self._events_out.calls(commands)
        return [i.decode() if isinstance(i, bytes) else str(i) for i in ids]

    async def read_events(self, after: str, block_ms: int = 1000, count: int = 1000,
                          own: str | None = None) -> list[tuple[str, dict | None]]:
        """The log's events after ``after``: (id, event); (id, None) for an event of node ``own``
        (not parsed: the node skips its own)."""
        res = await self._events_in.call("XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS", self.k("events"),
                                         after)
        out: list[tuple[str, dict | None]] = []
        if not res:
            return out
        mine = own.encode() if own is not None else None
        # RESP3: {stream: entries}; RESP2: [[stream, entries]]; an entry: [id, [field, value, ...]]
        for entries in res.values() if isinstance(res, dict) else (r[1] for r in res):
            for eid, fields in entries:
                eid = eid.decode() if isinstance(eid, bytes) else eid
                if mine is not None and len(fields) > 2 and fields[0] in (b"n", "n") and \
                        fields[1] in (mine, own):
                    out.append((eid, None))
                    continue
                try:
                    if len(fields) == 4 and fields[2] in (b"e", "e") and fields[0] in (b"n", "n"):
                        value = fields[3]                                   # n, node, e, event: as written now
                    else:
                        value = next(fields[i + 1] for i in range(0, len(fields), 2) if fields[i] in (b"e", "e"))
                    e = _event(value)
                except (StopIteration, ValueError) as exc:
                    # passed over, not retried for ever: the log goes on after it
                    log.warning("cluster event %s unreadable, skipped: %s", eid, str(exc) or "no 'e' field")
                    e = {"t": "unreadable"}
                out.append((eid, e))
        return out

    async def last_event_id(self) -> str:
        info = await self.redis.xinfo_stream(self.k("events")) if await self.redis.exists(self.k("events")) else None
        return info["last-generated-id"].decode() if info else "0-0"

    async def trim_events(self, min_id: str) -> None:
        await self.redis.xtrim(self.k("events"), minid=min_id)

    async def lease(self, name: str, ttl: float) -> bool:
        """Take the named lease if free, renew it if this node holds it; -> held."""
        return bool(await self._lease(keys=[self.k("lease", name)], args=[self.node, int(ttl * 1000)]))

    async def lease_holder(self, name: str) -> str | None:
        v = await self.redis.get(self.k("lease", name))
        return v.decode() if v else None

    # --------------------------------------------------------------- clients

    async def lock(self, tenant: str, client_id: str, wait: float = 5.0) -> str | None:
        """A short lock on a client id (around a connect); -> token or None."""
        token = f"{self.node}:{time.monotonic_ns()}"
        deadline = time.monotonic() + wait
        key = self.k("lock", tenant, client_id)
        while True:
            if await self.redis.set(key, token, nx=True, px=int(wait * 1000)):
                return token
            if time.monotonic() > deadline:
                return None
            import asyncio

            await asyncio.sleep(0.02)

    async def lock_holder(self, tenant: str, client_id: str) -> str | None:
        """The node holding a client id's lock, if any."""
        token = await self.redis.get(self.k("lock", tenant, client_id))
        return token.decode().rsplit(":", 1)[0] if token else None

    async def unlock(self, tenant: str, client_id: str, token: str) -> None:
        await self._unlock(keys=[self.k("lock", tenant, client_id)], args=[token])

    async def keep_lock(self, tenant: str, client_id: str, token: str, seconds: float) -> bool:
        """The lock ``token`` holds on a client id lives ``seconds`` more; -> False if it is not held any more."""
        return bool(await self._keep_lock(keys=[self.k("lock", tenant, client_id)],
                                          args=[token, int(seconds * 1000)]))

    def try_claim(self, tenant: str, client_id: str) -> asyncio.Future:
        """In one round trip: the client id is now this node's if it was free or
        already here (-> None); else the node holding it, or "!" when locked.

        Claims go to Redis together (``Batches``): a call is one script
        (``_TRY_CLAIMS``, at most ``CLAIMS_PER_CALL``) in which each claim is
        the same atomic check-and-set as alone, in the order they were made.
        -> a future (not a coroutine: a connect storm makes one each)."""
        return self._claims.add((tenant, client_id))

    async def _claim_batch(self, batch: list[tuple[str, str]]) -> list[str | None]:
        if len(batch) == 1:
            tenant, client_id = batch[0]
            answer, whole = await self._claim_line.evalsha(
                self._try_claim, [self.k("clients", tenant), self.k("lock", tenant, client_id), self.k("registry")],
                [client_id, self.node])
            answers = [answer]
        else:
            keys = []
            for tenant, client_id in batch:
                keys += (self.k("clients", tenant), self.k("lock", tenant, client_id))
            keys.append(self.k("registry"))
            *answers, whole = await self._claim_line.evalsha(self._try_claims, keys,
                                                             [self.node, *(cid for _, cid in batch)])
        self.registry_whole = bool(whole)       # (set before the claims' futures are: their callbacks read it)
        return [(a.decode() if isinstance(a, bytes) else a) or None for a in answers]

    async def registry_complete(self) -> None:
        """A walk of the store found every stored session held by a live node (or adopted it): the
        registry is whole (until Redis loses it, this key with it)."""
        await self.redis.set(self.k("registry"), self.node)

    async def mark_owned(self, tenant: str, client_id: str) -> None:
        await self.redis.sadd(self.k("owned", self.node), key_of(tenant, client_id))

    async def owner(self, tenant: str, client_id: str) -> str | None:
        value = await self.redis.hget(self.k("clients", tenant), client_id)
        return value.decode() if value else None

    async def owners(self, keys: list[tuple[str, str]]) -> list[str | None]:
        """The node holding each (tenant, client id), in order: one HMGET a tenant, in one round trip."""
        if not keys:
            return []
        by_tenant: dict[str, list[int]] = {}
        for i, (tenant, _) in enumerate(keys):
            by_tenant.setdefault(tenant, []).append(i)
        pipe = self.redis.pipeline(transaction=False)
        for tenant, at in by_tenant.items():
            pipe.hmget(self.k("clients", tenant), [keys[i][1] for i in at])
        out: list[str | None] = [None] * len(keys)
        for at, values in zip(by_tenant.values(), await pipe.execute(), strict=True):
            for i, value in zip(at, values, strict=True):
                out[i] = value.decode() if value else None
        return out

    async def claim(self, tenant: str, client_id: str, durable: bool, previous: str | None) -> None:
        pipe = self.redis.pipeline()
        pipe.hset(self.k("clients", tenant), client_id, self.node)
        if previous and previous != self.node:
            pipe.srem(self.k("owned", previous), key_of(tenant, client_id))
        if durable:
            pipe.sadd(self.k("owned", self.node), key_of(tenant, client_id))
        else:
            pipe.srem(self.k("owned", self.node), key_of(tenant, client_id))
        await pipe.execute()

    def gone(self, tenant: str, client_id: str, ended: bool, had_will: bool) -> asyncio.Future:
        """A connection closed here: its will is no longer owed; if its session
        ended, the client id is nobody's any more (unless another node took it).

        The connections that close together go to Redis together, as claims do
        (``Batches``; a wave of disconnects -- a network cut, a fleet going
        offline -- was three round trips each): a call is one script (``_GONE``)
        doing each connection's updates as alone, in the order closed.
        -> a future (not a coroutine: a wave of disconnects makes one each)."""
        if not (ended or had_will):
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        return self._gones.add((("w" if had_will else "") + ("e" if ended else ""), tenant, client_id))

    async def _gone_batch(self, batch: list[tuple[str, str, str]]) -> list[None]:
        keys = [self.k("wills", self.node), self.k("owned", self.node)]
        args = [self.node]
        for flags, tenant, client_id in batch:
            keys.append(self.k("clients", tenant))
            args += (flags, key_of(tenant, client_id), client_id)
        done = await self._gone_line.evalsha(self._gone, keys, args)
        if done != len(batch):
            raise RuntimeError(f"{done} of {len(batch)} closed connections let go")
        return [None] * done

    async def owned(self, node: str) -> list[tuple[str, str]]:
        members = await self.redis.smembers(self.k("owned", node))
        return [tuple(m.decode().split("\0", 1)) for m in members]

    async def set_will(self, tenant: str, client_id: str, blob: bytes | None) -> None:
        if blob is None:
            await self.redis.hdel(self.k("wills", self.node), key_of(tenant, client_id))
        else:
            await self.redis.hset(self.k("wills", self.node), key_of(tenant, client_id), blob)

    async def take_wills(self, node: str) -> list[tuple[str, str, bytes]]:
        key = self.k("wills", node)
        pipe = self.redis.pipeline()
        pipe.hgetall(key)
        pipe.delete(key)
        wills, _ = await pipe.execute()
        return [(*k.decode().split("\0", 1), v) for k, v in wills.items()]

    async def reap(self, node: str) -> bool:
        """Be the one survivor that adopts a dead node's sessions."""
        return bool(await self.redis.set(self.k("reap", node), self.node, nx=True, ex=3600))

    async def left_gracefully(self, node: str) -> bool:
        return bool(await self.redis.exists(self.k("left", node)))

    async def forget_node(self, node: str) -> None:
        pipe = self.redis.pipeline()
        pipe.delete(self.k("owned", node), self.k("stats", node), self.k("left", node))
        await pipe.execute()
        async for key in self.redis.scan_iter(match=self.k("conns", "*"), count=1000):
            await self.redis.hdel(key, node)

    # ---------------------------------------------------------------- leases

    async def try_lease(self, name: str, seconds: int) -> bool:
        """Be the one node that does ``name`` for ``seconds`` (or until ``drop_lease``)."""
        return bool(await self.redis.set(self.k(name), self.node, nx=True, ex=seconds))

    async def renew_lease(self, name: str, seconds: int) -> bool:
        """Hold ``name`` ``seconds`` more if this node holds it (or it is free again); -> held."""
        return bool(await self._lease(keys=[self.k(name)], args=[self.node, int(seconds * 1000)]))

    async def drop_lease(self, name: str) -> None:
        await self.redis.delete(self.k(name))

    # ---------------------------------------------------------- quotas, $SYS

    async def set_counts(self, counts: dict[str, int], alive: set[str]) -> dict[str, int]:
        """Publish this node's connections per tenant; -> the totals over the ``alive`` nodes (a node
        no survivor reaped -- the whole cluster restarted under new node ids -- left its counts)."""
        pipe = self.redis.pipeline(transaction=False)
        for tenant, n in counts.items():
            pipe.hset(self.k("conns", tenant), self.node, n)
        for tenant in counts:
            pipe.hgetall(self.k("conns", tenant))
        res = await pipe.execute()
        totals = {}
        for tenant, values in zip(counts, res[len(counts):], strict=True):
            totals[tenant] = sum(int(v) for node, v in values.items() if node.decode() in alive)
        return totals

    async def set_stats(self, stats: dict) -> None:
        key = self.k("stats", self.node)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(key, mapping={k: str(v) for k, v in stats.items()})
        pipe.expire(key, max(10, int(self.ttl * 4)))          # a node no survivor reaps: gone in a while
        await pipe.execute()

    async def set_host_tenants(self, host: str, figures: dict[str, dict]) -> dict[str, dict]:
        """One hash per host (``hosttenants:{host}``, field: the worker): only a host's workers read
        it; it goes when none of them has written for a while."""
        key = self.k("hosttenants", host)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(key, self.node, json.dumps(figures, separators=(",", ":")))
        pipe.expire(key, max(10, int(self.ttl * 4)))
        pipe.hgetall(key)
        *_, values = await pipe.execute()
        return {k.decode(): json.loads(v) for k, v in values.items()}

    async def drop_host_tenants(self, host: str, nodes: list[str]) -> None:
        """Forget the figures of workers that are gone."""
        if nodes:
            await self.redis.hdel(self.k("hosttenants", host), *nodes)

    async def all_stats(self) -> dict[str, dict]:
        """Every node's counters (each node reads them every second: one round trip for all, not one
        each), those of nodes that are gone too (the caller keeps the members')."""
        keys = [key async for key in self.redis.scan_iter(match=self.k("stats", "*"), count=1000)]
        if not keys:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
        out = {}
        for key, values in zip(keys, await pipe.execute(), strict=True):
            if values:                     # (expired between the scan and the read)
                out[key.decode().rsplit(":", 1)[1]] = {k.decode(): v.decode() for k, v in values.items()}
        return out

"""The Redis journal: a ``DurableKv`` in a few keys per scope, shared by any number of hosts.

``open_redis_kv("redis://:password@host:6379/0", prefix="botmesh")`` (URL ``redis://…`` or
``rediss://…``, ``?prefix=…&cluster=true`` among the query options), or a client you pass
(``redis.asyncio.Redis`` or ``RedisCluster``, never closed here).

A journal key ``<scope>/<rest>`` lives in the keys of its scope (the part before the first
``/``), all with one hash tag, so a cluster keeps a scope on one slot::

    {prefix}:{durable:<scope>}:e       hash: key -> "<version>:<value as JSON>"
    {prefix}:{durable:<scope>}:due     sorted set: key scored by its due time
    {prefix}:{durable:<scope>}:purge   sorted set: key scored by its purge time

A commit is one Lua script: every compare-and-set is checked, then every write applied,
or nothing is (Redis runs a script alone). Reads of a scope are one script each, so an
entry read is one committed version. A commit must stay in one scope on a cluster (the
engine's commits always do); on one server it may span several.

Persistence: what Redis acknowledged is only as safe as its settings. A journal that must
survive a Redis restart needs ``appendonly yes``; one that must survive a power loss also
needs ``appendfsync always`` (``everysec`` may lose the last second of writes). The
journal reads both at start and logs a warning naming what is missing. Replication is
asynchronous: a failover to a replica can lose the last acknowledged writes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import SplitResult, urlunsplit

import redis.asyncio as aioredis
import redis.exceptions as rexc
from redis.asyncio.cluster import RedisCluster

from botmesh.state.backends.codec import decode_value, encode_value
from botmesh.state.backends.server import ServerKv, ServerUrl
from botmesh.state.errors import ConfigError, JournalUnavailableError, VersionConflictError
from botmesh.state.kv import Delete, Entry, IndexName, Op, Put

__all__ = [
    "RedisKv",
    "RedisOptions",
    "check_url",
    "from_url",
    "open_redis_kv",
    "open_url",
]

log = logging.getLogger("botmesh.state.redis")

Client = aioredis.Redis | RedisCluster

_PREFIX = re.compile(r"[^{}\s*?\[\]\\]+\Z")

# KEYS: 3 per scope (entries, due, purge). ARGV[1] = n, then per op: scope number (1-based),
# "p"/"d", key, expect ("" = none), value, due ("" = none), purge ("" = none).
_COMMIT = """
local n = tonumber(ARGV[1])
local staged, ops, pos = {}, {}, 2
for i = 1, n do
  local s, kind, key, expect = tonumber(ARGV[pos]), ARGV[pos + 1], ARGV[pos + 2], ARGV[pos + 3]
  local id = s .. ':' .. key
  local have = staged[id]
  if have == nil then
    local cur = redis.call('HGET', KEYS[s * 3 - 2], key)
    if cur then have = tonumber(string.match(cur, '^(%d+):')) else have = 0 end
  end
  if expect ~= '' and tonumber(expect) ~= have then
    return {-1, i, have}
  end
  local new = 0
  if kind == 'p' then new = have + 1 end
  staged[id] = new
  ops[i] = {s, kind, key, ARGV[pos + 4], ARGV[pos + 5], ARGV[pos + 6], new}
  pos = pos + 7
end
local out = {}
for i = 1, n do
  local o = ops[i]
  local h, dz, pz = KEYS[o[1] * 3 - 2], KEYS[o[1] * 3 - 1], KEYS[o[1] * 3]
  if o[2] == 'p' then
    redis.call('HSET', h, o[3], o[7] .. ':' .. o[4])
    if o[5] ~= '' then redis.call('ZADD', dz, o[5], o[3]) else redis.call('ZREM', dz, o[3]) end
    if o[6] ~= '' then redis.call('ZADD', pz, o[6], o[3]) else redis.call('ZREM', pz, o[3]) end
  else
    redis.call('HDEL', h, o[3])
    redis.call('ZREM', dz, o[3])
    redis.call('ZREM', pz, o[3])
  end
  out[i] = o[7]
end
return out
"""

# KEYS: entries, due, purge of one scope; ARGV: keys. Returns, per key: entry or false,
# due or false, purge or false.
_GET = """
local out = {}
for i, key in ipairs(ARGV) do
  out[#out + 1] = redis.call('HGET', KEYS[1], key)
  out[#out + 1] = redis.call('ZSCORE', KEYS[2], key)
  out[#out + 1] = redis.call('ZSCORE', KEYS[3], key)
end
return out
"""

# KEYS: one sorted set; ARGV: until, prefix, limit. Returns key, score, key, score…
_RANGE = """
local upto, prefix, limit = ARGV[1], ARGV[2], tonumber(ARGV[3])
local out, offset, plen = {}, 0, #prefix
while true do
  local page = redis.call(
    'ZRANGEBYSCORE', KEYS[1], '-inf', upto, 'WITHSCORES', 'LIMIT', offset, 500)
  if #page == 0 then return out end
  for i = 1, #page, 2 do
    if string.sub(page[i], 1, plen) == prefix then
      out[#out + 1] = page[i]
      out[#out + 1] = page[i + 1]
      if #out >= limit * 2 then return out end
    end
  end
  offset = offset + 500
end
"""

# KEYS: entries, due, purge of one scope; ARGV: prefix. Returns key, entry, due, purge…
_SCAN = """
local prefix, out, plen = ARGV[1], {}, #ARGV[1]
local cursor = '0'
repeat
  local r = redis.call('HSCAN', KEYS[1], cursor, 'COUNT', 1000)
  cursor = r[1]
  local page = r[2]
  for i = 1, #page, 2 do
    local key = page[i]
    if string.sub(key, 1, plen) == prefix then
      out[#out + 1] = key
      out[#out + 1] = page[i + 1]
      out[#out + 1] = redis.call('ZSCORE', KEYS[2], key)
      out[#out + 1] = redis.call('ZSCORE', KEYS[3], key)
    end
  end
until cursor == '0'
return out
"""


@dataclass(frozen=True, slots=True)
class RedisOptions:
    """Where the Redis journal keeps its keys."""

    prefix: str = "botmesh"
    """The first part of every key (``{prefix}:{durable:<scope>}:…``): no braces, spaces
    or glob characters. Default ``botmesh``."""

    cluster: bool = False
    """Connect to a Redis Cluster (URL only; a client you pass is used as it is).
    Default ``False``."""

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not _PREFIX.match(self.prefix):
            raise ConfigError(
                "redis.prefix",
                f"must be a non-empty name without braces, spaces or * ? [ ] \\, got "
                f"{self.prefix!r}",
            )
        if not isinstance(self.cluster, bool):
            raise ConfigError("redis.cluster", f"must be True or False, got {self.cluster!r}")


def _scope(key: str) -> str:
    return key.split("/", 1)[0] if "/" in key else ""


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _score(x: float | None) -> str:
    if x is None:
        return ""
    return repr(float(x))


def _float(x: Any) -> float | None:
    return None if x is None or x is False else float(_text(x))


def _entry(key: str, raw: Any, due: Any, purge: Any) -> Entry:
    text = _text(raw)
    version, _, value = text.partition(":")
    return Entry(key, decode_value(value), int(version), _float(due), _float(purge))


class RedisKv(ServerKv):
    """The Redis journal's ``DurableKv`` (see the module docstring)."""

    server, url_name, connection, up = "Redis", "url", "client", "Redis"

    def __init__(
        self,
        url: str | None = None,
        *,
        client: Client | None = None,
        options: RedisOptions | None = None,
    ) -> None:
        super().__init__(url, client)
        self._client: Client | None = client
        self.options = options or RedisOptions()
        self._opened = False
        self._head = f"{self.options.prefix}:{{durable:"

    def __repr__(self) -> str:
        return f"RedisKv({self._at()}, prefix={self.options.prefix!r})"

    def _keys(self, scope: str) -> list[str]:
        base = f"{self._head}{scope}}}"
        return [f"{base}:e", f"{base}:due", f"{base}:purge"]

    # -- lifecycle ------------------------------------------------------------------

    async def open(self) -> None:
        if self._opened:
            return
        if self._own:
            assert self._url is not None
            if self.options.cluster:
                self._client = RedisCluster.from_url(self._url)
            else:
                self._client = aioredis.Redis.from_url(self._url)
        client = self._client
        assert client is not None
        self._commit_script = client.register_script(_COMMIT)
        self._get_script = client.register_script(_GET)
        self._range_script = client.register_script(_RANGE)
        self._scan_script = client.register_script(_SCAN)
        try:
            await self._check_persistence(client)
        except BaseException:
            if self._own:
                await client.aclose()
                self._client = None
            raise
        self._opened = True

    async def _check_persistence(self, client: Client) -> None:
        """Warn when the server's settings do not give the guarantees (module docstring)."""
        try:
            try:
                conf = cast(dict[Any, Any], await client.config_get("append*"))
                settings = {_text(k): _text(v) for k, v in conf.items()}
                aof = settings.get("appendonly", "")
                fsync = settings.get("appendfsync", "")
            except rexc.ResponseError:  # CONFIG is disabled (managed services): ask INFO
                info = await client.info("persistence")
                aof = "yes" if str(info.get("aof_enabled", "0")) == "1" else "no"
                fsync = ""
        except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
            raise self._error("connecting to", exc) from None
        except rexc.RedisError as exc:
            raise self._error("connecting to", exc) from None
        if aof.lower() != "yes":
            log.warning(
                "Redis journal %s: the server runs without the append-only file "
                "(appendonly %s), so a Redis restart loses journal writes (and sends may be "
                "repeated). Operator action: set appendonly yes and appendfsync always",
                self.where,
                aof or "unknown",
            )
        elif fsync and fsync.lower() != "always":
            log.warning(
                "Redis journal %s: appendfsync is %s, so a power loss or OS crash of the "
                "Redis host may lose the last acknowledged journal writes. Operator action: "
                "set appendfsync always where that matters",
                self.where,
                fsync,
            )

    async def close(self) -> None:
        if not self._opened:
            return
        self._opened = False
        if self._own and self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    # -- plumbing -------------------------------------------------------------------

    def _check(self) -> Client:
        if not self._opened or self._client is None:
            raise JournalUnavailableError(f"the journal {self.where} is closed; open() it again")
        return self._client

    async def _run(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            return await script(keys=keys, args=args)
        except rexc.RedisClusterException as exc:
            if "slot" not in str(exc).lower():
                raise self._error("using", exc) from None
            raise JournalUnavailableError(
                f"the journal {self.where} got a commit spanning several scopes; on a Redis "
                "Cluster a commit must stay in one scope (one hash slot), as the engine's do. "
                "Operator action: report it (a caller wrote across bots in one commit)"
            ) from None
        except rexc.RedisError as exc:
            raise self._error("using", exc) from None

    async def _scopes(self, prefix: str) -> list[str]:
        """The scopes that may hold keys starting with ``prefix``."""
        scope = _scope(prefix)
        if "/" in prefix:
            return [scope]
        client = self._check()
        found: set[str] = set()
        head = self._head
        pattern = _glob_escape(head) + "*}:e"
        try:
            async for name in client.scan_iter(match=pattern, count=1000):
                text = _text(name)
                s = text[len(head) : -len("}:e")]
                if s.startswith(prefix) or s == "":
                    found.add(s)
        except rexc.RedisError as exc:
            raise self._error("using", exc) from None
        return sorted(found)

    # -- reads ----------------------------------------------------------------------

    async def _get_many(self, keys: list[str]) -> dict[str, Entry]:
        by_scope: dict[str, list[str]] = {}
        for k in keys:
            by_scope.setdefault(_scope(k), []).append(k)
        out: dict[str, Entry] = {}
        for scope, wanted in by_scope.items():
            flat = await self._run(self._get_script, self._keys(scope), wanted)
            for i, k in enumerate(wanted):
                raw, due, purge = flat[i * 3], flat[i * 3 + 1], flat[i * 3 + 2]
                if raw is not None and raw is not False:
                    out[k] = _entry(k, raw, due, purge)
        return out

    async def _range(self, index: IndexName, prefix: str, until: float, limit: int) -> list[str]:
        which = 1 if index == "due" else 2
        bound = "+inf" if until == float("inf") else repr(float(until))
        found: list[tuple[float, str]] = []
        for scope in await self._scopes(prefix):
            zset = self._keys(scope)[which]
            flat = await self._run(self._range_script, [zset], [bound, prefix, limit])
            found.extend((float(_text(s)), _text(k)) for k, s in _pairs(flat))
        found.sort()
        return [k for _, k in found[:limit]]

    async def _scan(self, prefix: str) -> list[Entry]:
        out: list[Entry] = []
        for scope in await self._scopes(prefix):
            flat = await self._run(self._scan_script, self._keys(scope), [prefix])
            for i in range(0, len(flat), 4):
                key = _text(flat[i])
                out.append(_entry(key, flat[i + 1], flat[i + 2], flat[i + 3]))
        out.sort(key=lambda e: e.key)
        return out

    # -- writes ---------------------------------------------------------------------

    async def _commit(self, ops: Sequence[Op]) -> list[int]:
        scopes: dict[str, int] = {}
        args: list[Any] = [len(ops)]
        for op in ops:
            n = scopes.setdefault(_scope(op.key), len(scopes) + 1)
            expect = "" if op.expect is None else op.expect
            if isinstance(op, Put):
                args += [n, "p", op.key, expect, encode_value(op.value)]
                args += [_score(op.due), _score(op.purge)]
            else:
                assert isinstance(op, Delete)
                args += [n, "d", op.key, expect, "", "", ""]
        keys = [k for scope in scopes for k in self._keys(scope)]
        result = await self._run(self._commit_script, keys, args)
        if result and result[0] == -1:
            op = ops[int(result[1]) - 1]
            raise VersionConflictError(op.key, op.expect, int(result[2]))
        return [int(v) for v in result]


def _pairs(flat: Sequence[Any]) -> Iterable[tuple[Any, Any]]:
    return zip(flat[0::2], flat[1::2], strict=True)


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text).replace("{", "\\{").replace("}", "\\}")


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _flag(raw: str) -> bool:
    if raw.lower() not in _TRUE | _FALSE:
        raise ValueError(f"must be true or false, got {raw!r}")
    return raw.lower() in _TRUE


def _journal(parts: SplitResult, options: RedisOptions) -> RedisKv:
    return RedisKv(urlunsplit(parts), options=options)


_URL = ServerUrl(
    schemes=("redis", "rediss"),
    server="Redis",
    example="redis://:password@host:6379/0?prefix=botmesh (rediss:// for TLS)",
    readers={"prefix": str, "cluster": _flag},
    options=RedisOptions,
    journal=_journal,
)
#: What ``botmesh.state.backends`` calls for a ``redis://`` or ``rediss://`` URL: refuse a
#: bad one (``ConfigError``, password redacted), make its ``RedisKv`` (not opened), open it.
check_url, from_url, open_url = _URL.check, _URL.kv, _URL.open


async def open_redis_kv(
    url: str | None = None,
    *,
    client: Client | None = None,
    prefix: str = "botmesh",
    cluster: bool = False,
) -> RedisKv:
    """A ``RedisKv`` on a server (``url``) or on a client you own, opened."""
    kv = RedisKv(url, client=client, options=RedisOptions(prefix, cluster))
    await kv.open()
    return kv

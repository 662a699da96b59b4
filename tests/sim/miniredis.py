"""A small Redis in process: the commands the layer uses, its scripts on Lua 5.1 (lupa), expiries on a given clock.

Why not fakeredis (tried first; it runs the layer's scripts in lupa too, and its clock can be made the
simulation's by replacing the ``time`` its socket module reads): a command there is a RESP round trip
through redis-py and fakeredis's command machinery, which measured 35-40 % of a simulated run's CPU
(about 250 us a command); here a command is a method call (about 20 us). What this keeps of Redis
is what the layer relies on, and ``tests/integration/test_sim_fakes.py`` holds it to redis-server
through the layer's own calls (every Lua script with the same inputs and clocks, the plain commands,
TTLs):

* strings, hashes, lists and sorted sets with Redis's replies and its ``WRONGTYPE`` error; a key
  expires when the clock passes its expiry in milliseconds (``PX``/``EX``/``PEXPIRE``; ``SET``
  clears a TTL, ``HSET`` keeps it), looked up lazily as Redis does;
* scripts (``EVAL``, ``EVALSHA``, ``SCRIPT LOAD``; ``NOSCRIPT`` for an unknown sha) on Lua 5.1, with
  ``KEYS``/``ARGV``, ``redis.call``/``redis.pcall`` and Redis's conversions both ways (a nil reply is
  ``false`` in Lua; a Lua number is an integer reply, truncated; a table an array up to its first nil;
  ``{ok=...}``/``{err=...}``; a number passed to ``redis.call`` becomes a string with ``%.17g``);
  a script runs atomically (nothing else runs while it does);
* the client side of redis-py that the layer calls (``register_script``, ``pipeline``, ``get``,
  ``set``, ``hset``... with decoded replies and redis-py's reply types), including its one retry
  after a connection error or timeout (``redisconn.connect``'s ``Retry``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import Any

import lupa.lua51 as lua51  # type: ignore[import-untyped]
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
Reply = Any


class Status(str):
    """A status reply (``+OK``)."""


class Server:
    """The data: ``key -> (type, value)``, expiries in clock milliseconds, scripts."""

    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now
        self.data: dict[str, tuple[str, Any]] = {}
        self.expires: dict[str, int] = {}
        self.scripts: dict[str, str] = {}
        self._compiled: dict[str, Any] = {}
        self.lua = lua51.LuaRuntime(unpack_returned_tuples=True)
        self._setup_lua()

    # -- keys ---------------------------------------------------------------------------------------
    def now_ms(self) -> int:
        return int(self.now() * 1000)

    def _alive(self, key: str) -> bool:
        when = self.expires.get(key)
        if when is not None and self.now_ms() > when:
            self.data.pop(key, None)
            del self.expires[key]
            return False
        return key in self.data

    def _get(self, key: str, kind: str) -> Any:
        if not self._alive(key):
            return None
        found, value = self.data[key]
        if found != kind:
            raise ResponseError(WRONGTYPE)
        return value

    def _new(self, key: str, kind: str, empty: Any) -> Any:
        value = self._get(key, kind)
        if value is None:
            value = empty
            self.data[key] = (kind, value)
        return value

    def _drop_if_empty(self, key: str) -> None:
        found = self.data.get(key)
        if found is not None and found[0] != "string" and not found[1]:
            del self.data[key]
            self.expires.pop(key, None)

    def flush(self, scripts: bool = False) -> None:
        self.data.clear()
        self.expires.clear()
        if scripts:
            self.scripts.clear()
            self._compiled.clear()

    # -- commands (arguments as strings; replies as Redis's, before decoding) -------------------------------
    def execute(self, name: str, args: list[str]) -> Reply:
        handler = getattr(self, "cmd_" + name.lower().replace(" ", "_"), None)
        if handler is None:
            raise ResponseError(f"ERR unknown command '{name}'")
        return handler(*args)

    def cmd_ping(self, *args: str) -> Reply:
        return Status("PONG")

    def cmd_get(self, key: str) -> Reply:
        return self._get(key, "string")

    def cmd_set(self, key: str, value: str, *options: str) -> Reply:
        opts = [o.upper() for o in options]
        px: int | None = None
        i = 0
        nx = xx = keep = False
        while i < len(opts):
            if opts[i] in ("EX", "PX"):
                amount = _int(options[i + 1])
                if amount <= 0:
                    raise ResponseError("ERR invalid expire time in 'set' command")
                px = amount * 1000 if opts[i] == "EX" else amount
                i += 2
                continue
            if opts[i] == "NX":
                nx = True
            elif opts[i] == "XX":
                xx = True
            elif opts[i] == "KEEPTTL":
                keep = True
            else:
                raise ResponseError("ERR syntax error")
            i += 1
        exists = self._alive(key)
        if (nx and exists) or (xx and not exists):
            return None
        self.data[key] = ("string", value)
        if px is not None:
            self.expires[key] = self.now_ms() + px
        elif not keep:
            self.expires.pop(key, None)
        return Status("OK")

    def cmd_del(self, *keys: str) -> Reply:
        count = 0
        for key in keys:
            if self._alive(key):
                del self.data[key]
                self.expires.pop(key, None)
                count += 1
        return count

    def cmd_exists(self, *keys: str) -> Reply:
        return sum(1 for key in keys if self._alive(key))

    def cmd_pexpire(self, key: str, ms: str) -> Reply:
        if not self._alive(key):
            return 0
        amount = _int(ms)
        if amount <= 0:
            del self.data[key]
            self.expires.pop(key, None)
        else:
            self.expires[key] = self.now_ms() + amount
        return 1

    def cmd_expire(self, key: str, seconds: str) -> Reply:
        return self.cmd_pexpire(key, str(_int(seconds) * 1000))

    def cmd_pttl(self, key: str) -> Reply:
        if not self._alive(key):
            return -2
        when = self.expires.get(key)
        return -1 if when is None else when - self.now_ms()

    def cmd_hset(self, key: str, *pairs: str) -> Reply:
        if not pairs or len(pairs) % 2:
            raise ResponseError("ERR wrong number of arguments for 'hset' command")
        table = self._new(key, "hash", {})
        added = 0
        for field, value in zip(pairs[::2], pairs[1::2], strict=True):
            added += field not in table
            table[field] = value
        return added

    def cmd_hget(self, key: str, field: str) -> Reply:
        return (self._get(key, "hash") or {}).get(field)

    def cmd_hmget(self, key: str, *fields: str) -> Reply:
        table = self._get(key, "hash") or {}
        return [table.get(f) for f in fields]

    def cmd_hgetall(self, key: str) -> Reply:
        table = self._get(key, "hash") or {}
        return [x for pair in table.items() for x in pair]

    def cmd_hincrby(self, key: str, field: str, amount: str) -> Reply:
        table = self._new(key, "hash", {})
        try:
            value = int(table.get(field, "0"))
        except ValueError:
            raise ResponseError("ERR hash value is not an integer") from None
        value += _int(amount)
        table[field] = str(value)
        return value

    def cmd_lpush(self, key: str, *values: str) -> Reply:
        items = self._new(key, "list", [])
        for value in values:
            items.insert(0, value)
        return len(items)

    def cmd_ltrim(self, key: str, start: str, stop: str) -> Reply:
        items = self._get(key, "list")
        if items is not None:
            lo, hi = _range(len(items), _int(start), _int(stop))
            items[:] = items[lo:hi]
            self._drop_if_empty(key)
        return Status("OK")

    def cmd_lrange(self, key: str, start: str, stop: str) -> Reply:
        items = self._get(key, "list") or []
        lo, hi = _range(len(items), _int(start), _int(stop))
        return items[lo:hi]

    def cmd_zadd(self, key: str, *pairs: str) -> Reply:
        if not pairs or len(pairs) % 2:
            raise ResponseError("ERR syntax error")
        scores = self._new(key, "zset", {})
        added = 0
        for score, member in zip(pairs[::2], pairs[1::2], strict=True):
            added += member not in scores
            scores[member] = _float(score)
        return added

    def _sorted(self, key: str) -> list[tuple[str, float]]:
        scores = self._get(key, "zset") or {}
        return sorted(scores.items(), key=lambda item: (item[1], item[0]))

    def cmd_zrangebyscore(self, key: str, low: str, high: str, *options: str) -> Reply:
        opts = [o.upper() for o in options]
        with_scores = "WITHSCORES" in opts
        items = [(m, s) for m, s in self._sorted(key) if _above(s, low) and _below(s, high)]
        if "LIMIT" in opts:
            i = opts.index("LIMIT")
            offset, count = _int(options[i + 1]), _int(options[i + 2])
            items = items[offset:] if count < 0 else items[offset:offset + count]
        if with_scores:
            return [x for m, s in items for x in (m, _score_text(s))]
        return [m for m, _ in items]

    def cmd_zrem(self, key: str, *members: str) -> Reply:
        scores = self._get(key, "zset")
        if scores is None:
            return 0
        removed = sum(1 for m in members if scores.pop(m, None) is not None)
        self._drop_if_empty(key)
        return removed

    def cmd_zremrangebyscore(self, key: str, low: str, high: str) -> Reply:
        scores = self._get(key, "zset")
        if scores is None:
            return 0
        gone = [m for m, s in scores.items() if _above(s, low) and _below(s, high)]
        for m in gone:
            del scores[m]
        self._drop_if_empty(key)
        return len(gone)

    def cmd_zremrangebyrank(self, key: str, start: str, stop: str) -> Reply:
        items = self._sorted(key)
        lo, hi = _range(len(items), _int(start), _int(stop))
        scores = self._get(key, "zset")
        for member, _ in items[lo:hi]:
            del scores[member]
        if scores is not None:
            self._drop_if_empty(key)
        return max(0, hi - lo)

    def cmd_zcard(self, key: str) -> Reply:
        return len(self._get(key, "zset") or {})

    def cmd_flushall(self, *_: str) -> Reply:
        self.flush()
        return Status("OK")

    # -- scripts ------------------------------------------------------------------------------------------
    def cmd_script_load(self, source: str) -> Reply:
        sha = hashlib.sha1(source.encode()).hexdigest()
        self.scripts[sha] = source
        return sha

    def cmd_script_flush(self, *_: str) -> Reply:
        self.scripts.clear()
        self._compiled.clear()
        return Status("OK")

    def cmd_eval(self, source: str, numkeys: str, *rest: str) -> Reply:
        sha = self.cmd_script_load(source)
        return self.cmd_evalsha(sha, numkeys, *rest)

    def cmd_evalsha(self, sha: str, numkeys: str, *rest: str) -> Reply:
        source = self.scripts.get(sha.lower())
        if source is None:
            raise NoScriptError("NOSCRIPT No matching script. Please use EVAL.")
        count = _int(numkeys)
        if count > len(rest) or count < 0:
            raise ResponseError("ERR Number of keys can't be greater than number of args")
        chunk = self._compiled.get(sha)
        if chunk is None:
            try:
                chunk = self._compiled[sha] = self.lua.compile(source)
            except lua51.LuaSyntaxError as exc:
                raise ResponseError(f"ERR Error compiling script (new function): {exc}") from None
        g = self.lua.globals()
        g.KEYS = self.lua.table_from(list(rest[:count]))
        g.ARGV = self.lua.table_from(list(rest[count:]))
        try:
            result = chunk()
        except lua51.LuaError as exc:
            raise ResponseError(f"ERR Error running script (call to f_{sha}): {exc}") from None
        return self._from_lua(result)

    def _setup_lua(self) -> None:
        lua = self.lua
        server = self

        def call(name: str, *args: Any) -> Any:
            return server._to_lua(server.execute(str(name), [_lua_arg(a) for a in args]))

        def pcall(name: str, *args: Any) -> Any:
            try:
                return call(name, *args)
            except ResponseError as exc:
                return lua.table_from({"err": str(exc)})

        redis = lua.table_from({"call": call, "pcall": pcall,
                                "status_reply": lambda text: lua.table_from({"ok": text}),
                                "error_reply": lambda text: lua.table_from({"err": text})})
        lua.globals().redis = redis

    def _to_lua(self, reply: Reply) -> Any:
        if reply is None:
            return False
        if isinstance(reply, Status):
            return self.lua.table_from({"ok": str(reply)})
        if isinstance(reply, list):
            return self.lua.table_from([self._to_lua(x) for x in reply])
        return reply

    def _from_lua(self, value: Any) -> Reply:
        if value is None or value is False:
            return None
        if value is True:
            return 1
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int):
            return value
        if isinstance(value, float):
            return int(value)  # truncated toward zero, as Redis converts a Lua number
        if isinstance(value, str | bytes):
            return value if isinstance(value, str) else value.decode()
        if lua51.lua_type(value) == "table":
            if value["err"] is not None:
                raise ResponseError(str(value["err"]))
            if value["ok"] is not None:
                return Status(str(value["ok"]))
            out = []
            i = 1
            while value[i] is not None:
                out.append(self._from_lua(value[i]))
                i += 1
            return out
        return None


def _lua_arg(value: Any) -> str:
    """An argument of ``redis.call`` as Redis receives it: a Lua number printed with ``%.17g`` (Redis's
    own conversion: Lua's ``%.14g`` loses precision)."""
    if isinstance(value, bool):
        raise ResponseError("ERR Lua redis lib command arguments must be strings or integers")
    if isinstance(value, int | float):
        return f"{float(value):.17g}"
    return str(value)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ResponseError("ERR value is not an integer or out of range") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ResponseError("ERR value is not a valid float") from None
    if math.isnan(value):
        raise ResponseError("ERR value is not a valid float")
    return value


def _score_text(score: float) -> str:
    return str(int(score)) if score.is_integer() and abs(score) < 1e17 else repr(score)


def _bound(text: str) -> tuple[float, bool]:
    exclusive = text.startswith("(")
    raw = text[1:] if exclusive else text
    lowered = raw.lower()
    value = math.inf if lowered in ("+inf", "inf") else -math.inf if lowered == "-inf" else _float(raw)
    return value, exclusive


def _above(score: float, low: str) -> bool:
    value, exclusive = _bound(low)
    return score > value if exclusive else score >= value


def _below(score: float, high: str) -> bool:
    value, exclusive = _bound(high)
    return score < value if exclusive else score <= value


def _range(length: int, start: int, stop: int) -> tuple[int, int]:
    """A Redis index range (inclusive, negatives from the end) as a slice's bounds."""
    if start < 0:
        start = max(0, length + start)
    if stop < 0:
        stop = length + stop
    stop = min(stop, length - 1)
    if start > stop or start >= length:
        return 0, 0
    return start, stop + 1


# ---------------------------------------------------------------------------------------------------
# The client side: what the layer calls of redis-py, replies decoded and typed as redis-py types them

def _arg(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, bool):
        raise TypeError("Invalid input of type: 'bool'. Convert to a bytes, string, int or float first.")
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _pairs(items: list[str]) -> dict[str, str]:
    return dict(zip(items[::2], items[1::2], strict=True))


class Commands:
    """redis-py's command methods (the ones the layer uses), over :meth:`_run`."""

    def _run(self, name: str, *args: Any, convert: Callable[[Any], Any] | None = None) -> Any:
        raise NotImplementedError

    def ping(self) -> Any:
        return self._run("PING", convert=lambda r: r == "PONG")

    def get(self, key: str) -> Any:
        return self._run("GET", key)

    def set(self, key: str, value: Any, ex: int | None = None, px: int | None = None, nx: bool = False,
            xx: bool = False, keepttl: bool = False) -> Any:
        args: list[Any] = [key, value]
        if ex is not None:
            args += ["EX", ex]
        if px is not None:
            args += ["PX", px]
        if nx:
            args.append("NX")
        if xx:
            args.append("XX")
        if keepttl:
            args.append("KEEPTTL")
        return self._run("SET", *args, convert=lambda r: True if r == "OK" else None)

    def delete(self, *keys: str) -> Any:
        return self._run("DEL", *keys)

    def exists(self, *keys: str) -> Any:
        return self._run("EXISTS", *keys)

    def pexpire(self, key: str, ms: int) -> Any:
        return self._run("PEXPIRE", key, ms, convert=bool)

    def expire(self, key: str, seconds: int) -> Any:
        return self._run("EXPIRE", key, seconds, convert=bool)

    def pttl(self, key: str) -> Any:
        return self._run("PTTL", key)

    def hset(self, name: str, key: str | None = None, value: Any = None, mapping: dict[str, Any] | None = None,
             items: list[Any] | None = None) -> Any:
        pairs: list[Any] = []
        if key is not None:
            pairs += [key, value]
        for k, v in (mapping or {}).items():
            pairs += [k, v]
        pairs += list(items or [])
        if not pairs:
            raise ValueError("'hset' with no key value pairs")  # as redis-py (DataError)
        return self._run("HSET", name, *pairs)

    def hget(self, name: str, key: str) -> Any:
        return self._run("HGET", name, key)

    def hmget(self, name: str, keys: Any, *args: Any) -> Any:
        fields = list(keys) if isinstance(keys, list | tuple) else [keys]
        return self._run("HMGET", name, *fields, *args)

    def hgetall(self, name: str) -> Any:
        return self._run("HGETALL", name, convert=_pairs)

    def hincrby(self, name: str, key: str, amount: int = 1) -> Any:
        return self._run("HINCRBY", name, key, amount)

    def lpush(self, name: str, *values: Any) -> Any:
        return self._run("LPUSH", name, *values)

    def ltrim(self, name: str, start: int, end: int) -> Any:
        return self._run("LTRIM", name, start, end, convert=lambda r: r == "OK")

    def lrange(self, name: str, start: int, end: int) -> Any:
        return self._run("LRANGE", name, start, end)

    def zadd(self, name: str, mapping: dict[str, float], **_: Any) -> Any:
        pairs: list[Any] = []
        for member, score in mapping.items():
            pairs += [score, member]
        return self._run("ZADD", name, *pairs)

    def zrangebyscore(self, name: str, min: Any, max: Any, start: int | None = None,
                      num: int | None = None, withscores: bool = False, score_cast_func: Any = float) -> Any:
        args: list[Any] = [name, min, max]
        if start is not None and num is not None:
            args += ["LIMIT", start, num]
        if withscores:
            args.append("WITHSCORES")
            return self._run("ZRANGEBYSCORE", *args,
                             convert=lambda r: [(m, score_cast_func(s)) for m, s in zip(r[::2], r[1::2], strict=True)])
        return self._run("ZRANGEBYSCORE", *args)

    def zrem(self, name: str, *members: Any) -> Any:
        return self._run("ZREM", name, *members)

    def zremrangebyscore(self, name: str, min: Any, max: Any) -> Any:
        return self._run("ZREMRANGEBYSCORE", name, min, max)

    def zremrangebyrank(self, name: str, min: int, max: int) -> Any:
        return self._run("ZREMRANGEBYRANK", name, min, max)

    def zcard(self, name: str) -> Any:
        return self._run("ZCARD", name)

    def flushall(self) -> Any:
        return self._run("FLUSHALL", convert=lambda r: r == "OK")

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        return self._run("EVALSHA", sha, numkeys, *keys_and_args)

    def eval(self, script: str, numkeys: int, *keys_and_args: Any) -> Any:
        return self._run("EVAL", script, numkeys, *keys_and_args)

    def script_load(self, script: str) -> Any:
        return self._run("SCRIPT LOAD", script)

    def script_flush(self) -> Any:
        return self._run("SCRIPT FLUSH", convert=lambda r: r == "OK")


class Script:
    """redis-py's ``Script``: EVALSHA, and on ``NOSCRIPT`` load it and run it again."""

    def __init__(self, client: Client, source: str) -> None:
        self.client = client
        self.script = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, keys: list[Any] | None = None, args: list[Any] | None = None, client: Any = None) -> Any:
        keys, args = list(keys or []), list(args or [])
        target = client or self.client
        try:
            return target.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            self.sha = target.script_load(self.script)
            return target.evalsha(self.sha, len(keys), *keys, *args)


class Client(Commands):
    """The layer's Redis client. ``gate`` is called before each command (or pipeline) is sent, with
    its name and arguments (a pipeline's: its commands and theirs); it may raise a connection error
    (Redis down). ``lost`` says whether the reply of the
    command that just ran is lost (a timeout after Redis ran it). Either is retried once, as the
    layer's client does (``Retry(NoBackoff(), 1)``)."""

    is_cluster = False

    def __init__(self, server: Server,
                 gate: Callable[..., None] = lambda name, args, commands=None: None,
                 lost: Callable[[], bool] = lambda: False) -> None:
        self.server = server
        self.gate = gate
        self.lost = lost

    def register_script(self, script: str) -> Script:
        return Script(self, script)

    def pipeline(self, transaction: bool = True) -> Pipeline:
        return Pipeline(self)

    def execute_command(self, *args: Any) -> Any:
        return self._run(str(args[0]).upper(), *args[1:])

    def _run(self, name: str, *args: Any, convert: Callable[[Any], Any] | None = None) -> Any:
        texts = [_arg(a) for a in args]

        def once() -> Any:
            self.gate(name, texts)
            reply = self.server.execute(name, texts)
            if self.lost():
                raise RedisTimeoutError("Timeout reading from socket (the reply was lost)")
            return reply

        reply = _with_retry(once)
        if isinstance(reply, Status):
            reply = str(reply)
        return convert(reply) if convert is not None else reply


class Pipeline(Commands):
    """A non-transactional pipeline: the commands go in one round trip, each runs in turn; errors are
    raised after all ran (redis-py's ``raise_on_error``)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.queued: list[tuple[str, list[str], Callable[[Any], Any] | None]] = []

    def _run(self, name: str, *args: Any, convert: Callable[[Any], Any] | None = None) -> Pipeline:
        self.queued.append((name, [_arg(a) for a in args], convert))
        return self

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.queued = []

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        queued, self.queued = self.queued, []
        client = self.client

        def once() -> list[Any]:
            client.gate(f"pipeline {queued[0][0] if queued else ''}", None, [(n, t) for n, t, _ in queued])
            replies: list[Any] = []
            for name, texts, convert in queued:
                try:
                    reply = client.server.execute(name, texts)
                    reply = str(reply) if isinstance(reply, Status) else reply
                    replies.append(convert(reply) if convert is not None else reply)
                except ResponseError as exc:
                    replies.append(exc)
            if client.lost():
                raise RedisTimeoutError("Timeout reading from socket (the reply was lost)")
            return replies

        replies = _with_retry(once) if queued else []
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, ResponseError):
                    raise reply
        return replies


def _with_retry(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except (RedisConnectionError, RedisTimeoutError):
        return call()

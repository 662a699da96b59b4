"""The per-job Redis lease: one poll chain per job.

A *chain* is the sequence of poll messages of one job that carry one random token ``T``; each
message is a step ``n`` of it. The lease ``<prefix><job_id>`` says which step may act::

    "T:n"      resting: message (T, n) waits in the queue and is the one allowed to act next
    "T:n@S"    resting, and (T, n) holds the read slot reserved at clock ms ``S``
    "T:n*"     resting, and (T, n) is a finishing message (a sweep or webhook handed the job to
               it, or its chain saw the job finished and waits to fetch the result)
    "T:n!c"    claimed: one delivery of message (T, n) is processing it (``c``: its nonce)

Operations - each one Lua script on one key (so they run unchanged in cluster mode), each safe
to repeat (a client that retries after a lost reply finds its own value and succeeds):

* ``start``: a new chain takes a *free* lease as ``T:0`` (submit, fan-out).
* ``claim``: message (T, n) moves ``T:n`` to ``T:n!c``. It also succeeds on its own claimed
  value (a retry) and on a resting older step of its own chain ``T:m`` with m < n (the chain
  moved on while Redis was unreachable). A claimed older step ``T:m!x`` is not taken: a
  delivery of (T, m) may be mid-read (an SQS duplicate of a step the chain already took without
  Redis), so (T, n) is told *busy* and comes back later - by then that delivery rested or
  released the lease, or died and its claim expired. A duplicate delivery of the same message
  finds the first delivery's nonce and fails. A *free* lease is taken too, but as a new chain
  with a fresh token - so an older chain's late messages can never renew it.
* ``rest``: before re-queueing step n+1, ``T:n!c`` becomes ``T:n+1`` (``T:n+1*`` when step n+1
  fetches a finished job's result) with a TTL covering the wait plus a margin.
* ``release``: the claimed value is deleted when the job is finished (already gone counts).
* ``hand_over``: a sweep (or webhook) that learned a waiting job is finished hands its chain to
  a finishing message: ``T:n`` -> ``T:n+1*`` (that message is step n+1; the waiting step n then
  finds the job taken) and inherits the read slot the waiting step had reserved, if any (that
  step will never use it). It fails while a delivery is mid-poll (the sweep leaves that job to it)
  and on a finishing step (a job already handed over, or a chain waiting to fetch the result:
  it keeps its place in line).

If the holder dies, the TTL hands the job to whoever comes next. The lease saves Sume reads; it
is not what makes the outcome exactly-once (that is the conditional write in
:mod:`sume_poller.store.records`).
"""

from __future__ import annotations

import secrets
from enum import IntEnum
from typing import Any, NamedTuple

from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from ..core.values import value
from .redisconn import lua_locals, script_args

#: The claim's arguments (``lease_claim``'s parameters, the claim script's ARGV).
CLAIM_ARGS = ("resting", "claimed", "token", "seq", "fresh", "ttl_ms")

#: Lua: claim step (T, n): its resting and claimed values, its token and seq, the fresh chain's
#: claimed value, the TTL. Returns 1 (claimed, own chain), 2 (lease was free: claimed as the
#: fresh chain), 0 (held), 3 (busy: a delivery of an older step of this chain holds its claim).
CLAIM_LUA = """
local function lease_claim(key, resting, claimed, token, seq, fresh, ttl)
  local v = redis.call('GET', key)
  if not v then
    redis.call('SET', key, fresh, 'PX', ttl)
    return 2
  end
  if v == resting or v == resting .. '*' or string.sub(v, 1, #resting + 1) == resting .. '@'
      or v == claimed or v == fresh then
    redis.call('SET', key, v == fresh and fresh or claimed, 'PX', ttl)
    return v == fresh and 2 or 1
  end
  local t, s, mid = string.match(v, '^(%x+):(%d+)(!?)')
  if t == token and tonumber(s) < seq then
    if mid == '!' then return 3 end
    redis.call('SET', key, claimed, 'PX', ttl)
    return 1
  end
  return 0
end
"""

#: Lua: take a free lease for a new chain. ARGV: value, ttl ms. 1 taken (or already ours), 0 held.
START_LUA = """
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if v == ARGV[1] then return 1 end
return 0
"""

#: Lua: claimed -> resting next step. ARGV: claimed, next resting, ttl ms. 1 done, 0 lease lost.
REST_LUA = """
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] or v == ARGV[2] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""

#: Lua: delete while it holds the claimed value. 1 deleted or already gone, 0 held by another.
RELEASE_LUA = """
local v = redis.call('GET', KEYS[1])
if not v then return 1 end
if v == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

#: Lua: hand a waiting chain over to a finishing message. ARGV: fresh value ("T':0*"), ttl ms,
#: now (clock ms), real seconds per clock second, margin (real ms).
#: A resting "T:n" becomes "T:n+1*" (the finishing message is step n+1, so the waiting message
#: n finds the job taken); a free lease becomes the fresh value. The lease lives ``ttl`` or, when
#: the waiting step had reserved a read slot (the message inherits it and is due then), until that
#: slot plus the margin, whichever is longer. Returns the value now held, or false while a delivery
#: is mid-poll or the job was handed over already; with the value, the read slot the waiting step
#: had reserved ("" if none). A repeat after a lost reply returns false too: the finishing message
#: of the first call was not sent, and the lease expires so the job's chain takes over again.
HAND_OVER_LUA = """
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return ARGV[1]
end
local t, s, slot = string.match(v, '^(%x+):(%d+)@?(%d*)$')
if not t then return false end
local next = t .. ':' .. (tonumber(s) + 1) .. '*'
local ttl = tonumber(ARGV[2])
if slot ~= '' then
  local until_slot = math.floor((tonumber(slot) - tonumber(ARGV[3])) * tonumber(ARGV[4]) + tonumber(ARGV[5]))
  if until_slot > ttl then ttl = until_slot end
end
redis.call('SET', KEYS[1], next, 'PX', ttl)
return {next, slot}
"""


#: Real seconds before a message told *busy* comes back: the older step's delivery ends within its
#: invocation, or its claim expires (``CLAIM_TTL_SECONDS``) if it died. Each return costs a message.
BUSY_RETRY = 5.0


class Claim(IntEnum):
    HELD = 0  # another chain (or another delivery of this message) holds the job
    OWN = 1  # this message's step of its own chain
    FRESH = 2  # the lease was free: this message now runs a new chain (fresh token)
    BUSY = 3  # a delivery of an older step of this chain holds its claim: come back later


def new_token() -> str:
    """A non-guessable chain token: 16 random bytes as 32 hex characters."""
    return secrets.token_hex(16)


def new_nonce() -> str:
    return secrets.token_hex(4)


@value
class ChainStep:
    """One step of a chain: message ``(token, seq)``, processed by the delivery ``nonce``."""

    token: str
    seq: int
    nonce: str

    @property
    def resting(self) -> str:
        return f"{self.token}:{self.seq}"

    @property
    def claimed(self) -> str:
        return f"{self.token}:{self.seq}!{self.nonce}"

    @property
    def next_resting(self) -> str:
        return f"{self.token}:{self.seq + 1}"

    def claim_values(self, fresh: ChainStep, ttl_ms: int) -> dict[str, Any]:
        """The claim's arguments by name (:data:`CLAIM_ARGS`)."""
        return {"resting": self.resting, "claimed": self.claimed, "token": self.token, "seq": self.seq,
                "fresh": fresh.claimed, "ttl_ms": ttl_ms}


class HandOver(NamedTuple):
    """What :meth:`LeaseStore.hand_over` gives the finishing message: its step, and the read slot
    (clock seconds) the waiting step had reserved, which it may use instead."""

    token: str
    seq: int
    slot: float | None = None


def resting_value(step: ChainStep, finishing: bool = False, slot: float | None = None) -> str:
    """The lease value step n+1 rests under (see the module docstring)."""
    if finishing:
        return step.next_resting + "*"
    return step.next_resting + (f"@{int(slot * 1000)}" if slot is not None else "")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class LeaseStore:
    def __init__(self, client: Any, prefix: str = "sume:poll:") -> None:
        self.client = client
        self.prefix = prefix
        self._claim = client.register_script(CLAIM_LUA + lua_locals(CLAIM_ARGS) + (
            "return lease_claim(KEYS[1], resting, claimed, token, tonumber(seq), fresh, ttl_ms)"))
        self._start = client.register_script(START_LUA)
        self._rest = client.register_script(REST_LUA)
        self._release = client.register_script(RELEASE_LUA)
        self._hand_over = client.register_script(HAND_OVER_LUA)

    def key(self, job_id: str) -> str:
        return self.prefix + job_id

    def claim(self, job_id: str, step: ChainStep, fresh: ChainStep, ttl_ms: int) -> Claim:
        """Claim ``step`` (or, if the lease is free, ``fresh``: a new chain's step 0)."""
        return Claim(int(self._claim(keys=[self.key(job_id)], args=script_args(CLAIM_ARGS, step.claim_values(fresh,
                                                                                                     ttl_ms)))))

    def start(self, job_id: str, token: str, ttl_ms: int) -> bool:
        """A new chain takes the free lease as ``token:0``; False if a chain holds the job."""
        return bool(self._start(keys=[self.key(job_id)], args=[f"{token}:0", ttl_ms]))

    def _start_pipelined(self, starts: list[tuple[str, str]], ttl_ms: int) -> list[bool]:
        """EVALSHA in a pipeline, not redis-py's Script: a pipeline holding a Script first asks
        SCRIPT EXISTS, a second round trip on every call. The script is loaded again only when
        Redis lost it (a restart, a failover); none of the starts ran then, so all are repeated."""
        for _ in range(2):
            pipe = self.client.pipeline(transaction=False)
            for job_id, token in starts:
                pipe.evalsha(self._start.sha, 1, self.key(job_id), f"{token}:0", ttl_ms)
            try:
                return [bool(r) for r in pipe.execute()]
            except NoScriptError:
                self.client.script_load(START_LUA)
        raise NoScriptError("the start script was lost twice in a row")

    def start_many(self, starts: list[tuple[str, str]], ttl_ms: int) -> list[bool]:
        """:meth:`start` for many ``(job_id, token)`` in one pipelined round trip.

        A cluster pipeline may not run scripts: there each job gets ``SET NX PX``, and the jobs
        that come back held get one more pipelined ``GET`` - a start whose reply was lost and
        was repeated finds its own value (the start is then still ours)."""
        if not (isinstance(self.client, RedisCluster) or getattr(self.client, "is_cluster", False)):
            return self._start_pipelined(starts, ttl_ms)
        pipe = self.client.pipeline(transaction=False)
        for job_id, token in starts:
            pipe.set(self.key(job_id), f"{token}:0", nx=True, px=ttl_ms)
        taken = [bool(r) for r in pipe.execute()]
        held = [i for i, ok in enumerate(taken) if not ok]
        if held:
            pipe = self.client.pipeline(transaction=False)
            for i in held:
                pipe.get(self.key(starts[i][0]))
            for i, value in zip(held, pipe.execute(), strict=True):
                taken[i] = value == f"{starts[i][1]}:0"
        return taken

    def rest(self, job_id: str, step: ChainStep, ttl_ms: int, *, finishing: bool = False,
             slot: float | None = None) -> bool:
        """Before re-queueing step n+1: ``T:n!c`` -> ``T:n+1`` (``T:n+1*`` for a ``finishing``
        step: one that fetches a finished job's result; ``T:n+1@S`` for one that holds the read
        slot reserved at clock time ``slot``). False: the lease was lost."""
        return bool(self._rest(keys=[self.key(job_id)], args=[step.claimed, resting_value(step, finishing, slot),
                                                              ttl_ms]))

    def release(self, job_id: str, value: str) -> bool:
        """Delete the lease while it holds ``value`` (a step's claimed value, or the resting value
        of a step whose message could not be sent); already gone counts as released."""
        return bool(self._release(keys=[self.key(job_id)], args=[value]))

    def hand_over(self, job_id: str, fresh_token: str, ttl_ms: int, *, now: float | None = None,
                  scale: float = 1.0, margin_ms: int = 0) -> HandOver | None:
        """Take a waiting chain (or a free lease) for a finishing message: the (token, seq) that
        message must carry and the read slot it inherits, or None while a delivery of the chain
        is mid-poll. The lease lives ``ttl_ms``, or until the inherited slot (clock seconds from
        ``now``, ``scale`` real seconds each) plus ``margin_ms`` when that is later."""
        until_slot = [0, 0, 0] if now is None else [int(now * 1000), scale, margin_ms]
        held = self._hand_over(keys=[self.key(job_id)], args=[f"{fresh_token}:0*", ttl_ms, *until_slot])
        if not held:
            return None
        value, slot = (held if isinstance(held, list) else [held, ""])[:2]
        token, _, seq = _text(value).rstrip("*").partition(":")
        slot_ms = _text(slot)
        return HandOver(token, int(seq), int(slot_ms) / 1000 if slot_ms else None)

    def held(self, job_ids: list[str]) -> list[bool]:
        """Which jobs hold a lease, in one pipelined round trip (diagnostics and tests)."""
        pipe = self.client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.exists(self.key(job_id))
        return [bool(n) for n in pipe.execute()]

"""The shared Sume budget: one limiter in Redis for every poller (reads) and submit (creates).

Sume limits each API key per minute and per day (reads 120/min and 10,000/day, creates 10/min
and 300/day by its docs). The limiter is GCRA (generic cell rate algorithm) with reservations,
both windows at once, atomic in one Lua script on one hash key:

* each window keeps a theoretical arrival time (TAT); a request gets the earliest *slot* both
  windows allow. A poller that cannot read now learns its slot and re-queues its message for
  that time (keeping its lease) - waiting jobs never wake up together and retry in a herd;
* a window of ``W`` seconds and limit ``L`` grants at most ``L - 1`` in any span of ``W``
  (``L`` below 20: ``L``), with a burst of ``L // 50``: Sume's own fixed windows never see more
  than ``L`` even when our grants and its windows do not line up. An ``ahead`` request (a result
  fetch of a job Sume finished) gets a slot one interval earlier than a plain request at the same
  moment would - never past the window (the interval it may borrow is kept free:
  ``L - L // 50 - 3`` grants per window, ``L - 2`` below 20);
* the sweeps' *lane*: while the sweep function keeps it open (:meth:`Budget.open_lane`), a share
  ``k`` of each window (``SweepReadSharePercent``) is kept for ``list`` reads - the line of chain and
  result reads is spaced for ``k + 1`` fewer grants, and list reads have their own pair of TATs
  allowing ``k`` per window with up to ``LANE_BURST + 1`` at once (a sweep's pages). However far
  ahead chains have reserved slots, a sweep finds its reads free; when sweeps stop, the lane
  closes by itself and chains get the whole budget back;
* a result read of a job Sume finished outranks status reads: while status reads are reserved
  further ahead than one interval, it takes the place of the next reserved one (that status
  read's ``confirm`` then sends it to the back of the line; one place taken at a time, so even a
  place nobody gives up costs at most the window's spare read, so limits below 20 do not do it),
  so a budget saturated by status reads still serves known-finished jobs first;
* a request may refuse a slot further than ``max_wait`` away (the schedule's ordering: a job
  unlikely to be finished yet lets more promising ones read first) - then nothing is reserved;
* feedback tightens it for everyone: ``RateLimit-Limit``/``RateLimit-Policy`` teach the real
  limits, ``RateLimit-Remaining``/``-Reset`` what is left in Sume's window (so another client of
  the same key is taken into account), a 429's ``Retry-After`` pauses every read until then, and
  a rejected key pauses them key-wide;
* a reserved slot is checked again when its message comes back (``confirm``): a pause or an
  exhausted server window since then sends it to the back of the line. When Sume's remaining
  count drops below what our own grants explain, another client spends the key: one read is then
  kept in reserve at the end of each window, so its reads do not collect 429s for us.

Times in Redis are clock milliseconds passed by the caller (:mod:`sume_poller.clock`), so tests
and benchmarks can drive the limiter with a compressed clock. When Redis is down,
:class:`LocalPacer` paces each container alone at its share of the budget (fail-safe).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .redisconn import lua_locals, script_args

#: List reads the sweeps' lane grants at once beyond the first (a sweep's pages).
LANE_BURST = 8

#: Lua library. Hash fields: tm/td (TAT, minute/day), pz (429 pause until), au (key pause
#: until), rm/rr (server's remaining reads and when its window resets), ox (another client of
#: the key was seen spending until then: keep a read in reserve), lm/ld (learned limits), n
#: (pending jobs, from fan-out), sa/sk (the sweeps' lane is open until, its share in per mille),
#: sm/sd (the lane's TATs), db (reserved status reads whose place a result read took), ha (the
#: next such result read's slot). All times clock ms.
BUDGET_LUA = f"local LANE_BURST = {LANE_BURST}\n" + """

local function limit_of(configured, learned)
  local limit = tonumber(configured)
  local l = tonumber(learned)
  if l and l > 0 and (limit == 0 or l < limit) then limit = l end
  return limit
end

-- reads of a window kept for list reads while the sweeps' lane is open (share in per mille)
local function lane_size(limit, share)
  if share <= 0 or limit <= 0 then return 0 end
  return math.max(1, math.floor(limit * share / 1000))
end

local function window(configured, learned, span, share)
  local limit = limit_of(configured, learned)
  if limit <= 0 then return 0, 0 end
  local burst = math.floor(limit / 50)
  local spare = (limit >= 20) and 1 or 0
  local k = lane_size(limit, share)
  if k > 0 then k = k + 1 end
  local per = math.max(1, limit - burst - 2 - spare - k)
  local t = span / per
  return t, burst * t
end

-- the lane: at most lane_size grants in any span, a sweep's pages in a burst
local function lane_window(configured, learned, span, share)
  local limit = limit_of(configured, learned)
  local k = lane_size(limit, share)
  if k <= 0 then return 0, 0 end
  local b = math.min(LANE_BURST, k - 1)
  local t = span / math.max(1, k - b)
  return t, b * t
end

-- a granted slot: read now if it is this close (one read less left in Sume's window)
local function granted(key, now, wait, early, rm, rr, pending, au, dl)
  if wait <= early then
    wait = 0
    if rm ~= nil and now < rr then redis.call('HSET', key, 'rm', rm - 1) end
  end
  redis.call('PEXPIRE', key, 172800000)
  return {1, wait, pending, (au > now) and 2 or 0, dl}
end

-- reads the day window still grants over the next day (-1: no day limit): what a container may
-- spend a share of while Redis is down (LocalPacer)
local function day_left(td, cfg_d, learned, share, now)
  local t, tau = window(cfg_d, learned, 86400000, share)
  if t <= 0 then return -1 end
  return math.max(0, math.floor((now + 86400000 + tau - math.max(td, now)) / t))
end

local function budget_take(key, now, mode, max_wait, early, cfg_m, cfg_d, slot, count)
  count = tonumber(count) or 1
  local s = redis.call('HMGET', key, 'tm', 'td', 'pz', 'au', 'rm', 'rr', 'lm', 'ld', 'n', 'ox', 'sa', 'sk', 'sm', 'sd',
                      'db', 'ha')
  local tm, td = tonumber(s[1]) or 0, tonumber(s[2]) or 0
  local pz, au = tonumber(s[3]) or 0, tonumber(s[4]) or 0
  local rm, rr = tonumber(s[5]), tonumber(s[6]) or 0
  local pending = tonumber(s[9]) or -1
  local reserve = ((tonumber(s[10]) or 0) > now) and 1 or 0
  local share = ((tonumber(s[11]) or 0) > now) and (tonumber(s[12]) or 0) or 0
  local paused = math.max(pz, au)
  local exhausted = rm ~= nil and rm <= reserve and now < rr
  local owed = tonumber(s[15]) or 0
  local dl = day_left(td, cfg_d, s[8], share, now)
  if mode == 'confirm' or mode == 'rconfirm' then
    if now >= paused and not exhausted and slot <= now + early then
      if mode == 'confirm' and owed > 0 then
        -- a result read took the place of a reserved status read: this one goes to the back
        owed = owed - 1
        redis.call('HSET', key, 'db', owed)
      else
        if rm ~= nil and now < rr then redis.call('HSET', key, 'rm', rm - 1) end
        return {1, 0, pending, 0, dl}
      end
    end
    mode = 'take'
  end
  if mode == 'list' and share <= 0 then mode = 'ahead' end  -- no lane open: ahead of the line
  local lane = (mode == 'list')
  local fm, fd = 'tm', 'td'
  local t_m, tau_m, t_d, tau_d
  if lane then
    fm, fd, tm, td = 'sm', 'sd', tonumber(s[13]) or 0, tonumber(s[14]) or 0
    t_m, tau_m = lane_window(cfg_m, s[7], 60000, share)
    t_d, tau_d = lane_window(cfg_d, s[8], 86400000, share)
  else
    t_m, tau_m = window(cfg_m, s[7], 60000, share)
    t_d, tau_d = window(cfg_d, s[8], 86400000, share)
  end
  if mode == 'ahead' then
    -- A result read of a job Sume finished outranks every status read: while status reads are
    -- reserved further than an interval ahead, it takes the place of the next one (that read's
    -- confirm goes to the back of the line), result reads spaced like the line they replace.
    -- One place at a time: until a confirm has given its place up, a result read that never
    -- displaced anyone is one read more in its window - which the window's spare read covers
    -- (only limits of 20 and more keep one).
    local sat_m = t_m > 0 and tm - tau_m - t_m > now
    local sat_d = t_d > 0 and td - tau_d - t_d > now
    local spared = (not sat_m or limit_of(cfg_m, s[7]) >= 20) and (not sat_d or limit_of(cfg_d, s[8]) >= 20)
    if (sat_m or sat_d) and spared then
      local t = math.max(sat_m and t_m or 0, sat_d and t_d or 0)
      if owed < 1 then
        local at = math.max(now + t, tonumber(s[16]) or 0, paused)
        if exhausted and at < rr then at = rr end
        local wait = at - now
        if max_wait >= 0 and wait > max_wait then
          return {0, wait, pending, (au > now) and 2 or 1, dl}
        end
        redis.call('HSET', key, 'db', owed + 1, 'ha', at + t)
        return granted(key, now, wait, early, rm, rr, pending, au, dl)
      end
    end
  end
  -- otherwise 'ahead' goes one interval before the line of reserved slots
  local ahead = (mode == 'ahead') and 1 or 0
  local at = math.max(now, paused)
  if t_m > 0 then at = math.max(at, tm - tau_m - ahead * t_m + (count - 1) * t_m) end
  if t_d > 0 then at = math.max(at, td - tau_d - ahead * t_d + (count - 1) * t_d) end
  if exhausted and at < rr then at = rr end
  local wait = at - now
  if mode == 'peek' then return {0, wait, pending, (au > now) and 2 or 0, dl} end
  if max_wait >= 0 and wait > max_wait then
    return {0, wait, pending, (au > now) and 2 or 1, dl}
  end
  if t_m > 0 then tm = math.max(tm, at) + count * t_m end
  if t_d > 0 then td = math.max(td, at) + count * t_d end
  redis.call('HSET', key, fm, tm, fd, td)
  return granted(key, now, wait, early, rm, rr, pending, au, dl)
end
"""

#: Lua: what Sume's reply said. ARGV: now, window ('m', 'd' or ''), remaining, reset ms,
#: retry-after ms (-1: none), learned minute limit, learned day limit (-1: none), cfg_m, cfg_d.
FEEDBACK_LUA = BUDGET_LUA + """
local key, now = KEYS[1], tonumber(ARGV[1])
local w, remaining, reset = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local retry, lm, ld = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
if lm > 0 then redis.call('HSET', key, 'lm', lm) end
if ld > 0 then redis.call('HSET', key, 'ld', ld) end
if retry >= 0 then
  local pz = tonumber(redis.call('HGET', key, 'pz')) or 0
  redis.call('HSET', key, 'pz', math.max(pz, now + retry))
end
if w ~= '' and remaining >= 0 then
  local rm, rr = tonumber(redis.call('HGET', key, 'rm')), tonumber(redis.call('HGET', key, 'rr')) or 0
  local span = (w == 'm') and 60000 or 86400000
  if rm ~= nil and now < rr and now + reset < rr + span / 2 then
    -- the same Sume window: what is left only goes down (replies of a batch arrive out of order)
    if remaining < rm then
      -- Sume counts fewer left than our own grants allow: another client spends this key
      redis.call('HSET', key, 'ox', now + 600000, 'rm', remaining)
    end
  else
    redis.call('HSET', key, 'rm', remaining, 'rr', now + reset)
  end
  local field = (w == 'm') and 'tm' or 'td'
  local learned = redis.call('HGET', key, (w == 'm') and 'lm' or 'ld')
  local lane = redis.call('HMGET', key, 'sa', 'sk')
  local share = ((tonumber(lane[1]) or 0) > now) and (tonumber(lane[2]) or 0) or 0
  local t, tau = window((w == 'm') and ARGV[8] or ARGV[9], learned, (w == 'm') and 60000 or 86400000, share)
  if t > 0 then
    local tat = tonumber(redis.call('HGET', key, field)) or 0
    redis.call('HSET', key, field, math.max(tat, now + reset + tau - remaining * t))
  end
end
redis.call('PEXPIRE', key, 172800000)
return 1
"""

#: A take's arguments (``budget_take``'s parameters after the key; the take script's ARGV).
TAKE_ARGS = ("now_ms", "mode", "max_wait_ms", "early_ms", "per_minute", "per_day", "slot_ms", "count")

TAKE_LUA = BUDGET_LUA + lua_locals(TAKE_ARGS) + """
return budget_take(KEYS[1], tonumber(now_ms), mode, tonumber(max_wait_ms), tonumber(early_ms), per_minute,
                   per_day, tonumber(slot_ms), tonumber(count))
"""


def lane_size(limit: int, share: float) -> int:
    """Reads of a window the sweeps' lane keeps (the Lua ``lane_size``; ``share`` a fraction)."""
    permille = round(share * 1000)
    return 0 if permille <= 0 or limit <= 0 else max(1, limit * permille // 1000)


def lane_burst(limit: int, share: float) -> int:
    """List reads the sweeps' lane grants at once (the Lua ``lane_window``'s burst, plus one)."""
    k = lane_size(limit, share)
    return min(LANE_BURST, k - 1) + 1 if k else 0


def granted_per_window(limit: int, share: float = 0.0) -> int:
    """Grants per window to chains and result reads in a sustained overload, with the sweeps'
    lane open at ``share`` or not (the same arithmetic as the Lua ``window``)."""
    k = lane_size(limit, share)
    return max(1, limit - limit // 50 - 2 - (1 if limit >= 20 else 0) - (k + 1 if k else 0))


@dataclass(frozen=True, slots=True)
class Grant:
    """The limiter's answer: read now (``wait == 0``), or at the slot ``wait`` seconds away
    (reserved when ``granted``), or not reserved at all (``granted`` False: the slot was
    further than ``max_wait``, or the key is paused)."""

    granted: bool
    wait: float
    #: Pending jobs as fan-out last counted them (None: unknown).
    pending: int | None = None
    key_paused: bool = False
    #: Reads the day window still grants over the next day (None: no day limit or not told).
    day_left: int | None = None

    @property
    def now(self) -> bool:
        return self.granted and self.wait <= 0

    @classmethod
    def from_reply(cls, reply: list[Any]) -> Grant:
        granted, wait_ms, pending, reason = (int(x) for x in reply[:4])
        day_left = int(reply[4]) if len(reply) > 4 and int(reply[4]) >= 0 else None
        return cls(bool(granted), max(0.0, wait_ms / 1000), None if pending < 0 else pending, reason == 2, day_left)


@dataclass(frozen=True, slots=True)
class RateInfo:
    """Sume's rate-limit headers of one reply (any may be missing)."""

    limit: int | None = None
    remaining: int | None = None
    reset: float | None = None
    #: From ``RateLimit-Policy``: window seconds -> limit.
    policy: tuple[tuple[int, int], ...] = ()
    retry_after: float | None = None

    def window(self) -> str:
        """Which window the Limit/Remaining/Reset triple describes: 'm', 'd' or '' (unknown)."""
        if self.remaining is None or self.reset is None:
            return ""
        for seconds, limit in self.policy:
            if limit == self.limit:
                return "m" if seconds <= 60 else "d"
        return "m" if self.reset <= 60 else "d"

    def learned(self, span: int) -> int | None:
        for seconds, limit in self.policy:
            if (seconds <= 60) == (span <= 60):
                return limit
        if self.limit is not None and self.window() == ("m" if span <= 60 else "d"):
            return self.limit
        return None

    def worth_telling(self, limit_hint: int | None) -> bool:
        """True when the limiter should hear of this reply: a 429, a limit it may not know, or
        Sume's window half spent (from then on every reply keeps the limiter's view of what is
        left fresh: at most one Redis round trip added per read)."""
        if self.retry_after is not None:
            return True
        if self.limit is not None and limit_hint is not None and self.limit != limit_hint:
            return True
        return self.remaining is not None and self.limit is not None and self.remaining <= max(10, self.limit // 2)


class Budget:
    """One budget (reads or creates) in a Redis hash, in clock time."""

    def __init__(self, client: Any, key: str, per_minute: int, per_day: int,
                 now: Callable[[], float], early: float = 0.5, real_per_clock: float = 1.0) -> None:
        self._r = client
        self.real_per_clock = real_per_clock
        self.key = key
        self.per_minute = per_minute
        self.per_day = per_day
        self._now = now
        #: A slot this close (clock seconds) counts as now.
        self.early = early
        self._take = client.register_script(TAKE_LUA)
        self._feedback = client.register_script(FEEDBACK_LUA)

    def clock_to_real(self, seconds: float) -> float:
        """Real seconds that ``seconds`` of the limiter's clock take."""
        return seconds * self.real_per_clock

    @property
    def unlimited(self) -> bool:
        return self.per_minute == 0 and self.per_day == 0

    @property
    def rate(self) -> float:
        """Grants per clock second the configured budget sustains (inf when unlimited): what the
        Lua ``window`` function spaces grants by."""
        rates = [granted_per_window(n) / span for n, span in ((self.per_minute, 60), (self.per_day, 86_400)) if n > 0]
        return min(rates) if rates else math.inf

    def take_values(self, mode: str = "take", max_wait: float = math.inf, slot: float = 0.0,
                    count: int = 1) -> dict[str, Any]:
        """A take's arguments by name (:data:`TAKE_ARGS`; the gate's script takes them too)."""
        return {"now_ms": int(self._now() * 1000), "mode": mode,
                "max_wait_ms": -1 if math.isinf(max_wait) else int(max_wait * 1000),
                "early_ms": int(self.early * 1000), "per_minute": self.per_minute, "per_day": self.per_day,
                "slot_ms": int(slot * 1000), "count": count}

    def take(self, mode: str = "take", max_wait: float = math.inf, slot: float = 0.0, count: int = 1) -> Grant:
        """Reserve the next slot (``mode``: "take", "confirm" a status read's slot at ``slot``,
        "rconfirm" a result read's, "ahead" of the status reads for a result, "list" in the
        sweeps' lane (ahead of the line if it is closed), or "peek": how far the next slot is,
        reserving nothing) - or ``count`` slots at once (a sweep's pages). One round trip."""
        if self.unlimited:
            return Grant(True, 0.0)
        return Grant.from_reply(self._take(keys=[self.key],
                                           args=script_args(TAKE_ARGS, self.take_values(mode, max_wait, slot, count))))

    def feedback(self, info: RateInfo) -> None:
        """Tell the limiter what Sume's reply said (one round trip)."""
        def ms(seconds: float | None) -> int:
            return -1 if seconds is None else int(seconds * 1000)
        self._feedback(keys=[self.key], args=[
            int(self._now() * 1000), info.window(), -1 if info.remaining is None else info.remaining,
            ms(info.reset), ms(info.retry_after), info.learned(60) or -1, info.learned(86_400) or -1,
            self.per_minute, self.per_day])

    def lane_burst(self, share: float) -> int:
        """List reads the sweeps' lane grants at once under the configured limits."""
        bursts = [lane_burst(n, share) for n in (self.per_minute, self.per_day) if n > 0]
        return min(bursts) if bursts else LANE_BURST + 1

    def open_lane(self, share: float, until: float) -> None:
        """Keep ``share`` of each window for list reads (mode "list") until clock time ``until``;
        the sweep function calls it whenever it runs. One round trip."""
        self._r.hset(self.key, mapping={"sa": int(until * 1000), "sk": round(share * 1000)})

    def pause_key(self, seconds: float) -> None:
        """Sume refused the key: no read until then (rotation resumes them)."""
        until = int((self._now() + seconds) * 1000)
        self._r.hset(self.key, "au", until)

    def set_pending(self, count: int) -> None:
        self._r.hset(self.key, "n", count)

    def state(self) -> dict[str, float]:
        raw = self._r.hgetall(self.key)
        return {str(k): float(v) for k, v in raw.items()}


class LocalPacer:
    """Pacing for one container while Redis is unreachable (no shared limiter), by this rule:

    * the per-minute limit is a hard ceiling that ``share`` containers keep without talking to
      each other: each grants itself at most ``1/share`` of what the shared limiter grants a minute
      (:func:`granted_per_window`), evenly spaced;
    * the day budget is a total, not a pace: at that minute pace a container may spend up to its
      share (``1/share``) of what the day has left - as the shared limiter last told it
      (:meth:`learn`, on every grant while Redis answered), or, for a container that never heard,
      what an evenly spent day has left (the day budget times the part of the UTC day still
      ahead). Past that share it falls back to its share of the day's average rate;
    * a 429's ``Retry-After`` pauses it (:meth:`pause`).

    Slots are reserved: :meth:`take` says how far away this container's next one is, and a
    message that waits for it carries it (``PollMessage.paced_at``) instead of taking another.
    """

    def __init__(self, per_minute: int, per_day: int, share: int, now: Callable[[], float] = time.time) -> None:
        self.share = max(1, share)
        self._now = now
        minute = granted_per_window(per_minute) / 60 / self.share if per_minute > 0 else math.inf
        average = granted_per_window(per_day) / 86_400 / self.share if per_day > 0 else math.inf
        self.interval = 0.0 if math.isinf(minute) else 1 / minute
        self.slow_interval = max(self.interval, 0.0 if math.isinf(average) else 1 / average)
        self.per_day = per_day
        self._allowance: float | None = None  # of the day's reads, what this container may still spend
        self._next = 0.0
        self._lock = threading.Lock()

    def learn(self, day_left: int | None) -> None:
        """What the shared limiter says the day still grants (None: no day limit or not told)."""
        if day_left is not None and self.per_day > 0:
            with self._lock:
                self._allowance = day_left / self.share

    def pause(self, until: float) -> None:
        """Sume answered 429: no slot before ``until`` (clock seconds)."""
        with self._lock:
            self._next = max(self._next, until)

    def take(self) -> float:
        """Reserve this container's next slot; seconds until it (0: read now)."""
        with self._lock:
            now = self._now()
            if self._allowance is None:
                self._allowance = (self.per_day * (1 - (now % 86_400) / 86_400) / self.share
                                   if self.per_day > 0 else math.inf)
            at = max(now, self._next)
            spent = self._allowance < 1
            self._allowance -= 1
            self._next = at + (self.slow_interval if spent else self.interval)
            return at - now

"""The shared Sume budget: one limiter in Redis for every poller (reads) and submit (creates).

Sume limits each API key per minute and per day (reads 120/min and 10,000/day, creates 10/min
and 300/day by its docs). One Lua script decides every request, atomically, on the budget's hash
(and the sweeps' lane, a hash of its own in the same cluster slot). Its state is the table at the
top of :data:`BUDGET_LUA`; the rules:

* **the minute is a pace** (GCRA, the generic cell rate algorithm, with reservations): a request
  gets the earliest *slot* the window allows; one that cannot read now learns its slot and
  re-queues its message for that time (keeping its lease), so waiting jobs never wake up together
  and retry in a herd. A window of limit ``L`` grants ``L - L // 50 - 3`` a minute in a sustained
  overload (``L - 2`` below 20: :func:`granted_per_window`), with a burst of ``L // 50``: Sume's own
  fixed windows never see more than ``L`` even when our grants and its windows do not line up
  (one spare read), and a read ``ahead`` of the line (a job known to be finished) may borrow an
  interval without passing the window;
* **the day is a total, not a pace**: reads run at the minute's pace while what is left of the
  day window covers a reserve for the rest of it - the safety cadence of every pending job (one
  read per ``reserve_every`` seconds each) plus a floor for jobs still to come (``DAY_FLOOR`` of
  the day's budget, spread over it) - never more than an evenly spent day would keep. Once the
  reserve binds, reads are spaced so that what is left lasts the day: ``used + 1 <= limit -
  rate * (reset - t)``. The day window ends where Sume's ``RateLimit-Reset`` says when a reply
  describes it, else at the UTC day's end; the day total is never exceeded (a grant that does not
  fit is a slot in the next window);
* **the sweeps' lane**: while the sweep function keeps it open (:meth:`Budget.open_lane`), a share
  ``k`` of each minute (``SweepReadSharePercent``) is kept for ``list`` reads - the line of chain
  and result reads is spaced for ``k + 1`` fewer grants, and list reads have their own GCRA
  allowing ``k`` a minute with up to ``LANE_BURST + 1`` at once (a sweep's pages); the lane closes
  by itself when sweeps stop;
* **a result read goes first**: while status reads are reserved further ahead than one interval, a
  result read of a job Sume finished takes the place of the next reserved one (whose ``confirm``
  then sends it to the back of the line); one place at a time, so a place nobody gives up costs at
  most the window's spare read (limits below 20 keep none, so they do not do it);
* a request may refuse a slot further than ``max_wait`` away (the schedule's ordering) - nothing is
  then reserved; a reserved slot is checked again when its message comes back (``confirm``); one
  that comes back before its slot (a sweep's hand-over inherits the slot of the step it fenced out)
  reads now where the minute's line has a slot free now, or where the day spaces the line slower
  than the minute and the minute's room between its reads is free (``early_tat``) - the day counted
  it when it was reserved, and the slot is left unused - else at its slot;
* **what Sume says tightens it for everyone**: ``RateLimit-Limit``/``-Policy`` teach the real
  limits, ``-Remaining``/``-Reset`` what is left of Sume's window (one read is kept in reserve at
  each window's end once Sume counts fewer left than our grants explain: another client spends
  the key), a 429's ``Retry-After`` pauses every read until then, a refused key pauses them all.

Times in Redis are clock milliseconds passed by the caller (:mod:`sume_poller.core.clock`), so tests
and benchmarks drive the limiter on a compressed clock. Python mirrors only the minute's
arithmetic (:func:`granted_per_window`, :func:`lane_size`, :func:`lane_burst`); a property test
holds the two to the same grants. While Redis is down :class:`LocalPacer` paces each container by
the same two rules, alone, at its share.
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
#: The day's reserve for jobs still to come: this share of the day budget, spread over the day.
DAY_FLOOR = 0.05
#: ``reserve_every`` of a budget whose day is a plain total, no reserve kept: the create budget.
#: Submissions it cannot take wait in their key's queue in arrival order, so a floor kept for
#: "jobs still to come" would only hold back the queue's head (later arrivals queue behind it).
NO_DAY_RESERVE = -1.0
MINUTE, DAY = 60.0, 86_400.0

BUDGET_LUA = f"local LANE_BURST, DAY_FLOOR = {LANE_BURST}, {DAY_FLOOR}\n" + """
local MINUTE, DAY, KEEP = 60000, 86400000, 172800000   -- ms; KEEP: the state outlives its last use by two days

-- The budget hash (KEYS[1]), clock ms and counts:
--   minute_tat        the minute's theoretical arrival time: the line's next slot plus the burst (GCRA)
--   day_used          grants counted in the current day window
--   day_next          grants reserved into the next day window
--   day_reset         when the current day window ends (Sume's RateLimit-Reset, else the UTC day's end)
--   pause_until       a 429's Retry-After: no slot before it
--   key_pause_until   Sume refused the key: no slot before it
--   sume_left         what Sume said is left in its window with the least left...
--   sume_reset        ...and when that window resets
--   other_until       another client was seen spending the key until then: one read kept in reserve
--   learned_minute    limits Sume's headers taught, when below the configured ones
--   learned_day
--   pending           pending jobs as fan-out counted them (the day reserve's scale)
--   oldest_pending    the oldest pending job's submission (clock s), as fan-out's last full round saw it
--   owed              reserved status reads whose place a result read took (they go to the back)
--   ahead_next        the slot of the next result read that takes a place
--   status_taken      status reads granted so far (a counter: sweeps weigh what chains spend)
--   early_tat         the next reserved read that may come before its slot while the day spaces the line
-- The sweeps' lane (KEYS[2], the same cluster slot):
--   open_until        the sweep function keeps it open (every tick)
--   share             per mille of each minute kept for list reads
--   minute_tat        the lane's own line, a minute's pace...
--   day_tat           ...and the day's: the lane's share of the day, evenly (the line gets the rest)
local FIELDS = {'minute_tat', 'day_used', 'day_next', 'day_reset', 'pause_until', 'key_pause_until', 'sume_left',
                'sume_reset', 'other_until', 'learned_minute', 'learned_day', 'pending', 'owed', 'ahead_next',
                'early_tat'}

local function load(key, fields)
  local values, state = redis.call('HMGET', key, unpack(fields)), {}
  for i, name in ipairs(fields) do state[name] = tonumber(values[i]) end
  return state
end

local function limit_of(configured, learned)
  local limit = tonumber(configured)
  if learned and learned > 0 and (limit == 0 or learned < limit) then limit = learned end
  return limit
end

-- reads of a minute kept for list reads while the sweeps' lane is open (share in per mille)
local function lane_size(limit, share)
  if share <= 0 or limit <= 0 then return 0 end
  return math.max(1, math.floor(limit * share / 1000))
end

-- the minute's interval and burst (ms) for chains and results: Python's granted_per_window
local function minute_window(limit, share)
  if limit <= 0 then return 0, 0 end
  local burst = math.floor(limit / 50)
  local spare = (limit >= 20) and 1 or 0
  local k = lane_size(limit, share)
  if k > 0 then k = k + 1 end
  local t = MINUTE / math.max(1, limit - burst - 2 - spare - k)
  return t, burst * t
end

-- the lane's: at most lane_size of a window (a minute, a day), a sweep's pages in a burst
local function lane_window(limit, share, span)
  local k = lane_size(limit, share)
  if k <= 0 then return 0, 0 end
  local b = math.min(LANE_BURST, k - 1)
  local t = span / math.max(1, k - b)
  return t, b * t
end

-- the current day window (rolled forward when it ended): used, next, reset
local function day_window(st, now)
  local used, nxt, reset = st.day_used or 0, st.day_next or 0, st.day_reset or 0
  if reset > now then return used, nxt, reset end
  if reset <= 0 then return 0, 0, (math.floor(now / DAY) + 1) * DAY end
  local windows = math.floor((now - reset) / DAY) + 1
  if windows == 1 then used, nxt = nxt, 0 else used, nxt = 0, 0 end
  return used, nxt, reset + windows * DAY
end

-- the day's reserve, grants per ms: every pending job's safety cadence and the floor for jobs to
-- come, never more than an evenly spent day keeps
local function reserve_rate(limit, pending, every_ms)
  if every_ms < 0 then return 0 end  -- no reserve (the create budget: its queue keeps what waits)
  if pending < 0 and every_ms > 0 then return limit / DAY end  -- not counted yet: an evenly spent day
  local rate = limit * DAY_FLOOR / DAY
  if every_ms > 0 and pending > 0 then rate = rate + pending / every_ms end
  return math.min(rate, limit / DAY)
end

-- the earliest time n more grants fit a day window: used + n <= limit - rate * (reset - t); nil: full
local function day_fits(limit, used, reset, rate, n)
  if used + n > limit then return nil end
  if rate <= 0 then return 0 end
  return reset - (limit - used - n) / rate
end

-- what the day has left to spend now, beyond its reserve (-1: no day limit)
local function day_left(limit, used, reset, rate, now)
  if limit <= 0 then return -1 end
  return math.max(0, math.floor(limit - used - rate * (reset - now)))
end

local function budget_take(key, lane_key, now, mode, max_wait, early, cfg_m, cfg_d, slot, count, every_ms)
  count = tonumber(count) or 1
  local st = load(key, FIELDS)
  local ln = load(lane_key, {'open_until', 'share', 'minute_tat', 'day_tat'})
  local share = ((ln.open_until or 0) > now) and (ln.share or 0) or 0
  local m_limit, d_limit = limit_of(cfg_m, st.learned_minute), limit_of(cfg_d, st.learned_day)
  local lane_day = d_limit  -- the whole day's limit, for the lane's share of it
  d_limit = d_limit - lane_size(d_limit, share)  -- the line's total: the day less the lane's share
  local used, nxt, reset = day_window(st, now)
  local pending = st.pending or -1
  local rate = reserve_rate(d_limit, pending, every_ms)
  local dl = day_left(d_limit, used, reset, rate, now)
  local paused = math.max(st.pause_until or 0, st.key_pause_until or 0)
  local key_paused = (st.key_pause_until or 0) > now
  local sume_left, sume_reset = st.sume_left, st.sume_reset or 0
  local exhausted = sume_left ~= nil and sume_left <= (((st.other_until or 0) > now) and 1 or 0) and now < sume_reset
  local owed = st.owed or 0

  local function answer(granted, wait)
    if granted == 1 and wait <= early then
      wait = 0  -- read now: one read less left in Sume's window
      if sume_left ~= nil and now < sume_reset then redis.call('HSET', key, 'sume_left', sume_left - 1) end
    end
    if granted == 1 then redis.call('PEXPIRE', key, KEEP) end
    return {granted, wait, pending, key_paused and 2 or (granted == 1 and 0 or 1), dl}
  end

  if mode == 'confirm' or mode == 'rconfirm' then  -- a reserved slot, counted when it was reserved
    if now >= paused and not exhausted and slot <= now + early then
      if mode == 'rconfirm' or owed <= 0 then return answer(1, 0) end
      redis.call('HSET', key, 'owed', owed - 1)  -- a result read took its place: to the back of the line
      owed = owed - 1
    elseif now >= paused and not exhausted and (mode == 'rconfirm' or owed <= 0) then
      -- before its slot (a sweep's hand-over inherits it): now, where the minute's line has a slot
      -- free now (the day counted this read when the slot was reserved; the slot is left unused),
      -- else at its own slot
      local t, tau = minute_window(m_limit, share)
      local tat = st.minute_tat or 0
      if t <= 0 or tat - tau <= now then
        if t > 0 then redis.call('HSET', key, 'minute_tat', math.max(tat, now) + t) end
        return answer(1, 0)
      end
      -- the line reserved ahead at the day's pace, slower than the minute's: early reads fill the
      -- minute's room between its reads (together no faster than the minute's pace)
      local day_t = (d_limit > 0 and rate > 0) and 1 / rate or 0
      local at = math.max(now, st.early_tat or 0)
      if day_t > t and at < slot then  -- the earlier of the two slots (the later one is left unused)
        redis.call('HSET', key, 'early_tat', at + 1 / (1 / t - 1 / day_t))
        return answer(1, at - now)
      end
      return answer(1, slot - now)
    end
    mode = 'take'
  end
  if mode == 'list' and share <= 0 then mode = 'ahead' end  -- no lane open: ahead of the line
  local lane = (mode == 'list')
  local tat, t, tau
  if lane then
    tat, t, tau = ln.minute_tat or 0, lane_window(m_limit, share, MINUTE)
  else
    tat, t, tau = st.minute_tat or 0, minute_window(m_limit, share)
  end

  -- How far the line is reserved: by the minute's pace, or by the day's once its reserve binds.
  local day_t = (d_limit > 0 and rate > 0) and 1 / rate or 0
  local minute_full = t > 0 and tat - tau - t > now
  local day_full = day_t > 0 and (day_fits(d_limit, used, reset, rate, 1) or math.huge) > now + day_t
  local spare = (m_limit == 0 or m_limit >= 20) and (d_limit <= 0 or d_limit >= 20)
  if mode == 'ahead' and (minute_full or day_full) and spare and owed < 1 then
    -- the line is reserved further than an interval ahead: take the place of its next status read
    -- (already counted in the day), spaced like that line; one place at a time
    local step = math.max(minute_full and t or 0, day_full and day_t or 0)
    local at = math.max(now + step, st.ahead_next or 0, paused)
    if exhausted and at < sume_reset then at = sume_reset end
    if max_wait >= 0 and at - now > max_wait then return answer(0, at - now) end
    redis.call('HSET', key, 'owed', owed + 1, 'ahead_next', at + step)
    return answer(1, at - now)
  end

  -- the minute's slot (an 'ahead' read one interval before the line), then the day's
  local ahead = (mode == 'ahead') and 1 or 0
  local at = math.max(now, paused)
  if t > 0 then at = math.max(at, tat - tau - ahead * t + (count - 1) * t) end
  if exhausted and at < sume_reset then at = sume_reset end
  local in_next, lane_t = false, 0
  if lane then  -- the lane's share of the day, at its own even pace
    local lane_tau
    lane_t, lane_tau = lane_window(lane_day, share, DAY)
    if lane_t > 0 then at = math.max(at, (ln.day_tat or 0) - lane_tau + (count - 1) * lane_t) end
  elseif d_limit > 0 then
    local fits = day_fits(d_limit, used, reset, rate, count)
    if fits == nil or math.max(at, fits) >= reset then  -- this window is spent: the next one's
      local next_fits = day_fits(d_limit, nxt, reset + DAY, rate, count)
      if next_fits == nil then return answer(0, reset + DAY - now) end  -- both full: never past the total
      at, in_next = math.max(at, reset, next_fits), true
    else
      at = math.max(at, fits)
    end
  end
  local wait = at - now
  if mode == 'peek' then return {0, wait, pending, key_paused and 2 or 0, dl} end
  if max_wait >= 0 and wait > max_wait then return answer(0, wait) end
  if t > 0 then
    redis.call('HSET', lane and lane_key or key, 'minute_tat', math.max(tat, at) + count * t)
  end
  if lane_t > 0 then
    redis.call('HSET', lane_key, 'day_tat', math.max(ln.day_tat or 0, at) + count * lane_t)
  elseif d_limit > 0 and not lane then
    if in_next then nxt = nxt + count else used = used + count end
    redis.call('HSET', key, 'day_used', used, 'day_next', nxt, 'day_reset', reset)
  end
  if mode == 'take' then redis.call('HINCRBY', key, 'status_taken', count) end
  return answer(1, wait)
end
"""

#: What Sume's reply said, by name (the feedback script's ARGV): ``window`` is "m", "d" or "" (which
#: window the Limit/Remaining/Reset triple describes); -1 for what the reply did not say.
FEEDBACK_ARGS = ("now_ms", "window", "remaining", "reset_ms", "retry_after_ms", "learned_minute", "learned_day",
                 "per_minute", "per_day")

FEEDBACK_LUA = BUDGET_LUA + lua_locals(FEEDBACK_ARGS) + """
local key, lane_key, now = KEYS[1], KEYS[2], tonumber(now_ms)
remaining, reset_ms, retry_after_ms = tonumber(remaining), tonumber(reset_ms), tonumber(retry_after_ms)
if tonumber(learned_minute) > 0 then redis.call('HSET', key, 'learned_minute', learned_minute) end
if tonumber(learned_day) > 0 then redis.call('HSET', key, 'learned_day', learned_day) end
local st = load(key, FIELDS)
if retry_after_ms >= 0 then
  redis.call('HSET', key, 'pause_until', math.max(st.pause_until or 0, now + retry_after_ms))
end
if window ~= '' and remaining >= 0 then
  local span = (window == 'm') and MINUTE or DAY
  if st.sume_left ~= nil and now < (st.sume_reset or 0) and now + reset_ms < st.sume_reset + span / 2 then
    -- the same Sume window: what is left only goes down (replies of a batch arrive out of order)
    if remaining < st.sume_left then
      -- Sume counts fewer left than our own grants allow: another client spends this key
      redis.call('HSET', key, 'other_until', now + 600000, 'sume_left', remaining)
    end
  else
    redis.call('HSET', key, 'sume_left', remaining, 'sume_reset', now + reset_ms)
  end
  if window == 'm' then  -- what is left must last the minute: the line starts no earlier than that
    local ln = load(lane_key, {'open_until', 'share'})
    local share = ((ln.open_until or 0) > now) and (ln.share or 0) or 0
    local t, tau = minute_window(limit_of(per_minute, st.learned_minute), share)
    if t > 0 then
      redis.call('HSET', key, 'minute_tat', math.max(st.minute_tat or 0, now + reset_ms + tau - remaining * t))
    end
  else  -- Sume's day window: when it ends, and how much of it is spent (by us and anyone else)
    local limit = limit_of(per_day, st.learned_day)
    local used, nxt = day_window(st, now)
    local reset = now + reset_ms
    if limit > 0 then used = math.max(used, limit - remaining) end
    redis.call('HSET', key, 'day_used', used, 'day_next', nxt, 'day_reset', reset)
  end
end
redis.call('PEXPIRE', key, KEEP)
return 1
"""

#: A take's arguments (``budget_take``'s parameters after the keys; the take script's ARGV).
TAKE_ARGS = ("now_ms", "mode", "max_wait_ms", "early_ms", "per_minute", "per_day", "slot_ms", "count", "every_ms")

TAKE_LUA = BUDGET_LUA + lua_locals(TAKE_ARGS) + """
return budget_take(KEYS[1], KEYS[2], tonumber(now_ms), mode, tonumber(max_wait_ms), tonumber(early_ms), per_minute,
                   per_day, tonumber(slot_ms), tonumber(count), tonumber(every_ms))
"""


def lane_size(limit: int, share: float) -> int:
    """Reads of a minute the sweeps' lane keeps (the Lua ``lane_size``; ``share`` a fraction)."""
    permille = round(share * 1000)
    return 0 if permille <= 0 or limit <= 0 else max(1, limit * permille // 1000)


def lane_burst(limit: int, share: float) -> int:
    """List reads the sweeps' lane grants at once (the Lua ``lane_window``'s burst, plus one)."""
    k = lane_size(limit, share)
    return min(LANE_BURST, k - 1) + 1 if k else 0


def granted_per_window(limit: int, share: float = 0.0) -> int:
    """Grants per minute to chains and result reads in a sustained overload, with the sweeps'
    lane open at ``share`` or not (the Lua ``minute_window``)."""
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
    """One budget (reads or creates): its hash and its lane's in Redis, in clock time. ``key``
    carries a hash tag (``...{reads}``) so that in cluster mode the lane (``key + ":lane"``) lives
    in the same slot. ``reserve_every``: the day reserve's safety cadence per pending job (clock
    seconds; 0: none, the floor for jobs still to come alone; :data:`NO_DAY_RESERVE`: no reserve at
    all, the day a plain total)."""

    def __init__(self, client: Any, key: str, per_minute: int, per_day: int, now: Callable[[], float],
                 early: float = 0.5, real_per_clock: float = 1.0, reserve_every: float = 900.0) -> None:
        self._r = client
        self.key = key
        self.lane_key = key + ":lane"
        self.per_minute = per_minute
        self.per_day = per_day
        self._now = now
        #: A slot this close (clock seconds) counts as now.
        self.early = early
        self.real_per_clock = real_per_clock
        self.reserve_every = reserve_every
        self._take = client.register_script(TAKE_LUA)
        self._feedback = client.register_script(FEEDBACK_LUA)

    @property
    def keys(self) -> list[str]:
        return [self.key, self.lane_key]

    def clock_to_real(self, seconds: float) -> float:
        """Real seconds that ``seconds`` of the limiter's clock take."""
        return seconds * self.real_per_clock

    @property
    def unlimited(self) -> bool:
        return self.per_minute == 0 and self.per_day == 0

    @property
    def rate(self) -> float:
        """Grants per clock second the configured budget sustains (inf when unlimited): the
        minute's pace, or an evenly spent day where that is slower."""
        rates = [granted_per_window(self.per_minute) / MINUTE] if self.per_minute > 0 else []
        rates += [self.per_day / DAY] if self.per_day > 0 else []
        return min(rates) if rates else math.inf

    def take_values(self, mode: str = "take", max_wait: float = math.inf, slot: float = 0.0,
                    count: int = 1) -> dict[str, Any]:
        """A take's arguments by name (:data:`TAKE_ARGS`; the gate's script takes them too)."""
        return {"now_ms": int(self._now() * 1000), "mode": mode,
                "max_wait_ms": -1 if math.isinf(max_wait) else int(max_wait * 1000),
                "early_ms": int(self.early * 1000), "per_minute": self.per_minute, "per_day": self.per_day,
                "slot_ms": int(slot * 1000), "count": count, "every_ms": int(self.reserve_every * 1000)}

    def take(self, mode: str = "take", max_wait: float = math.inf, slot: float = 0.0, count: int = 1) -> Grant:
        """Reserve the next slot (``mode``: "take", "confirm" a status read's slot at ``slot``,
        "rconfirm" a result read's, "ahead" of the status reads for a result, "list" in the
        sweeps' lane (ahead of the line if it is closed), "spare": a list read from the line, as
        "take" but not counted as a status read, or "peek": how far the next slot is,
        reserving nothing) - or ``count`` slots at once (a sweep's pages). One round trip."""
        if self.unlimited:
            return Grant(True, 0.0)
        return Grant.from_reply(self._take(keys=self.keys, args=script_args(
            TAKE_ARGS, self.take_values(mode, max_wait, slot, count))))

    def feedback(self, info: RateInfo) -> None:
        """Tell the limiter what Sume's reply said (one round trip)."""
        def ms(seconds: float | None) -> int:
            return -1 if seconds is None else int(seconds * 1000)
        self._feedback(keys=self.keys, args=script_args(FEEDBACK_ARGS, {
            "now_ms": int(self._now() * 1000), "window": info.window(),
            "remaining": -1 if info.remaining is None else info.remaining, "reset_ms": ms(info.reset),
            "retry_after_ms": ms(info.retry_after), "learned_minute": info.learned(60) or -1,
            "learned_day": info.learned(86_400) or -1, "per_minute": self.per_minute, "per_day": self.per_day}))

    def lane_burst(self, share: float) -> int:
        """List reads the sweeps' lane grants at once under the configured limits."""
        bursts = [lane_burst(n, share) for n in (self.per_minute, self.per_day) if n > 0]
        return min(bursts) if bursts else LANE_BURST + 1

    def lane_rate(self, share: float) -> float:
        """List reads per clock second the sweeps' lane sustains (its minute's share, or its share
        of the day spread evenly where that is slower; inf when unlimited)."""
        rates = [lane_size(n, share) / span for n, span in ((self.per_minute, MINUTE), (self.per_day, DAY)) if n > 0]
        return min(rates) if rates else math.inf

    def spare(self, count: int, share: float, state: dict[str, float] | None = None) -> bool:
        """Whether ``count`` more reads leave the line (the day less the sweeps' lane at ``share``)
        at least what an evenly spent rest of the day would keep: reads the line is not spending,
        which a sweep may borrow (mode "spare") beyond its lane. Always, without a day limit."""
        st = self.state() if state is None else state
        limit = int(min(self.per_day, st.get("learned_day") or self.per_day))
        if limit <= 0:
            return True
        now = self._now()
        line = limit - lane_size(limit, share)
        reset, used = st.get("day_reset", 0.0) / 1000, st.get("day_used", 0.0)
        if reset <= 0:  # never counted: the UTC day
            reset, used = (math.floor(now / DAY) + 1) * DAY, 0.0
        elif reset <= now:  # the window rolled (the Lua day_window): what was reserved into the next
            windows = math.floor((now - reset) / DAY) + 1
            reset, used = reset + windows * DAY, st.get("day_next", 0.0) if windows == 1 else 0.0
        return line - used - count >= line * (reset - now) / DAY

    def open_lane(self, share: float, until: float) -> None:
        """Keep ``share`` of each minute for list reads (mode "list") until clock time ``until``;
        the sweep function calls it whenever it runs. One round trip."""
        self._r.hset(self.lane_key, mapping={"open_until": int(until * 1000), "share": round(share * 1000)})

    def pause_key(self, seconds: float) -> None:
        """Sume refused the key: no read until then (rotation resumes them)."""
        self._r.hset(self.key, "key_pause_until", int((self._now() + seconds) * 1000))

    def set_pending(self, count: int) -> None:
        self._r.hset(self.key, "pending", count)

    def set_oldest_pending(self, submitted: float) -> None:
        """The oldest pending job's submission (fan-out, on each full round of the pending index):
        sweeps page back no further."""
        self._r.hset(self.key, "oldest_pending", submitted)

    def state(self) -> dict[str, float]:
        """The budget's hash, by the field names of :data:`BUDGET_LUA`'s table."""
        return {str(k): float(v) for k, v in self._r.hgetall(self.key).items()}


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

"""The shared Sume budget: one limiter in Redis for every poller (reads) and submit (creates).

Sume limits each API key per minute and per day (reads 120/min and 10,000/day, creates 10/min
and 300/day by its docs). One Lua script decides every request, atomically, on the budget's hash
(and the sweeps' lane, a hash of its own in the same cluster slot): ``budget_take.lua`` on the
library ``budget.lua`` (whose state is the table at its top), by the :class:`Mode` the request names -
each mode a function of its own in the library's ``MODES``; ``budget_feedback.lua`` takes what Sume's
replies say. The rules:

* **no 60 seconds ever hold more than the minute's limit** - whether Sume counts fixed minutes or
  the 60 s before each request (its contract does not say): every read granted *now* goes into a
  *read log* (counts per 0.25 s of the clock over the last :data:`SLIDE`, 61 s: a second for a
  read to reach Sume after its grant), and a read is granted now only where the log's span then
  holds at most ``L`` - else it waits for the log's room (a reserved read comes back then; the
  line's ``early`` tolerance never applies to the log). A take Redis runs after another is counted
  no earlier than it, though its caller's clock was behind (:attr:`Grant.logged_at`). This is
  the guarantee; every rule below only decides who reads when, and none can pass it;
* **the minute is a pace** (GCRA, the generic cell rate algorithm, with reservations): a request
  gets the earliest *slot* the line allows; one that cannot read now learns its slot and re-queues
  its message for that time (keeping its lease), so waiting jobs never wake up together and retry
  in a herd. The line is spaced ``L`` over :data:`PACE` (62.25 s: the log's span, a bucket, and a
  second for a reserved read that comes back late to its slot, as SQS counts delays in whole
  seconds), so a read on time never waits for the log: ``0.964 L`` a minute in a sustained
  overload (:func:`granted_per_window`), with a burst of ``L // 50``. A read ``ahead`` of the line,
  reads that come back late and bunch, the sweeps' pages at once: where they would pass the limit,
  the log holds them back;
* **the day is a total, not a pace**: reads run at the minute's pace while what is left of the
  day window covers a reserve for the rest of it - the safety cadence of every pending job (one
  read per ``reserve_every`` seconds each) plus a floor for jobs still to come (``DAY_FLOOR`` of
  the day's budget, spread over it) - never more than an evenly spent day would keep. Once the
  reserve binds, reads are spaced so that what is left lasts the day: ``used + 1 <= limit -
  rate * (reset - t)``. The day window ends where Sume's ``RateLimit-Reset`` says when a reply
  describes it, else at the UTC day's end; the day total is never exceeded (a grant that does not
  fit is a slot in the next window);
* **the sweeps' lane**: while the sweep function keeps it open (:meth:`Budget.open_lane`), a share
  ``k`` of each minute (``SweepReadSharePercent``; never the whole limit) is kept for ``list``
  reads - the line of chain and result reads is spaced for ``k`` fewer grants, and list reads have
  their own GCRA allowing ``k`` a minute with up to ``LANE_BURST + 1`` at once (a sweep's pages,
  read back to back: the log counts them at the take); the lane closes by itself when sweeps stop;
* **a result read goes first**: while status reads are reserved further ahead than one interval, a
  result read of a job Sume finished takes the place of the next reserved one (whose ``confirm``
  then sends it to the back of the line), at any limit; one place at a time, so a place nobody
  gives up costs at most one read the log holds back;
* a request may refuse a slot further than ``max_wait`` away (the schedule's ordering) - nothing is
  then reserved; a reserved slot is checked again when its message comes back (``confirm``); one
  that comes back before its slot (a sweep's hand-over inherits the slot of the step it fenced out)
  reads now where the minute's line has a slot free now, or where the day spaces the line slower
  than the minute and the minute's room between its reads is free (``early_tat``) - the day counted
  it when it was reserved, and the slot is left unused - else at its slot;
* **what Sume says tightens it for everyone**: ``RateLimit-Limit``/``-Policy`` teach the real
  limits, ``-Remaining``/``-Reset`` what is left of Sume's window and when it next grows - a fixed
  window's end, or a sliding one's oldest request leaving it: either way no read before then once
  none is left (one is kept in reserve once Sume counts fewer left than our grants explain: another
  client spends the key - and what it spent of Sume's last minute, Sume's count less the read log's,
  is kept out of the log); a day window's reply sets how much of it is spent, so a day that slides
  is followed reply by reply; a 429's ``Retry-After`` pauses every read until then, a refused key
  pauses them all.

Times in Redis are clock milliseconds passed by the caller (:mod:`sume_poller.core.clock`), so tests
and benchmarks drive the limiter on a compressed clock. Python mirrors only the minute's
arithmetic (:func:`granted_per_window`, :func:`lane_size`, :func:`lane_burst`); a property test
holds the two to the same grants, and another holds random streams of every mode to the limit in
every 60 s. While Redis is down :class:`~sume_poller.limits.pacer.LocalPacer` paces
each container by the same two rules, alone, at its share. Fan-out posts the pending count the day's
reserve scales with in the same hash (:mod:`sume_poller.limits.pending`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from ..core.values import value
from .pending import PendingMailbox
from .redisconn import lua_file, lua_script

#: List reads the sweeps' lane grants at once beyond the first (a sweep's pages).
LANE_BURST = 8
#: The day's reserve for jobs still to come: this share of the day budget, spread over the day.
DAY_FLOOR = 0.05
#: ``reserve_every`` of a budget whose day is a plain total, no reserve kept: the create budget.
#: Submissions it cannot take wait in their key's queue in arrival order, so a floor kept for
#: "jobs still to come" would only hold back the queue's head (later arrivals queue behind it).
NO_DAY_RESERVE = -1.0
MINUTE, DAY = 60.0, 86_400.0
#: The read log's span (clock seconds): Sume's minute, and a second more for a read to reach Sume
#: after its grant (the request's latency, two containers' clocks). No span this long ever holds
#: more reads granted now than the minute's limit, so no minute of Sume's does, fixed or sliding.
SLIDE = MINUTE + 1.0
#: The read log counts reads by buckets of this much clock time (so it stays small at any limit).
LOG_BUCKET = 0.25
#: The line's pace: the limit over this much clock time - the log's span, a bucket, and a second for a
#: reserved read that comes back late to its slot (SQS counts delays in whole seconds): a line read
#: on time never waits for the log.
PACE = SLIDE + LOG_BUCKET + 1.0

#: budget.lua, the library the budget's scripts share, after the constants Python's mirror shares.
BUDGET_LUA = (f"local LANE_BURST, DAY_FLOOR, SLIDE_MS, BUCKET_MS, PACE_MS = {LANE_BURST}, {DAY_FLOOR}, "
              f"{round(SLIDE * 1000)}, {round(LOG_BUCKET * 1000)}, {round(PACE * 1000)}\n"
              + lua_file(__package__, "budget.lua"))
#: The take (:meth:`Budget.take`): a read slot, by :class:`Mode`.
TAKE = lua_script(__package__, "budget_take.lua", BUDGET_LUA)
#: What Sume's reply said (:meth:`Budget.feedback`).
FEEDBACK = lua_script(__package__, "budget_feedback.lua", BUDGET_LUA)


class Mode(StrEnum):
    """What a take asks of the limiter. The value is what the scripts' ``mode`` argument carries;
    budget.lua's ``MODES`` has a function for each but :attr:`NONE`, which the gate answers itself."""

    #: A status read: the next slot in the line (counted in ``status_taken``). Sent by chains.
    TAKE = "take"
    #: A status read at the slot it reserved earlier (``slot``); to the back of the line if a
    #: result read took its place, the key is paused or Sume's window is spent. Sent by chains.
    CONFIRM = "confirm"
    #: A result read at the slot it reserved earlier; keeps its place. Sent by chains.
    RCONFIRM = "rconfirm"
    #: A job known to be finished (its result, or the status read that confirms a list's or
    #: webhook's word; the key check): before the status reads. Sent by chains and the key check.
    AHEAD = "ahead"
    #: A sweep's list read in the sweeps' lane (ahead of the line while the lane is closed).
    LIST = "list"
    #: A sweep's list read from the line, where the line spends less than an evenly spent day
    #: (not counted as a status read).
    SPARE = "spare"
    #: How far the next slot is; nothing reserved. Sent by fan-out, submit and the cold-start probe.
    PEEK = "peek"
    #: No slot (a hop): the gate claims the lease alone.
    NONE = "none"


def lane_size(limit: int, share: float) -> int:
    """Reads of a minute the sweeps' lane keeps (the Lua ``lane_size``; ``share`` a fraction): never
    the whole limit."""
    permille = round(share * 1000)
    return 0 if permille <= 0 or limit <= 0 else min(max(1, limit * permille // 1000), limit - 1)


def lane_burst(limit: int, share: float) -> int:
    """List reads the sweeps' lane grants at once (the Lua ``lane_window``'s burst, plus one)."""
    k = lane_size(limit, share)
    return min(LANE_BURST, k - 1) + 1 if k else 0


def granted_per_window(limit: int, share: float = 0.0) -> float:
    """Grants per minute to chains and result reads in a sustained overload, with the sweeps'
    lane open at ``share`` or not (the Lua ``minute_window``): the limit less the lane's, over
    :data:`PACE` (0.964 of the limit without the lane)."""
    return max(1, limit - lane_size(limit, share)) * MINUTE / PACE


@value
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
    #: A read granted now: the limiter's clock time its read log counts it at (clock seconds) - the
    #: caller's ``now``, or the log's newest bucket where Redis granted a later-stamped read first.
    logged_at: float | None = None

    @property
    def now(self) -> bool:
        return self.granted and self.wait <= 0

    @classmethod
    def from_reply(cls, reply: list[Any]) -> Grant:
        granted, wait_ms, pending, reason = (int(x) for x in reply[:4])
        day_left = int(reply[4]) if len(reply) > 4 and int(reply[4]) >= 0 else None
        logged_at = int(reply[5]) / 1000 if len(reply) > 5 and int(reply[5]) >= 0 else None
        return cls(bool(granted), max(0.0, wait_ms / 1000), None if pending < 0 else pending, reason == 2, day_left,
                   logged_at)


@value
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
        self._take = client.register_script(TAKE.source)
        self._feedback = client.register_script(FEEDBACK.source)
        #: Fan-out's count of pending jobs, posted in this budget's hash (the day reserve's scale).
        self.mailbox = PendingMailbox(client, key)

    @property
    def keys(self) -> list[str]:
        return [self.key, self.lane_key]

    def now(self) -> float:
        """The limiter's clock (clock seconds)."""
        return self._now()

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

    def take_values(self, mode: Mode = Mode.TAKE, max_wait: float = math.inf, slot: float = 0.0,
                    count: int = 1) -> dict[str, Any]:
        """A take's arguments by name (``TAKE.args``; the gate's script takes them too).
        Raises ``ValueError`` for a mode that is not a :class:`Mode`."""
        return {"now_ms": int(self._now() * 1000), "mode": Mode(mode).value,
                "max_wait_ms": -1 if math.isinf(max_wait) else int(max_wait * 1000),
                "early_ms": int(self.early * 1000), "per_minute": self.per_minute, "per_day": self.per_day,
                "slot_ms": int(slot * 1000), "count": count, "every_ms": int(self.reserve_every * 1000)}

    def take(self, mode: Mode = Mode.TAKE, max_wait: float = math.inf, slot: float = 0.0, count: int = 1) -> Grant:
        """Reserve the next slot as ``mode`` asks (:class:`Mode`; ``slot``: the one a confirm
        reserved earlier) - or ``count`` slots at once (a sweep's pages). One round trip."""
        if Mode(mode) is Mode.NONE:
            raise ValueError("mode none asks for no slot: only the gate's claim takes it")
        if self.unlimited:
            return Grant(True, 0.0)
        return Grant.from_reply(self._take(keys=self.keys, args=TAKE.argv(self.take_values(mode, max_wait, slot,
                                                                                            count))))

    def feedback(self, info: RateInfo) -> None:
        """Tell the limiter what Sume's reply said (one round trip)."""
        def ms(seconds: float | None) -> int:
            return -1 if seconds is None else int(seconds * 1000)
        self._feedback(keys=self.keys, args=FEEDBACK.argv({
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
        which a sweep may borrow (:attr:`Mode.SPARE`) beyond its lane. Always, without a day limit.
        A preview from ``state`` (a sweep's, read once a tick): the take checks it again, atomically."""
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

    def state(self) -> dict[str, float]:
        """The budget's hash, by the field names of budget.lua's table (its counts: the read log aside),
        from a client that decodes replies or one that does not."""
        fields = {k.decode() if isinstance(k, bytes) else str(k): v for k, v in self._r.hgetall(self.key).items()}
        fields.pop("read_log", None)
        return {k: float(v) for k, v in fields.items()}

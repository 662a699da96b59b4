"""The shared budget (budget.py) and the gate (gate.py) on a real redis-server, on a virtual clock:
both windows at once, reservations, feedback from Sume's headers, pauses, concurrency."""

from __future__ import annotations

import itertools
import math
import threading
from collections import Counter

import pytest
import redis

from sume_poller.limits.budget import (
    BUDGET_LUA,
    FEEDBACK,
    TAKE,
    Budget,
    Grant,
    Mode,
    RateInfo,
    granted_per_window,
)
from sume_poller.limits.gate import GATE, ReadGate
from sume_poller.limits.lease import CLAIM_ARGS, ChainStep, Claim, LeaseStore, new_nonce, new_token
from sume_poller.limits.pacer import LocalPacer

pytestmark = pytest.mark.integration


class VirtualClock:
    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.t = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.t

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.t += seconds


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


def budget(rdb: redis.Redis, clock: VirtualClock, per_minute: int = 120, per_day: int = 0) -> Budget:
    return Budget(rdb, "t:budget:reads", per_minute, per_day, clock, early=0.0)


def grants_per_window(times: list[float], window: float) -> Counter[int]:
    return Counter(int(t // window) for t in times)




def most_in_a_window(times: list[float], span: float) -> int:
    ordered = sorted(times)
    return max(sum(1 for t in ordered[i:] if t < start + span) for i, start in enumerate(ordered))


def drive(b: Budget, clock: VirtualClock, seconds: float, step: float = 0.05) -> list[float]:
    """Demand far above the budget: a reader asks every ``step`` seconds and reads when granted now.
    What ``b.take(max_wait=0.0)`` at each of those instants does, in pipelined round trips of 1,000 (each
    take names its clock time; none depends on the answer before it): tens of thousands of takes one by
    one took up to a minute a test on a busy machine."""
    reads: list[float] = []
    end = clock() + seconds
    b._r.script_load(TAKE.source)
    while clock() < end:
        pipe, times = b._r.pipeline(transaction=False), []
        while clock() < end and len(times) < 1_000:
            times.append(clock())
            pipe.evalsha(b._take.sha, len(b.keys), *b.keys, *TAKE.argv(b.take_values(max_wait=0.0)))
            clock.advance(step)
        reads += [t for t, reply in zip(times, pipe.execute(), strict=True) if Grant.from_reply(reply).now]
    return reads


def test_sustained_demand_fills_a_minute_window_but_never_overfills_it(rdb: redis.Redis, clock: VirtualClock) -> None:
    b = budget(rdb, clock, per_minute=120)
    windows = grants_per_window(drive(b, clock, 600), 60)
    full = [n for w, n in windows.items() if w not in (min(windows), max(windows))]
    assert max(windows.values()) <= 120
    assert min(full) >= 0.95 * 120, windows


@pytest.mark.parametrize("limit", [8, 20, 120])
def test_reads_ahead_of_the_line_never_overfill_a_window(rdb: redis.Redis, clock: VirtualClock, limit: int) -> None:
    """Result fetches go ahead of reserved status reads (taking their place), mixed with
    reservations each confirmed at its time, as the poller does: still never more than the limit
    in a window (every window alignment), and the budget is used."""
    b = budget(rdb, clock, per_minute=limit)
    reads: list[float] = []
    reserved: list[tuple[float, str]] = []  # (slot, "confirm" a status read's or "rconfirm" a result read's)
    for i in range(int(600 / 0.25)):
        now = clock()
        for slot, mode in [r for r in reserved if r[0] <= now]:
            reserved.remove((slot, mode))
            grant = b.take(mode, slot=slot)
            if grant.now:
                reads.append(now)
            else:  # its place was taken: the back of the line
                reserved.append((now + grant.wait, mode))
        mode = "ahead" if i % 3 == 0 else "take"
        grant = b.take(mode)
        if grant.granted:
            if grant.now:
                reads.append(now)
            else:
                reserved.append((now + grant.wait, "rconfirm" if mode == "ahead" else "confirm"))
        clock.advance(0.25)
    assert most_in_a_window(reads, 60) <= limit
    assert most_in_a_window(reads, 60) >= limit - 4  # and the budget is used


def test_a_result_read_takes_the_place_of_the_next_reserved_status_read(rdb: redis.Redis, clock: VirtualClock) -> None:
    b = budget(rdb, clock, per_minute=61)  # a slot every 62.25/61 s (granted_per_window: the limit over PACE)
    slots = [clock() + b.take().wait for _ in range(120)]  # status reads reserved two minutes ahead
    result = b.take("ahead")
    assert result.granted and result.wait == pytest.approx(60 / granted_per_window(61), abs=0.01)  # not at the end
    clock.advance(result.wait)
    assert b.take("rconfirm", slot=clock()).now  # its own slot is its own
    first = [s for s in slots if s <= clock()][-1]
    bumped = b.take("confirm", slot=first)
    assert bumped.granted and bumped.wait > 100  # the status read it replaced goes to the back
    later = next(s for s in slots if s > clock())
    clock.advance(later - clock())
    assert b.take("confirm", slot=later).now  # the next one keeps its slot


def test_a_result_read_goes_first_at_a_small_limit_too(rdb: redis.Redis, clock: VirtualClock) -> None:
    """At 5 reads a minute a line reserved 10 minutes ahead does not hold a finished job's result
    read back: it takes the next status read's place (the read log keeps the place nobody gives up
    from ever passing the limit); one place at a time, then the end of the line."""
    b = budget(rdb, clock, per_minute=5)
    slots = [clock() + b.take().wait for _ in range(50)]
    interval = 60 / granted_per_window(5)
    first = b.take("ahead")
    assert first.granted and first.wait == pytest.approx(interval, abs=0.01)
    second = b.take("ahead")  # the first has not given its place back yet: an interval before the next free slot
    assert second.granted and second.wait == pytest.approx(slots[-1] - clock(), abs=0.01)


def test_a_result_read_before_its_reserved_slot_reads_now_where_the_minute_has_room(rdb: redis.Redis,
                                                                                    clock: VirtualClock) -> None:
    """A sweep's hand-over inherits the slot of the step it fenced out (counted in the day then):
    it reads at once where the minute's line has a slot free now, or - where the day spaces the line
    slower than the minute - in the minute's room between the line's reads, counting nothing more
    in the day; a line the minute paces keeps it at its own slot."""
    b = budget(rdb, clock, per_minute=61, per_day=10_000)
    for _ in range(4):
        b.take()  # a few status reads reserved, the last seconds ahead
    clock.advance(30)  # the line's reads have passed: its next minute slot is free now
    used = b.state()["day_used"]
    far = clock() + 600
    assert b.take("rconfirm", slot=far).now and b.state()["day_used"] == used
    for _ in range(120):  # the line reserved ahead, spaced by the day (10,000 a day: one per 9.6 s)
        b.take()
    early = [b.take("rconfirm", slot=far) for _ in range(5)]
    assert all(g.granted for g in early) and early[0].now and b.state()["day_used"] == used + 120
    gaps = [later.wait - sooner.wait for sooner, later in itertools.pairwise(early)]
    minute, day = 60 / granted_per_window(61), 86_400 / 10_000  # the line's paces (no lane open)
    assert all(g == pytest.approx(1 / (1 / minute - 1 / day), abs=0.01) for g in gaps)  # together: the minute's pace
    paced = budget(rdb, clock, per_minute=61)  # no day: the minute alone spaces the line
    for _ in range(120):
        paced.take()
    kept = paced.take("rconfirm", slot=clock() + 600)
    assert kept.granted and kept.wait == pytest.approx(600, abs=0.01)


def test_the_sweeps_lane_reads_now_however_far_chains_reserved_and_the_window_still_holds(
        rdb: redis.Redis, clock: VirtualClock) -> None:
    b = budget(rdb, clock, per_minute=120)
    b.open_lane(0.1, clock() + 86_400)  # 12 of each minute's 120 kept for list reads
    reads: list[float] = []
    reserved: list[float] = []
    lane: list[float] = []
    sweeps = 0
    for i in range(int(600 / 0.25)):
        now = clock()
        reads += [at for at in reserved if at <= now]
        reserved = [at for at in reserved if at > now]
        grant = b.take()  # chains reserve whatever is free, however far: the line grows for minutes
        if grant.granted:
            (reads if grant.now else reserved).append(now + grant.wait)
        if i % 60 == 0 and b.take("list", max_wait=0.0, count=4).now:  # a sweep asks every 15 s for 4 reads
            lane += [now] * 4
            sweeps += 1
        clock.advance(0.25)
    assert reserved and max(reserved) - clock() > 120  # chains' line is minutes long...
    assert sweeps >= 10 and len(lane) <= 4 * (600 // 60) + 12  # ...yet a sweep a minute reads at once
    assert most_in_a_window(reads + lane, 60) <= 120  # and together never more than the limit
    full = grants_per_window(reads, 60)
    whole = [n for w, n in full.items() if w not in (min(full), max(full))]
    assert min(whole) == math.floor(granted_per_window(120, 0.1))


def test_with_the_lane_closed_a_list_read_only_goes_ahead_of_the_line(rdb: redis.Redis, clock: VirtualClock) -> None:
    b = budget(rdb, clock, per_minute=120)
    for _ in range(400):
        b.take()
    assert not b.take("list", max_wait=0.0).granted  # ahead of a minutes-long line, but not now
    b.open_lane(0.1, clock() + 60)
    assert b.take("list", max_wait=0.0, count=4).now
    clock.advance(61)  # the lane closed again
    assert not b.take("list", max_wait=0.0).granted


def test_the_limiter_counts_the_status_reads_it_grants_and_no_other(rdb: redis.Redis, clock: VirtualClock) -> None:
    """Sweeps weigh what chains spend by this counter: status reads granted (now or reserved), not
    result reads, list reads, peeks or refusals."""
    b = budget(rdb, clock, per_minute=61)
    b.open_lane(0.1, clock() + 86_400)
    for _ in range(5):
        b.take()
    b.take("ahead")
    b.take("list", max_wait=0.0, count=2)
    b.take("peek")
    assert not b.take(max_wait=0.0).granted  # refused: the line is reserved ahead
    assert b.state()["status_taken"] == 5
    assert b.lane_rate(0.1) == pytest.approx(6 / 60)  # 6 of each minute's 61 kept for list reads
    assert budget(rdb, clock, per_minute=120, per_day=10_000).lane_rate(0.1) == pytest.approx(1_000 / 86_400)


def test_the_line_spares_reads_for_sweeps_only_while_it_spends_less_than_an_evenly_spent_day(
        rdb: redis.Redis, clock: VirtualClock) -> None:
    clock.advance(-(clock() % 86_400) + 18 * 3_600)  # 18:00: an even day keeps a quarter of the line
    b = budget(rdb, clock, per_minute=120, per_day=10_000)
    line = 10_000 - 1_000  # the day less the sweeps' lane (10 %)
    rdb.hset(b.key, mapping={"day_used": line * 3 // 4 - 10, "day_reset": int((clock() + 6 * 3_600) * 1000)})
    assert b.spare(10, 0.1) and not b.spare(11, 0.1)  # 10 under the even line
    assert b.take("spare", max_wait=0.0, count=4).now
    assert b.state()["day_used"] == line * 3 // 4 - 6  # the line's...
    assert "status_taken" not in b.state()  # ...not a status read
    assert not b.spare(7, 0.1)
    assert budget(rdb, clock, per_minute=120).spare(1_000, 0.1)  # no day limit: the minute decides alone


def test_a_spare_read_is_refused_where_the_line_spends_more_than_an_evenly_spent_day(
        rdb: redis.Redis, clock: VirtualClock) -> None:
    """Mode spare is the limiter's own rule, checked in the script with the take: a sweep's list read
    from the line only where the line spends less than an evenly spent day. (It matched no branch
    and was taken as a status read is: wherever the day's reserve - here only the 5 % floor for jobs
    to come, nothing pending - had room, on a state the sweep had read earlier in its tick.)"""
    clock.advance(-(clock() % 86_400) + 18 * 3_600)  # 18:00: an even day keeps a quarter of the day
    b = budget(rdb, clock, per_minute=120, per_day=10_000)
    b.mailbox.set_pending(0)
    rdb.hset(b.key, mapping={"day_used": 9_000, "day_reset": int((clock() + 6 * 3_600) * 1000)})
    assert b.take(max_wait=0.0).now  # the reserve (125 reads for the 6 hours left) lets a status read by...
    taken = b.state()
    assert not b.spare(1, 0.0, taken)  # ...but the line spends more than an even day: nothing to spare
    refused = b.take("spare", max_wait=0.0)
    assert not refused.granted and refused.wait > 3_600  # not before the even day has caught up
    assert b.state() == taken  # nothing reserved, nothing counted
    assert taken["day_used"] == 9_001 and taken["status_taken"] == 1  # the status read's


def test_every_mode_has_its_function_in_the_script_and_no_other(rdb: redis.Redis, clock: VirtualClock) -> None:
    """budget.lua's MODES answers every Mode but NONE (the gate's: gate.lua returns before the take),
    by the Mode's value; the script refuses a mode it has no function for, and Python a string that
    is no Mode."""
    lua = BUDGET_LUA + "local names = {} for name in pairs(MODES) do names[#names + 1] = name end return names"
    assert set(rdb.eval(lua, 0)) == {m.value for m in Mode} - {Mode.NONE.value}
    b = budget(rdb, clock)
    with pytest.raises(redis.ResponseError, match="the budget has no mode bogus"):
        rdb.evalsha(rdb.script_load(TAKE.source), 2, *b.keys, *TAKE.argv({**b.take_values(), "mode": "bogus"}))
    with pytest.raises(ValueError, match="bogus"):
        b.take("bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="none"):
        b.take(Mode.NONE)
    assert "status_taken" not in b.state() and "minute_tat" not in b.state()  # nothing was taken


def test_each_script_names_its_keys_and_arguments_in_its_header() -> None:
    """The script files open with their KEYS and ARGV (as redis-py's lock.py documents its scripts);
    the gate's are the lease claim's then the budget take's, in that order."""
    assert TAKE.keys == FEEDBACK.keys == ("budget", "lane") and GATE.keys == ("lease", "budget", "lane")
    assert TAKE.args[:2] == ("now_ms", "mode") and FEEDBACK.args[:2] == ("now_ms", "window")
    assert GATE.args == CLAIM_ARGS + TAKE.args
    for script in (TAKE, FEEDBACK, GATE):
        assert script.source.count("= ARGV[") == len(script.args)


def test_both_windows_hold_at_once_on_a_compressed_day(rdb: redis.Redis, clock: VirtualClock) -> None:
    b = budget(rdb, clock, per_minute=120, per_day=2_000)
    reads = drive(b, clock, 3 * 86_400, step=20.0)
    days = grants_per_window(reads, 86_400)
    minutes = grants_per_window(reads, 60)
    assert max(minutes.values()) <= 120
    assert max(days.values()) <= 2_000
    assert min(n for d, n in days.items() if d not in (min(days), max(days))) >= 0.95 * 2_000, days


def test_a_reservation_names_the_slot_and_spaces_the_next_ones(rdb: redis.Redis, clock: VirtualClock) -> None:
    b = budget(rdb, clock, per_minute=61)  # the limit over PACE: a slot every 62.25/61 s
    first = [b.take() for _ in range(4)]
    assert first[0].now and first[1].now  # the burst of one
    waits = [g.wait for g in first[2:]]
    assert waits[0] == pytest.approx(60 / granted_per_window(61), abs=0.01)
    assert waits[1] - waits[0] == pytest.approx(60 / granted_per_window(61), abs=0.01)


def test_a_slot_further_than_max_wait_is_refused_and_reserves_nothing(rdb: redis.Redis, clock: VirtualClock) -> None:
    b = budget(rdb, clock, per_minute=30)
    while b.take(max_wait=0.0).now:
        pass
    before = b.state()["minute_tat"]
    refused = b.take(max_wait=0.5)
    assert not refused.granted and refused.wait > 0.5
    assert b.state()["minute_tat"] == before


def test_a_429_pauses_every_reader_until_retry_after(rdb: redis.Redis, clock: VirtualClock) -> None:
    b = budget(rdb, clock)
    b.feedback(RateInfo(retry_after=30.0))
    grant = b.take()
    assert grant.granted and grant.wait == pytest.approx(30.0, abs=0.01)
    clock.advance(30.0)
    assert b.take(mode="confirm", slot=clock()).now


def test_a_reserved_slot_is_void_when_sume_s_window_ran_out_meanwhile(rdb: redis.Redis, clock: VirtualClock) -> None:
    """Another client of the key spent the window: Sume says 0 remain for 40 s. A message that
    comes back for its earlier reservation is sent behind the reset instead of collecting a 429."""
    b = budget(rdb, clock)
    reserved = clock() + 5
    b.feedback(RateInfo(limit=120, remaining=0, reset=40.0))
    clock.advance(5)
    confirm = b.take(mode="confirm", slot=reserved)
    assert confirm.granted and confirm.wait >= 35.0 - 0.01


def test_another_client_of_the_key_is_noticed_and_a_read_kept_in_reserve(rdb: redis.Redis,
                                                                         clock: VirtualClock) -> None:
    b = budget(rdb, clock, per_minute=120)
    b.feedback(RateInfo(limit=120, remaining=50, reset=30.0))
    for _ in range(5):  # our own reads, each at its slot: 45 left by our count
        clock.advance(b.take().wait)
        assert b.take(mode="confirm", slot=clock()).now
    b.feedback(RateInfo(limit=120, remaining=40, reset=29.0))  # Sume says 40: someone else spent 5
    assert b.state()["other_until"] > clock() * 1000
    b.feedback(RateInfo(limit=120, remaining=1, reset=20.0))
    assert b.take(mode="confirm", slot=clock()).wait >= 20.0 - 0.01  # the last read stays in reserve


def test_what_another_client_spends_of_sume_s_minute_is_kept_out_of_the_read_log(rdb: redis.Redis,
                                                                                 clock: VirtualClock) -> None:
    """Sume says 3 of 10 are left in its minute where the read log holds 3 of ours: another client
    spent 4, so the log holds at most 6 of ours - the seventh read waits for the log's room though
    the line has its slot - until a reply shows the other client gone."""
    b = budget(rdb, clock, per_minute=10)
    interval = 60 / granted_per_window(10) + 0.01  # a line slot each time (the clock in ms)
    reads = []
    for _ in range(3):
        assert b.take(max_wait=0.0).now
        reads.append(clock())
        clock.advance(interval)
    b.feedback(RateInfo(limit=10, remaining=3, reset=1.0, policy=((60, 10),)))  # sliding: one leaves in 1 s
    assert b.state()["other_reads"] == 4
    for _ in range(3):
        assert b.take(max_wait=0.0).now
        reads.append(clock())
        clock.advance(interval)
    held = b.take(max_wait=0.0)
    assert not held.granted and clock() + held.wait >= reads[0] + 61  # once the first of ours leaves the log
    b.feedback(RateInfo(limit=10, remaining=8, reset=1.0, policy=((60, 10),)))  # the other client stopped
    assert b.state()["other_reads"] == 0 and b.take(max_wait=0.0).now


def test_low_remaining_slows_every_reader_down_to_fit_the_window(rdb: redis.Redis, clock: VirtualClock) -> None:
    b = budget(rdb, clock, per_minute=120)
    b.feedback(RateInfo(limit=120, remaining=10, reset=30.0))
    reads = drive(b, clock, 30.0, step=0.01)
    assert len(reads) <= 10 + 1


def test_the_limit_sume_announces_replaces_a_larger_configured_one(rdb: redis.Redis, clock: VirtualClock) -> None:
    b = budget(rdb, clock, per_minute=120)
    b.feedback(RateInfo(limit=40, remaining=39, reset=60.0, policy=((60, 40), (86_400, 10_000))))
    windows = grants_per_window(drive(b, clock, 300), 60)
    assert max(windows.values()) <= 40


def test_a_rejected_key_pauses_reads_key_wide(rdb: redis.Redis, clock: VirtualClock) -> None:
    b = budget(rdb, clock)
    b.pause_key(300)
    grant = b.take(max_wait=10)
    assert not grant.granted and grant.key_paused and grant.wait == pytest.approx(300, abs=0.01)


def test_many_concurrent_pollers_never_exceed_a_window(rdb: redis.Redis, clock: VirtualClock) -> None:
    b = budget(rdb, clock, per_minute=60)
    reads: list[float] = []
    lock = threading.Lock()
    stop = threading.Event()

    def poller() -> None:
        mine = Budget(redis.Redis(connection_pool=rdb.connection_pool), b.key, 60, 0, clock, early=0.0)
        while not stop.is_set():
            if mine.take(max_wait=0.0).now:
                with lock:
                    reads.append(clock())

    threads = [threading.Thread(target=poller) for _ in range(8)]
    for t in threads:
        t.start()
    for _ in range(600):  # ten virtual minutes in 1 s steps while eight pollers hammer the limiter
        clock.advance(1.0)
    stop.set()
    for t in threads:
        t.join(timeout=10)
    windows = grants_per_window(reads, 60)
    assert max(windows.values()) <= 60, windows


def test_unlimited_budget_never_touches_redis(rdb: redis.Redis, clock: VirtualClock) -> None:
    b = budget(rdb, clock, per_minute=0)
    assert b.take().now and math.isinf(b.rate)
    assert rdb.exists(b.key) == 0


def test_the_outage_pacer_spends_a_share_of_the_minute_and_of_what_the_day_has_left() -> None:
    """Without Redis each of 4 containers takes a quarter of the shared limiter's minute (115 of
    Sume's 120: one per 2.09 s), and of the day's budget its quarter of what the limiter last said
    the day had left; past that, a quarter of the day's average rate."""
    clock = VirtualClock()
    pacer = LocalPacer(per_minute=120, per_day=10_000, share=4, now=clock)
    pacer.learn(day_left=12)  # the day is nearly spent: 3 reads for this container
    waits = [pacer.take() for _ in range(5)]
    minute = 60 / (granted_per_window(120) / 4)
    day = 86_400 / (granted_per_window(10_000) / 4)
    assert waits == pytest.approx([0.0, minute, 2 * minute, 3 * minute, 3 * minute + day])
    pacer.pause(clock() + 1_000.0)  # Sume said 429, Retry-After 1000
    assert pacer.take() == pytest.approx(1_000.0)


def test_a_container_that_never_heard_from_redis_assumes_an_evenly_spent_day() -> None:
    clock = VirtualClock()
    clock.t = 1_800_000_000.0 - 1_800_000_000.0 % 86_400 + 0.75 * 86_400  # three quarters of the UTC day gone
    pacer = LocalPacer(per_minute=120, per_day=10_000, share=5, now=clock)
    minute = 60 / (granted_per_window(120) / 5)
    waits = [pacer.take() for _ in range(510)]  # a quarter of the day's 10,000, shared by 5: 500
    assert waits[498] == pytest.approx(498 * minute) and waits[505] - waits[504] > 10 * minute


def test_the_gate_claims_and_takes_in_one_script_and_skips_the_take_when_the_claim_fails(
        rdb: redis.Redis, clock: VirtualClock) -> None:
    lease = LeaseStore(rdb, "t:lease:")
    b = budget(rdb, clock, per_minute=120)
    gate = ReadGate(lease, b, LocalPacer(0, 0, 1), cluster=False)
    token = new_token()
    lease.start("job_g", token, 60_000)
    step = ChainStep(token, 0, new_nonce())
    passage = gate.enter("job_g", step, ChainStep(new_token(), 0, step.nonce), 60_000)
    assert passage.claim is Claim.OWN and passage.grant is not None and passage.grant.now
    tat = b.state()["minute_tat"]
    dup = ChainStep(token, 0, new_nonce())
    refused = gate.enter("job_g", dup, ChainStep(new_token(), 0, dup.nonce), 60_000)
    assert refused.claim is Claim.HELD and refused.grant is None
    assert b.state()["minute_tat"] == tat  # a refused claim spends no budget
    hop = gate.enter("job_h", step, ChainStep(new_token(), 0, step.nonce), 60_000, mode="none")
    assert hop.claim is Claim.FRESH and hop.grant is None

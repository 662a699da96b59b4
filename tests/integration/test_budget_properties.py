"""The shared budget's properties on a real redis-server, on a virtual clock (random streams of
requests, hypothesis): Python's preview of the limiter matches the Lua, no 60 seconds hold more grants
than the minute's limit, the day is a total spent at the minute's pace. A module of their own (about
half of the budget's tests' time): the integration tier distributes whole modules to its workers.
The helpers are test_budget.py's."""

from __future__ import annotations

import math
import random
import uuid
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_budget import VirtualClock, clock, drive, grants_per_window

from bench.fig_budget import most_in_a_minute  # the figure's own count, held to the limit here too
from sume_poller.limits.budget import (
    LOG_BUCKET,
    TAKE,
    Budget,
    Grant,
    RateInfo,
    granted_per_window,
    lane_burst,
)

pytestmark = pytest.mark.integration
__all__ = ["clock"]  # test_budget.py's fixture, used here by name


def takes_at_once(b: Budget, n: int) -> list[float]:
    """The waits of ``n`` takes of ``b`` at one clock instant, as ``b.take()`` n times would give them, in
    pipelined round trips of 1,000 (the same script, EVALSHA: thousands of takes one by one were most
    of the integration tier's longest module on a busy machine)."""
    waits = [b.take().wait]  # loads the script
    args = TAKE.argv(b.take_values())
    while len(waits) < n:
        pipe = b._r.pipeline(transaction=False)
        for _ in range(min(1_000, n - len(waits))):
            pipe.evalsha(b._take.sha, len(b.keys), *b.keys, *args)
        waits += [Grant.from_reply(reply).wait for reply in pipe.execute()]
    return waits[:n]


@given(limit=st.integers(min_value=1, max_value=600), share=st.sampled_from([0.0, 0.01, 0.05, 0.1, 0.25, 0.5]))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_python_mirrors_the_lua_minute_exactly(rdb: redis.Redis, limit: int, share: float) -> None:
    """Where Python must preview the limiter (the outage pacer, fan-out's allowance, a sweep's
    burst), it computes what the Lua grants: over ten minutes of reservations in an overload, the
    line gets granted_per_window a minute; the lane grants lane_burst at once and no more."""
    clock = VirtualClock()
    b = Budget(rdb, f"t:prop:{uuid.uuid4().hex}:{{reads}}", limit, 0, clock, early=0.0)
    if share:
        b.open_lane(share, clock() + 3_600)
    per = granted_per_window(limit, share)
    slots = takes_at_once(b, math.ceil(12 * per))
    in_ten = [w for w in slots if 60.0 <= w < 660.0]
    assert abs(len(in_ten) - 10 * per) <= 1, (len(in_ten), per)
    burst = lane_burst(limit, share)
    if burst:  # a lane is open (a limit of 1 keeps none: its one read a minute is the line's)
        assert b.take("list", max_wait=0.0, count=burst).now
        assert not b.take("list", max_wait=0.0).now


#: One request of a random stream: seconds the clock moves first, then what is asked.
STEP = st.tuples(
    st.sampled_from([0.0, 0.0, 0.05, 0.25, 0.5, 1.0, 2.5, 7.0, 20.0]),
    st.one_of(
        st.tuples(st.sampled_from(["take", "ahead"]), st.sampled_from([math.inf, 0.0, 3.0, 60.0])),
        st.tuples(st.sampled_from(["list", "spare"]), st.integers(1, 9)),
        st.tuples(st.just("peek"), st.just(0)),
        st.tuples(st.just("early"), st.integers(0, 50)),  # a reserved read comes back before its slot
        st.tuples(st.just("feedback"), st.tuples(st.integers(0, 150), st.integers(1, 60),
                                                 st.sampled_from([None, None, 1.0, 20.0]), st.sampled_from("md"))),
        st.tuples(st.just("lane"), st.sampled_from([0.0, 0.1, 0.25])),
        st.tuples(st.just("pending"), st.integers(0, 500)),
        # a take stamped by a clock this far behind (another container's, or a command held up on
        # its way to Redis), reaching Redis after the others
        st.tuples(st.just("behind"), st.sampled_from([0.3, 1.0, 5.0, 30.0])),
    ))


@given(limit=st.integers(min_value=1, max_value=150), per_day=st.sampled_from([0, 500, 10_000]),
       early=st.sampled_from([0.0, 0.5, 5.0]), late=st.sampled_from([0.0, 1.0, 15.0, 40.0]),
       stream=st.lists(STEP, min_size=40, max_size=300), rng=st.randoms(use_true_random=False))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_no_60_seconds_ever_hold_more_grants_than_the_minute_s_limit(rdb: redis.Redis, limit: int, per_day: int,
                                                                    early: float, late: float,
                                                                    stream: list[tuple[float, Any]],
                                                                    rng: random.Random) -> None:
    """Whatever Sume counts - fixed minutes or the 60 s before each read - a read granted now is one
    Sume counts. For random streams of every mode (status reads, results ahead of the line, sweeps'
    lane and spare reads with their pages, peeks, reserved reads confirmed at their slot or up to
    ``late`` seconds after it (each its own delay: SQS, a busy poller) or handed over before it,
    Sume's headers and 429s, the lane opening
    and closing, the pending count, takes stamped by a clock behind the others), the reads granted
    now, where the read log counts them, never number more than the limit in any 60 s, ``(t - 60, t]``."""
    clock = VirtualClock()
    b = Budget(rdb, f"t:slide:{uuid.uuid4().hex}:{{reads}}", limit, per_day, clock, early=early)
    reads: list[float] = []
    reserved: list[tuple[float, float, str]] = []  # (when its message is back, its slot, the mode confirming it)

    def grant(g: Grant, count: int, confirm: str) -> None:
        if g.now:
            assert g.logged_at is not None, g
            reads.extend([g.logged_at] * count)
        elif g.granted:
            slot = clock() + g.wait
            reserved.append((slot + rng.uniform(0.0, late), slot, confirm))

    for advance, (what, arg) in stream:
        clock.advance(advance)
        for back in sorted(r for r in reserved if r[0] <= clock()):
            reserved.remove(back)
            grant(b.take(back[2], slot=back[1]), 1, back[2])
        if what in ("take", "ahead"):
            grant(b.take(what, max_wait=arg), 1, "rconfirm" if what == "ahead" else "confirm")
        elif what in ("list", "spare"):
            grant(b.take(what, max_wait=0.0, count=arg), arg, "confirm")
        elif what == "peek":
            b.take("peek")
        elif what == "early" and reserved:
            _, slot, mode = reserved.pop(arg % len(reserved))
            grant(b.take(mode, slot=slot), 1, mode)
        elif what == "feedback":
            remaining, reset, retry_after, window = arg
            b.feedback(RateInfo(limit=limit if window == "m" else per_day or None, remaining=min(remaining, limit),
                                reset=float(reset), retry_after=retry_after,
                                policy=((60, limit), *(((86_400, per_day),) if per_day else ()))))
        elif what == "lane":
            b.open_lane(arg, clock() + (3_600 if arg else -1))
        elif what == "pending":
            b.mailbox.set_pending(arg)
        elif what == "behind":
            lagging = Budget(rdb, b.key, limit, per_day, lambda lag=arg: clock() - lag, early=early)  # type: ignore[misc]
            grant(lagging.take("take", max_wait=0.0), 1, "confirm")
    # the log counts each read in a bucket no earlier than that of one Redis granted before it
    buckets = [math.floor(t / LOG_BUCKET + 1e-9) for t in reads]
    assert buckets == sorted(buckets)
    assert most_in_a_minute(reads) <= limit, (most_in_a_minute(reads), limit)


def test_the_day_is_a_total_spent_at_the_minute_pace_while_it_keeps_its_reserve(rdb: redis.Redis,
                                                                                clock: VirtualClock) -> None:
    """2,000 reads a day, 5 pending jobs kept on a 900 s safety cadence: a morning's burst of demand
    reads at the minute's pace - not at the day's average of 1.4 a minute - until what is left of
    the day covers the reserve; then reads are spaced so that it lasts; the day never exceeds 2,000."""
    clock.t = 1_800_000_000.0 - 1_800_000_000.0 % 86_400  # midnight, UTC
    b = Budget(rdb, "t:day:{reads}", 120, 2_000, clock, early=0.0, reserve_every=900.0)
    b.mailbox.set_pending(5)  # the reserve: 5 jobs x 96 reads a day, plus 5 % for jobs to come: 580
    first_hour = drive(b, clock, 3_600, step=0.25)
    assert len(first_hour) >= 2_000 - 580, len(first_hour)  # an evenly spent day would give 83
    rest = drive(b, clock, 86_400 - 3_600, step=5.0)
    assert len(first_hour) + len(rest) <= 2_000
    assert max(grants_per_window(first_hour + rest, 60).values()) <= 120
    assert b.take(max_wait=0.0).day_left is not None


def test_sume_s_day_window_teaches_when_the_day_ends_and_how_much_is_spent(rdb: redis.Redis,
                                                                         clock: VirtualClock) -> None:
    """Sume's reply describes its day window: 30 left, it resets in two hours. The limiter takes both:
    of the 30, all but the floor kept for jobs to come over those two hours (1,000 x 5 % a day:
    4.2) are spent, never more; when the window Sume named ends, a new day begins."""
    b = Budget(rdb, "t:day2:{reads}", 120, 1_000, clock, early=0.0, reserve_every=0.0)
    b.feedback(RateInfo(limit=1_000, remaining=30, reset=7_200.0, policy=((86_400, 1_000),)))
    assert b.state()["day_reset"] == (clock() + 7_200.0) * 1000 and b.state()["day_used"] == 970
    granted = 0
    for _ in range(60):
        granted += b.take(max_wait=0.0).now
        clock.advance(1.0)
    assert granted == 25, granted  # 30 less the floor's 4.2 over the two hours
    clock.advance(7_200.0)
    assert b.take(max_wait=0.0).now  # the window Sume named ended: a new day

"""Where the next read lands: static schedules, bounds, the learned plan, the budget ordering, profiles."""

from __future__ import annotations

import math
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sume_poller.schedule import planner as schedule
from sume_poller.schedule.durations import Interval, LogNormal, model_from
from sume_poller.schedule.planner import (
    LONG_SCHEDULE,
    SHORT_SCHEDULE,
    Bounds,
    defer_delay,
    late_model,
    learned_plan,
    max_wait,
    next_delay,
    overdue,
    profile_key,
    ratio_quantile,
    read_priority,
    schedule_metrics,
    static_delay,
    static_metrics,
    static_read_ages,
)

IMAGE = LogNormal(math.log(20.0), 0.4)
VIDEO = LogNormal(math.log(360.0), 0.6)
AD_VIDEO = LogNormal(math.log(720.0), 0.5)
BOUNDS = Bounds(2.0, 1_800.0, 0.5)
PROFILE_RE = re.compile(r"^[A-Za-z0-9_|.:\-]{1,64}$")  # what a poll message accepts


class Middle(random.Random):
    """An rng whose jitter is always zero."""

    def uniform(self, a: float, b: float) -> float:
        return 0.5 * (a + b)


# -- static ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, expected", [("image", SHORT_SCHEDULE), ("face_swap", SHORT_SCHEDULE),
                                            ("reference_analysis", SHORT_SCHEDULE), (None, SHORT_SCHEDULE),
                                            ("video", LONG_SCHEDULE), ("ad_video", LONG_SCHEDULE)])
def test_static_schedule_by_kind_and_attempt(kind: str | None, expected: tuple[float, ...]) -> None:
    assert SHORT_SCHEDULE == (2, 3, 5, 8, 13, 20, 30) and LONG_SCHEDULE == (10, 15, 20, 30, 45, 60)
    for attempt in range(len(expected) + 5):
        base = expected[min(attempt, len(expected) - 1)]
        assert static_delay(kind, attempt, Middle()) == base  # the last value repeats
        for seed in range(20):
            assert 0.8 * base <= static_delay(kind, attempt, random.Random(seed)) <= 1.2 * base


@given(st.integers(-5, 1_000), st.integers(0, 2**32 - 1))
def test_static_delay_is_at_least_a_second(attempt: int, seed: int) -> None:
    assert static_delay("image", attempt, random.Random(seed)) >= 1.0
    assert static_delay("image", attempt, random.Random(seed)) == static_delay("image", attempt, random.Random(seed))


def test_static_read_ages() -> None:
    assert static_read_ages("image", 31.0) == [2, 5, 10, 18, 31]
    assert static_read_ages("video", 130.0)[-3:] == [75, 120, 180]


# -- bounds ---------------------------------------------------------------------------------------

@given(st.floats(0, 1e5), st.floats(0, 1e5), st.floats(0, 1e4), st.floats(0.1, 100), st.floats(1, 1e4),
       st.floats(0.01, 2))
def test_bounds(delay: float, age: float, expected: float, lo: float, hi: float, fraction: float) -> None:
    b = Bounds(lo, hi, fraction)
    got = b.limit(delay, age, expected)
    assert got >= lo  # min_interval wins over everything
    assert got <= max(lo, hi)
    assert got <= max(lo, fraction * max(age, expected))
    if lo <= delay <= min(hi, fraction * max(age, expected)):
        assert got == delay


# -- next_delay: cold start -------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["image", "video", "ad_video", "face_swap"])
def test_without_a_model_next_delay_is_exactly_the_static_schedule(kind: str) -> None:
    bounds = Bounds(min_interval=1.0, max_interval=1_800.0, age_fraction=0.5)  # production's cap, 1 s floor
    for seed in range(10):
        mine, ref = random.Random(seed), random.Random(seed)
        age, last = 0.0, None
        for attempt in range(40):
            got = next_delay(kind, attempt, age, last, None, bounds, rng=mine)
            assert got == static_delay(kind, attempt, ref)
            age += got
            last = age


def test_without_a_model_the_bounds_still_apply() -> None:
    low = Middle()
    low.uniform = lambda a, b: a  # type: ignore[method-assign]  # the shortest jitter: 2 s x 0.8
    assert static_delay("image", 0, low) == pytest.approx(1.6)
    assert next_delay("image", 0, 0.0, None, None, BOUNDS, rng=low) == 2.0  # min_interval
    assert next_delay("video", 9, 500.0, 500.0, None, Bounds(2.0, 40.0, 0.5), rng=Middle()) == 40.0
    assert next_delay("video", 9, 500.0, 500.0, None, Bounds(2.0, 1800.0, 0.05), rng=Middle()) == 25.0


# -- next_delay: the learned plan --------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.sampled_from([("image", IMAGE), ("video", VIDEO), ("ad_video", AD_VIDEO)]),
       st.floats(0, 20_000), st.one_of(st.none(), st.floats(0, 20_000)), st.one_of(st.none(), st.floats(0, 5_000)),
       st.sampled_from([BOUNDS, Bounds(5.0, 120.0, 0.2), Bounds(0.5, 10_000.0, 2.0)]), st.integers(0, 2**32 - 1))
def test_learned_delay_obeys_bounds_and_hint(case: tuple[str, LogNormal], age: float, last: float | None,
                                             hint: float | None, bounds: Bounds, seed: int) -> None:
    kind, model = case
    got = next_delay(kind, 3, age, last, model, bounds, hint=hint, rng=random.Random(seed))
    expected = model.quantile(schedule.LATE_QUANTILE)
    assert got >= bounds.min_interval
    if hint is not None:
        assert got >= hint
    if hint is None or hint <= bounds.min_interval:
        assert got <= max(bounds.min_interval, bounds.max_interval)
        assert got <= max(bounds.min_interval, bounds.age_fraction * max(age, expected))


def test_hint_is_a_lower_bound_only() -> None:
    free = next_delay("video", 2, 200.0, 200.0, VIDEO, BOUNDS, rng=Middle())
    assert next_delay("video", 2, 200.0, 200.0, VIDEO, BOUNDS, hint=free + 100, rng=Middle()) == free + 100
    assert next_delay("video", 2, 200.0, 200.0, VIDEO, BOUNDS, hint=1.0, rng=Middle()) == free
    assert next_delay("video", 2, 200.0, 200.0, VIDEO, BOUNDS, hint=math.nan, rng=Middle()) == free
    assert next_delay("image", 0, 0.0, None, None, BOUNDS, hint=7.5, rng=Middle()) == 7.5
    assert next_delay("image", 0, 0.0, None, None, BOUNDS, hint=5_000.0, rng=Middle()) == 5_000.0  # beyond max


@pytest.mark.parametrize("kind, model", [("image", IMAGE), ("video", VIDEO), ("ad_video", AD_VIDEO)])
def test_learned_reads_follow_the_plan(kind: str, model: LogNormal) -> None:
    plan = learned_plan(model, "image" if kind == "image" else "video", BOUNDS)
    age, last, reads = 0.0, None, []
    for attempt in range(len(plan.reads)):
        age += next_delay(kind, attempt, age, last, model, BOUNDS, rng=Middle())
        last = age
        reads.append(age)
    assert reads == pytest.approx(list(plan.reads), rel=1e-9)
    assert reads[0] > 10 * SHORT_SCHEDULE[0] if kind == "video" else True  # no early reads of a video


@pytest.mark.parametrize("kind, model", [("image", IMAGE), ("video", VIDEO), ("ad_video", AD_VIDEO),
                                         ("image", LogNormal(math.log(45.0), 0.8)),
                                         ("video", LogNormal(math.log(200.0), 0.3))])
def test_plan_beats_static_on_its_model(kind: str, model: LogNormal) -> None:
    plan = learned_plan(model, "image" if kind == "image" else "video", BOUNDS)
    assert plan.feasible
    assert plan.learned.reads < 0.8 * plan.static.reads
    assert plan.learned.mean_delay <= schedule.DELAY_MARGIN * plan.static.mean_delay * (1 + 1e-9)
    assert plan.learned.late <= schedule.LATE_SHARE + 1e-9
    # the plan's own figures agree with summing its read ages
    again = schedule_metrics(model, plan.reads, plan.late_ratio)
    assert again.reads == pytest.approx(plan.learned.reads, rel=1e-6)
    assert again.mean_delay == pytest.approx(plan.learned.mean_delay, rel=1e-6)


def _observed(truth: LogNormal, kind: str, n: int, rng: random.Random) -> list[Interval]:
    """What the static schedule (cold start, +/-20 % jitter) records of ``n`` jobs of ``truth``."""
    out = []
    for _ in range(n):
        duration = truth.quantile(rng.random())
        age, last, attempt = 0.0, None, 0
        while age < duration:
            last = age if attempt else None
            age += next_delay(kind, attempt, age, last, None, BOUNDS, rng=rng)
            attempt += 1
        out.append(Interval(last or 0.0, age))
    return out


@pytest.mark.parametrize("kind, truth", [("image", IMAGE), ("video", VIDEO), ("ad_video", AD_VIDEO)])
def test_each_kind_keeps_its_own_static_figures_within_its_fits_error(kind: str, truth: LogNormal) -> None:
    """Per kind, not pooled: a plan built on a fit of 67 completions (bench figure 7's warm-up),
    evaluated on the true distribution, has a mean delay and a 95th percentile of delay/duration
    within 5 % of the static schedule's there, unless the fit is off by more than it states
    (LATE_SE standard errors at its 5 % quantile), which 30 fits may be two times at most. (With
    the late share held on the fitted model alone, 6 of these 30 video fits and 7 ad video ones
    missed, by up to 1.76x and 1.62x.)"""
    static = static_metrics(truth, kind)
    misses = []
    for seed in range(30):
        fitted = model_from(_observed(truth, kind, 67, random.Random(seed)))
        assert fitted is not None
        plan = learned_plan(fitted, "image" if kind == "image" else "video", BOUNDS)
        assert plan.feasible
        p95 = ratio_quantile(truth, plan.reads) / static.late_ratio
        delay = schedule_metrics(truth, plan.reads, static.late_ratio).mean_delay / static.mean_delay
        if p95 > 1.05 or delay > 1.05:
            misses.append((seed, fitted, round(p95, 3), round(delay, 3)))
    assert len(misses) <= 2, misses
    for _, fitted, _, _ in misses:
        error = math.log(fitted.quantile(schedule.LATE_TAIL) / truth.quantile(schedule.LATE_TAIL))
        assert error > schedule.LATE_SE * fitted.log_quantile_se(schedule.LATE_TAIL), misses


def test_the_late_model_is_the_fit_moved_by_its_stated_error() -> None:
    assert late_model(VIDEO) is VIDEO  # given, not fitted: nothing stated, nothing moved
    fitted = LogNormal(VIDEO.mu, VIDEO.sigma, (0.01, 0.0, 0.005))
    se = fitted.log_quantile_se(schedule.LATE_TAIL)
    assert se == pytest.approx(math.sqrt(0.01 + (1.6448536 * 0.6) ** 2 * 0.005), rel=1e-6)
    moved = late_model(fitted)
    assert moved.sigma == fitted.sigma
    assert moved.mu == pytest.approx(fitted.mu - schedule.LATE_SE * se)
    unknown = LogNormal(VIDEO.mu, VIDEO.sigma, (math.inf, 0.0, math.inf))  # a degenerate fit
    assert late_model(unknown).mu == pytest.approx(VIDEO.mu - schedule.LATE_SHIFT_MAX)
    # the plan of a fitted model: every target on the model, the late share on the moved one too
    plan = learned_plan(fitted, "video", BOUNDS)
    exact = learned_plan(VIDEO, "video", BOUNDS)
    assert plan.feasible and plan.late_model == moved
    assert plan.learned.late <= schedule.LATE_SHARE + 1e-9 and plan.late_shifted <= schedule.LATE_SHARE + 1e-9
    assert plan.learned.mean_delay <= schedule.DELAY_MARGIN * plan.static.mean_delay * (1 + 1e-9)
    assert plan.reads[0] < exact.reads[0]  # the first read earlier: the lower tail is less certain
    assert exact.learned.reads < plan.learned.reads < 0.8 * plan.static.reads


def test_static_metrics_agree_with_the_read_ages() -> None:
    for kind, model in (("image", IMAGE), ("video", VIDEO)):
        fast = static_metrics(model, kind)
        slow = schedule_metrics(model, static_read_ages(kind, model.survival_quantile(1e-12)), fast.late_ratio)
        assert fast.reads == pytest.approx(slow.reads, rel=1e-6)
        assert fast.mean_delay == pytest.approx(slow.mean_delay, rel=1e-6)
        assert fast.late == pytest.approx(0.05, abs=1e-6)  # late_ratio is the 95th percentile


@pytest.mark.parametrize("model", [IMAGE, VIDEO, AD_VIDEO, LogNormal(math.log(30.0), 1.2)])
def test_a_plan_is_built_once_per_model_and_reused(model: LogNormal) -> None:
    learned_plan.cache_clear()
    first = learned_plan(model, "video", BOUNDS)
    assert learned_plan(model, "video", BOUNDS) is first
    assert learned_plan.cache_info().misses == 1


@pytest.mark.parametrize("model", [LogNormal(math.log(1.0), 0.3), LogNormal(0.0, 0.05),
                                   LogNormal(math.log(3000.0), 4.0), LogNormal(math.log(10.0), 0.05),
                                   LogNormal(math.log(86_400.0), 1.0)])
def test_odd_models_fall_back_or_stay_bounded(model: LogNormal) -> None:
    plan = learned_plan(model, "image", BOUNDS)
    for age in (0.0, 1.0, 30.0, 1e3, 1e5, 1e7):
        got = next_delay("image", 4, age, age, model, BOUNDS, rng=Middle())
        assert BOUNDS.min_interval <= got <= BOUNDS.max_interval
    if not plan.feasible:  # e.g. done before the minimum interval: the static schedule
        assert next_delay("image", 4, 50.0, 50.0, model, BOUNDS, rng=Middle()) == \
            next_delay("image", 4, 50.0, 50.0, None, BOUNDS, rng=Middle())


def test_a_job_older_than_the_model_expected_is_read_geometrically() -> None:
    plan = learned_plan(VIDEO, "video", BOUNDS)
    late = plan.ages[-1] * 1.5
    got = next_delay("video", 50, late, late, VIDEO, BOUNDS, rng=Middle())
    assert got == pytest.approx(min(late * (plan.tail_ratio - 1), BOUNDS.age_fraction * late, BOUNDS.max_interval))


def test_a_deferred_job_is_replanned_from_what_is_known() -> None:
    # last seen running at 200 s, now 400 s (it waited for the budget): next read after now, soon
    got = next_delay("video", 4, 400.0, 200.0, VIDEO, BOUNDS, rng=Middle())
    assert BOUNDS.min_interval <= got <= 120.0


# -- ordering under a binding budget ------------------------------------------------------------------

def test_read_priority() -> None:
    assert read_priority(None, None, 5.0) == 1.0
    assert read_priority(VIDEO, None, 0.0) == 0.0
    assert read_priority(VIDEO, 300.0, 300.0) == 0.0
    assert read_priority(VIDEO, None, 360.0) == pytest.approx(0.5)
    assert read_priority(VIDEO, 100.0, 200.0) == pytest.approx(VIDEO.conditional_cdf(200.0, 100.0))
    assert read_priority(VIDEO, 100.0, 1e7) == pytest.approx(1.0)


@given(st.floats(0, 10_000), st.floats(0, 10_000), st.floats(0, 10_000))
def test_priority_rises_while_waiting(last: float, a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    assert 0.0 <= read_priority(AD_VIDEO, last, lo) <= read_priority(AD_VIDEO, last, hi) <= 1.0


@given(st.floats(0, 1), st.floats(0, 1), st.floats(0.1, 1000))
def test_max_wait(p: float, q: float, w0: float) -> None:
    lo, hi = sorted((p, q))
    assert 0.0 <= max_wait(lo, w0) <= max_wait(hi, w0)
    assert max_wait(lo, 2 * w0) == pytest.approx(2 * max_wait(lo, w0))


def test_max_wait_points() -> None:
    assert max_wait(1.0, 30.0) == math.inf
    assert max_wait(0.0, 30.0) == 0.0
    assert max_wait(0.5, 30.0) == pytest.approx(30.0)
    assert max_wait(0.9, 30.0) == pytest.approx(270.0)
    assert max_wait(math.nan, 30.0) == 0.0


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([IMAGE, VIDEO, AD_VIDEO]), st.floats(0, 3_000), st.floats(0, 3_000), st.floats(0.5, 2_000),
       st.floats(1, 300))
def test_defer_until_the_remaining_wait_is_acceptable(model: LogNormal, last: float, extra: float, wait: float,
                                                      w0: float) -> None:
    age = last + extra
    d = defer_delay(model, last, age, wait, w0, BOUNDS)
    assert BOUNDS.min_interval <= d <= max(BOUNDS.min_interval, min(wait, BOUNDS.max_interval)) + 1e-9
    capped = d >= BOUNDS.max_interval - 1e-9  # the bound wins: it comes back then whatever its priority
    if d > BOUNDS.min_interval and d < wait and not capped:  # the first moment it would take the rest of the wait
        assert max_wait(read_priority(model, last, age + d), w0) >= (wait - d) * (1 - 1e-3) - 0.05
        early = d - 0.05 * BOUNDS.min_interval
        assert max_wait(read_priority(model, last, age + early), w0) < wait - early


def test_defer_edges() -> None:
    assert defer_delay(None, None, 10.0, 45.0, 30.0, BOUNDS) == 45.0
    assert defer_delay(None, None, 10.0, 4_000.0, 30.0, BOUNDS) == BOUNDS.max_interval
    assert defer_delay(VIDEO, 100.0, 100.0, 0.0, 30.0, BOUNDS) == BOUNDS.min_interval
    assert defer_delay(VIDEO, 100.0, 100.0, math.inf, 30.0, BOUNDS) == BOUNDS.max_interval
    # a job already likely done comes back at once
    assert defer_delay(IMAGE, 10.0, 200.0, 100.0, 30.0, BOUNDS) == BOUNDS.min_interval


def test_overdue() -> None:
    assert not overdue(499.0, 1_000, 2.0, 1.0)
    assert overdue(500.0, 1_000, 2.0, 1.0)
    assert overdue(250.0, 1_000, 2.0, 0.5)
    assert not overdue(1e9, 1_000, 0.0, 1.0)  # no reads at all: nothing to jump ahead to
    assert overdue(0.0, 0, 2.0, 1.0)


@given(st.floats(0, 1e5), st.floats(0, 1e5), st.integers(0, 10_000), st.floats(0.01, 100), st.floats(0.1, 5))
def test_overdue_is_monotone_in_the_gap(a: float, b: float, pending: int, rate: float, factor: float) -> None:
    lo, hi = sorted((a, b))
    assert overdue(hi, pending, rate, factor) or not overdue(lo, pending, rate, factor)


# -- profiles -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, params, expected", [
    ("video", None, "video"),
    ("video", {}, "video"),
    ("video", {"prompt": "a cat"}, "video"),
    ("video", {"duration": 15}, "video|d16"),
    ("video", {"duration": 16.0}, "video|d16"),
    ("video", {"duration_seconds": 5}, "video|d4"),
    ("video", {"length": "10"}, "video|d8"),
    ("video", {"duration": "10s"}, "video|d8"),
    ("video", {"duration": True}, "video"),
    ("video", {"duration": -3}, "video"),
    ("video", {"duration": 10**9}, "video"),
    ("video", {"duration": 30, "resolution": "1080p"}, "video|d32|mp2"),
    ("ad_video", {"resolution": "720p"}, "ad_video|mp1"),
    ("ad_video", {"resolution": "4k"}, "ad_video|mp8"),
    ("ad_video", {"resolution": 1080}, "ad_video|mp2"),
    ("image", {"size": "1024x1024"}, "image|mp1"),
    ("image", {"width": 512, "height": 512}, "image|mp0.25"),
    ("image", {"resolution": "1920x1080"}, "image|mp2"),
    ("image", {"resolution": "huge"}, "image"),
])
def test_profile_key(kind: str, params: dict[str, object] | None, expected: str) -> None:
    assert profile_key(kind, params) == expected


_VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=12), st.lists(st.integers(), max_size=2))


@given(st.sampled_from(["image", "video", "ad_video", "face_swap", "reference_analysis"]),
       st.dictionaries(st.sampled_from(["duration", "duration_seconds", "length", "resolution", "size", "width",
                                        "height", "steps", "prompt"]), _VALUES, max_size=6))
def test_profile_key_is_always_a_valid_message_profile(kind: str, params: dict[str, object]) -> None:
    key = profile_key(kind, params)
    assert PROFILE_RE.fullmatch(key)
    assert key == kind or key.startswith(kind + "|")

"""The completion-time model: the log-normal, its interval-censored fit, recency weights."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sume_poller.schedule.durations import (
    MAX_SIGMA,
    MIN_OBSERVATIONS,
    MIN_SIGMA,
    Interval,
    LogNormal,
    completed,
    fit_lognormal,
    intervals_from,
    model_from,
    recency_weight,
    summary,
)

SHORT = (2.0, 3.0, 5.0, 8.0, 13.0, 20.0, 30.0)
LONG = (10.0, 15.0, 20.0, 30.0, 45.0, 60.0)


def observe(model: LogNormal, n: int, schedule: tuple[float, ...], rng: random.Random,
            censored: float = 0.0) -> list[Interval]:
    """What a poller on ``schedule`` (with +/-20 % jitter) records of ``n`` jobs: a share
    ``censored`` of them is abandoned at a random age before it finishes (right-censored)."""
    out = []
    for _ in range(n):
        duration = model.quantile(rng.random())
        stop = rng.uniform(0.0, duration) if rng.random() < censored else math.inf
        age, last, attempt = 0.0, 0.0, 0
        while True:
            age += schedule[min(attempt, len(schedule) - 1)] * rng.uniform(0.8, 1.2)
            attempt += 1
            if age > stop:
                out.append(Interval(last, math.inf))
                break
            if age >= duration:
                out.append(Interval(last, age))
                break
            last = age
    return out


# -- the distribution ------------------------------------------------------------------------------

def test_lognormal_basics() -> None:
    m = LogNormal(math.log(20.0), 0.4)
    assert m.median == pytest.approx(20.0)
    assert m.cdf(20.0) == pytest.approx(0.5)
    assert m.quantile(0.5) == pytest.approx(20.0)
    assert m.quantile(0.9) == pytest.approx(20.0 * math.exp(0.4 * 1.2815515655446004))
    assert m.cdf(0.0) == 0.0 and m.cdf(-1.0) == 0.0 and m.cdf(math.inf) == 1.0
    assert m.sf(0.0) == 1.0 and m.sf(math.inf) == 0.0
    assert m.quantile(0.0) == 0.0 and m.quantile(1.0) == math.inf
    assert m.mean == pytest.approx(20.0 * math.exp(0.08))


@pytest.mark.parametrize("mu, sigma", [(0.0, 0.0), (0.0, -1.0), (math.nan, 1.0), (0.0, math.inf)])
def test_lognormal_rejects_bad_parameters(mu: float, sigma: float) -> None:
    with pytest.raises(ValueError):
        LogNormal(mu, sigma)


@given(st.floats(-3, 12), st.floats(0.05, 4.0), st.floats(1e-9, 1 - 1e-9))
def test_quantile_inverts_cdf(mu: float, sigma: float, p: float) -> None:
    m = LogNormal(mu, sigma)
    t = m.quantile(p)
    assert m.cdf(t) == pytest.approx(p, rel=1e-7, abs=1e-12)
    assert m.cdf(t) + m.sf(t) == pytest.approx(1.0)


def test_tail_survives_where_one_minus_cdf_underflows() -> None:
    m = LogNormal(math.log(20.0), 0.4)
    t = 20.0 * math.exp(0.4 * 10)  # 10 sigmas
    assert 1.0 - m.cdf(t) == 0.0
    assert 0.0 < m.sf(t) < 1e-22
    assert m.log_sf(20.0 * math.exp(0.4 * 60)) < -1700  # far past float range, still finite
    assert m.survival_quantile(m.sf(t)) == pytest.approx(t, rel=1e-6)


def test_partial_mean_matches_integration() -> None:
    m = LogNormal(math.log(300.0), 0.6)
    t, steps = 400.0, 20_000
    h = t / steps
    integral = sum((i + 0.5) * h * (m.cdf((i + 1) * h) - m.cdf(i * h)) for i in range(steps))
    assert m.partial_mean(t) == pytest.approx(integral, rel=1e-4)
    assert m.partial_mean(math.inf) == pytest.approx(m.mean)


@given(st.floats(0.0, 5_000), st.floats(0.0, 5_000), st.floats(0.0, 5_000))
def test_conditional_cdf(alive_at: float, t1: float, t2: float) -> None:
    m = LogNormal(math.log(360.0), 0.6)
    lo, hi = sorted((t1, t2))
    a, b = m.conditional_cdf(lo, alive_at), m.conditional_cdf(hi, alive_at)
    assert 0.0 <= a <= b <= 1.0
    if lo <= alive_at:
        assert a == 0.0
    if 0 < alive_at < lo and m.sf(alive_at) > 1e-6:
        assert a == pytest.approx((m.cdf(lo) - m.cdf(alive_at)) / m.sf(alive_at), rel=1e-6, abs=1e-12)


def test_conditional_cdf_for_a_very_late_job() -> None:
    m = LogNormal(math.log(20.0), 0.4)
    late = 20.0 * math.exp(0.4 * 12)  # survival ~1e-33: 1 - cdf is 0 there
    p = m.conditional_cdf(late * 1.1, late)
    assert 0.0 < p < 1.0  # the hazard is still defined
    assert m.conditional_cdf(late * 10, late) > p


# -- recency -----------------------------------------------------------------------------------

def test_recency_weight() -> None:
    day = 86_400.0
    assert recency_weight(0.0, day) == 1.0
    assert recency_weight(-5.0, day) == 1.0
    assert recency_weight(day, day) == pytest.approx(0.5)
    assert recency_weight(3 * day, day) == pytest.approx(0.125)
    assert recency_weight(day, 0.0) == 1.0 and recency_weight(day, math.inf) == 1.0


@given(st.floats(0, 1e7), st.floats(0, 1e7), st.floats(1.0, 1e7))
def test_recency_weight_decreases_with_age(a: float, b: float, half_life: float) -> None:
    lo, hi = sorted((a, b))
    assert 0.0 <= recency_weight(hi, half_life) <= recency_weight(lo, half_life) <= 1.0


# -- the fit: recovery --------------------------------------------------------------------------

@pytest.mark.parametrize("median, sigma, schedule", [
    (20.0, 0.4, SHORT),    # image
    (6.0, 0.3, SHORT),     # faster than the first reads
    (45.0, 0.8, SHORT),
    (20.0, 1.5, SHORT),    # several decades
    (360.0, 0.6, LONG),    # video
    (720.0, 0.5, LONG),    # ad video
    (900.0, 0.2, LONG),    # narrow: a few reads per job
])
def test_fit_recovers_parameters_from_censored_polls(median: float, sigma: float,
                                                     schedule: tuple[float, ...]) -> None:
    rng = random.Random(int(median * 100 + sigma * 10))
    truth = LogNormal(math.log(median), sigma)
    fitted = fit_lognormal(observe(truth, 400, schedule, rng, censored=0.1))
    # standard errors at n = 400: ~sigma / 20 in log median, ~sigma / 28 in sigma (more with coarse bins)
    assert abs(math.log(fitted.median / median)) < max(0.25 * sigma, 0.03)
    assert abs(fitted.sigma / sigma - 1.0) < 0.15


def test_fit_of_exact_observations_is_the_sample_mean_and_deviation() -> None:
    rng = random.Random(3)
    logs = [rng.gauss(3.0, 0.5) for _ in range(300)]
    fitted = fit_lognormal([Interval(math.exp(y), math.exp(y)) for y in logs])
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((y - mean) ** 2 for y in logs) / len(logs))
    assert math.log(fitted.median) == pytest.approx(mean, abs=1e-6)
    assert fitted.sigma == pytest.approx(sd, rel=1e-5)


def test_weight_is_repetition() -> None:
    rng = random.Random(4)
    base = observe(LogNormal(math.log(30.0), 0.5), 60, SHORT, rng)
    doubled = fit_lognormal(base + base)
    weighted = fit_lognormal([Interval(iv.lower, iv.upper, 2.0) for iv in base])
    assert weighted.mu == pytest.approx(doubled.mu, abs=1e-6)
    assert weighted.sigma == pytest.approx(doubled.sigma, abs=1e-6)


def test_recent_observations_dominate() -> None:
    rng = random.Random(5)
    old = observe(LogNormal(math.log(60.0), 0.4), 200, SHORT, rng)
    new = observe(LogNormal(math.log(20.0), 0.4), 100, SHORT, rng)
    day = 86_400.0
    weighted = [Interval(iv.lower, iv.upper, recency_weight(10 * day, day)) for iv in old] + new
    assert fit_lognormal(weighted).median == pytest.approx(20.0, rel=0.12)


@pytest.mark.parametrize("median, sigma, schedule", [(20.0, 0.4, SHORT), (360.0, 0.6, LONG), (720.0, 0.5, LONG)])
def test_the_fit_states_its_error(median: float, sigma: float, schedule: tuple[float, ...]) -> None:
    """The standard error a fit states for its 5 % quantile is the spread of that quantile's
    error over fits (67 observations, bench figure 7's warm-up per kind): z-scores with a
    standard deviation near 1, beyond 2 about as rarely as a normal's."""
    truth = LogNormal(math.log(median), sigma)
    zs = []
    for seed in range(100):
        fitted = fit_lognormal(observe(truth, 67, schedule, random.Random(seed)))
        se = fitted.log_quantile_se(0.05)
        assert 0.3 * sigma / math.sqrt(67) < se < 3.0 * sigma / math.sqrt(67)
        zs.append(math.log(fitted.quantile(0.05) / truth.quantile(0.05)) / se)
    sd = math.sqrt(sum(z * z for z in zs) / len(zs))
    assert 0.8 < sd < 1.25, sd
    assert sum(abs(z) > 2.0 for z in zs) <= 0.1 * len(zs)


def test_the_stated_error_shrinks_with_observations_not_with_weights() -> None:
    truth = LogNormal(math.log(30.0), 0.5)
    base = observe(truth, 60, SHORT, random.Random(4))
    one = fit_lognormal(base).log_quantile_se(0.05)
    assert fit_lognormal(base + base).log_quantile_se(0.05) == pytest.approx(one / math.sqrt(2.0), rel=1e-6)
    # a weight says how much an observation counts beside the others, not that it was seen twice
    assert fit_lognormal([Interval(iv.lower, iv.upper, 2.0) for iv in base]).log_quantile_se(0.05) == \
        pytest.approx(one, rel=1e-6)
    # recency weights: half of them at 1/16 leave 34 observations' worth (Kish), error x ~1.33
    faded = [Interval(iv.lower, iv.upper, 1.0 / 16.0 if i % 2 else 1.0) for i, iv in enumerate(base)]
    assert 1.15 * one < fit_lognormal(faded).log_quantile_se(0.05) < 1.5 * one
    assert LogNormal(0.0, 1.0).log_quantile_se(0.05) == 0.0  # a model given, not fitted: exact


# -- the fit: robustness ------------------------------------------------------------------------------

def _sane(m: LogNormal) -> None:
    assert math.isfinite(m.mu) and MIN_SIGMA * 0.999 <= m.sigma <= MAX_SIGMA * 1.001


@pytest.mark.parametrize("intervals", [[], [Interval(0.0, math.inf)], [Interval(5.0, 9.0, 0.0)],
                                       [Interval(math.nan, 4.0)]])
def test_nothing_to_fit(intervals: list[Interval]) -> None:
    with pytest.raises(ValueError):
        fit_lognormal(intervals)


def test_degenerate_identical_intervals() -> None:
    m = fit_lognormal([Interval(10.0, 12.0)] * 50)
    _sane(m)
    assert 10.0 <= m.median <= 12.0
    assert m.sigma == pytest.approx(MIN_SIGMA)  # all the mass in one bin: as narrow as allowed
    exact = fit_lognormal([Interval(7.0, 7.0)] * 40)
    assert exact.median == pytest.approx(7.0) and exact.sigma == pytest.approx(MIN_SIGMA)
    for fitted in (m, exact):  # whatever the box leaves of the error, it is stated, never NaN
        assert not math.isnan(fitted.log_quantile_se(0.05)) and fitted.log_quantile_se(0.05) >= 0.0


def test_all_right_censored_is_finite_and_late() -> None:
    m = fit_lognormal([Interval(float(a), math.inf) for a in range(10, 100, 3)])
    _sane(m)
    assert m.median > 97.0  # longer than anything seen: the box's edge, not infinity


def test_never_seen_running() -> None:
    m = fit_lognormal([Interval(0.0, 2.0 + 0.1 * i) for i in range(40)])  # all done by the first read
    _sane(m)
    assert m.median < 3.0


def test_huge_spread_and_messy_input() -> None:
    rng = random.Random(7)
    intervals = [Interval(10 ** rng.uniform(0, 6), math.inf) for _ in range(20)]
    intervals += [Interval(lo, lo * 1.5) for lo in (10 ** rng.uniform(0, 6) for _ in range(80))]
    intervals += [Interval(50.0, 20.0), Interval(-3.0, 4.0), Interval(5.0, 8.0, -1.0), Interval(1.0, 2.0, math.nan)]
    _sane(fit_lognormal(intervals))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e6), st.one_of(st.floats(0, 1e6), st.just(math.inf)),
                          st.floats(0.01, 10)), min_size=1, max_size=40))
def test_fit_never_fails_on_informative_data(raw: list[tuple[float, float, float]]) -> None:
    intervals = [Interval(lo, hi, w) for lo, hi, w in raw]
    try:
        m = fit_lognormal(intervals)
    except ValueError:  # only when nothing is informative
        assert all(min(lo, hi) == 0.0 and max(lo, hi) in (0.0, math.inf) for lo, hi, _ in raw)
        return
    _sane(m)


# -- around the fit ---------------------------------------------------------------------------------

def test_model_from_needs_enough_completions() -> None:
    rng = random.Random(8)
    done = observe(LogNormal(math.log(20.0), 0.4), MIN_OBSERVATIONS - 1, SHORT, rng)
    abandoned = [Interval(5.0, math.inf)] * 50
    assert completed(done + abandoned) == MIN_OBSERVATIONS - 1
    assert model_from(done + abandoned) is None
    more = done + observe(LogNormal(math.log(20.0), 0.4), 1, SHORT, rng)
    assert model_from(more) is not None
    assert model_from(more, min_observations=100) is None


def test_intervals_from_store_items() -> None:
    day = 86_400.0
    now = 10 * day
    items = [{"l": 3.0, "u": 8.0, "t": now}, {"l": 5.0, "u": None, "t": now - day}, {"l": 2.0, "t": now},
             {"l": "x", "u": 3.0}, {"u": 4.0}, {"l": 1.0, "u": float("nan")}, {"l": 1.0, "u": 2.5}]
    got = intervals_from(items, now, day)
    assert got == [Interval(3.0, 8.0, 1.0), Interval(5.0, math.inf, 0.5), Interval(2.0, math.inf, 1.0),
                   Interval(1.0, 2.5, 1.0)]


def test_summary_is_json() -> None:
    m = LogNormal(math.log(360.0), 0.6)
    s = summary(m, 123)
    assert json.loads(json.dumps(s)) == s
    assert s == {"median": 360.0, "p90": round(360.0 * math.exp(0.6 * 1.2815515655446004), 1), "sigma": 0.6,
                 "observations": 123}


def test_no_model_from_completions_that_were_never_seen_running() -> None:
    """Every first read found the job done ([0, u]): nothing says when it finished, so the static
    schedule (early reads) stays until a third of the completions are bracketed."""
    unbracketed = [Interval(0.0, 25.0 + i, 1.0) for i in range(40)]
    assert model_from(unbracketed) is None
    bracketed_too = unbracketed + [Interval(4.0 + i % 5, 9.0 + i % 5, 1.0) for i in range(MIN_OBSERVATIONS // 3)]
    assert model_from(bracketed_too) is not None

"""How long jobs take: a log-normal completion-time model per kind (or profile), fitted to what
the poller saw. Pure functions, standard library only (this runs in Lambda).

A poller never sees a job finish; it sees it running at one read and terminal at a later one.
Each finished (or abandoned) job therefore gives an *interval*: it finished after ``lower``
seconds (its age at the last read that saw it running, 0 if none did) and at or before ``upper``
(its age at the first read that saw it terminal; ``math.inf`` when we stopped watching it). The
fit is the maximum-likelihood log-normal for such interval-censored data, with weights so
recent observations count more (:func:`recency_weight`).

The fit is a damped Newton ascent on the exact log-likelihood in (mu, log sigma) with analytic
gradient and Hessian, a backtracking line search and a box on both parameters: it always
returns (degenerate data, everything right-censored, lower = 0, spreads of several decades), in
a bounded number of iterations (a few ms for 200 intervals).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from ..core.values import value

if TYPE_CHECKING:
    from statistics import NormalDist

#: Below this many completed observations (finite ``upper``) a kind keeps the static schedule.
MIN_OBSERVATIONS = 30
#: The fit's box: sigma in [MIN_SIGMA, MAX_SIGMA]; the median within MU_MARGIN (in log
#: seconds, e^3 = 20x) of the smallest and largest age observed.
MIN_SIGMA = 0.05
MAX_SIGMA = 4.0
MU_MARGIN = 3.0
MAX_ITERATIONS = 60

_SQRT2 = math.sqrt(2.0)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
#: Intervals narrower than this (relative) are exact observations: the density, not a probability.
_EXACT = 1e-9


def _q(z: float) -> float:
    """P(Z > z) for a standard normal Z, accurate in the upper tail."""
    return 0.5 * math.erfc(z / _SQRT2)


def _log_q(z: float) -> float:
    """log P(Z > z), finite far into the upper tail (asymptotic series past z = 35)."""
    if z < 35.0:
        return math.log(_q(z))
    if math.isinf(z):
        return -math.inf
    z2 = z * z
    return -0.5 * z2 - math.log(z) - _LOG_SQRT_2PI + math.log1p(-1.0 / z2 + 3.0 / (z2 * z2))


def _log1mexp(d: float) -> float:
    """log(1 - e^d) for d < 0."""
    return math.log(-math.expm1(d)) if d > -0.6931471805599453 else math.log1p(-math.exp(d))


def _log_mass(a: float, b: float) -> float:
    """log P(a < Z <= b) for a < b (either may be infinite), without cancellation in the tails."""
    if a >= 0.0:
        la, lb = _log_q(a), _log_q(b)
    elif b <= 0.0:
        la, lb = _log_q(-b), _log_q(-a)
    else:
        return math.log1p(-(_q(b) + _q(-a)))
    if lb - la >= 0.0:  # a and b too close for the difference: width times the density
        return -0.5 * a * a - _LOG_SQRT_2PI + math.log(b - a)
    return la + _log1mexp(lb - la)


@functools.cache
def _standard_normal() -> NormalDist:
    """statistics' standard normal, imported at the first learned plan: statistics (and the fractions
    it imports) would cost every poll and submit cold start about 1 ms of CPU."""
    from statistics import NormalDist

    return NormalDist()


def normal_quantile(p: float) -> float:
    """The standard normal quantile (Wichura's AS241 rational approximation, via statistics)."""
    return _standard_normal().inv_cdf(p)


@value
class Interval:
    """A job finished after ``lower`` seconds and at or before ``upper`` (``math.inf``: censored)."""

    lower: float
    upper: float
    weight: float = 1.0


@value
class LogNormal:
    """Completion time T with log T ~ Normal(mu, sigma) (seconds).

    ``cov``: what a fit states of its own error, the covariance of its estimates of
    (mu, log sigma) as (var mu, cov, var log sigma); zeros (the default) for a model taken as
    exact. :meth:`log_quantile_se` turns it into the standard error of a quantile.
    """

    mu: float
    sigma: float
    cov: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mu) and math.isfinite(self.sigma) and self.sigma > 0):
            raise ValueError(f"LogNormal needs a finite mu and a positive sigma, not ({self.mu}, {self.sigma})")

    def log_quantile_se(self, p: float) -> float:
        """The standard error of log(quantile(p)) = mu + z sigma from the fit's ``cov`` (delta
        method); 0 for an exact model, inf when the fit could not state its error."""
        v_mm, v_ms, v_ss = self.cov
        zs = normal_quantile(p) * self.sigma
        var = v_mm + 2.0 * zs * v_ms + zs * zs * v_ss
        return math.sqrt(var) if var > 0.0 else (0.0 if var == 0.0 else math.inf)

    def _z(self, t: float) -> float:
        return (math.log(t) - self.mu) / self.sigma

    def cdf(self, t: float) -> float:
        """P(T <= t)."""
        if t <= 0:
            return 0.0
        if math.isinf(t):
            return 1.0
        return _q(-self._z(t))

    def sf(self, t: float) -> float:
        """P(T > t), accurate in the tail."""
        if t <= 0:
            return 1.0
        if math.isinf(t):
            return 0.0
        return _q(self._z(t))

    def log_sf(self, t: float) -> float:
        """log P(T > t), finite far beyond where :meth:`sf` underflows."""
        if t <= 0:
            return 0.0
        if math.isinf(t):
            return -math.inf
        return _log_q(self._z(t))

    def quantile(self, p: float) -> float:
        """The t with P(T <= t) = p (0 at p <= 0, inf at p >= 1)."""
        if p <= 0.0:
            return 0.0
        if p >= 1.0:
            return math.inf
        return math.exp(self.mu + self.sigma * normal_quantile(p))

    def survival_quantile(self, s: float) -> float:
        """The t with P(T > t) = s; precise for tiny s (late jobs)."""
        if s >= 1.0:
            return 0.0
        if s <= 0.0:
            return math.inf
        return math.exp(self.mu - self.sigma * normal_quantile(s)) if s < 0.5 else self.quantile(1.0 - s)

    @property
    def median(self) -> float:
        return math.exp(self.mu)

    @property
    def mean(self) -> float:
        return math.exp(self.mu + 0.5 * self.sigma * self.sigma)

    def partial_mean(self, t: float) -> float:
        """E[T; T <= t]: the part of the mean from jobs done by ``t``."""
        if t <= 0:
            return 0.0
        if math.isinf(t):
            return self.mean
        return self.mean * _q(-(self._z(t) - self.sigma))

    def conditional_cdf(self, t: float, given_alive_at: float) -> float:
        """P(T <= t | T > given_alive_at): a read at age ``t`` finds the job finished, given that
        it was still running at ``given_alive_at``. Stable for late jobs (tiny survival)."""
        a = max(0.0, given_alive_at)
        if t <= a:
            return 0.0
        if math.isinf(t):
            return 1.0
        if a == 0.0:
            return self.cdf(t)
        return -math.expm1(self.log_sf(t) - self.log_sf(a))


def recency_weight(age_of_observation_seconds: float, half_life_seconds: float) -> float:
    """Weight of an observation made ``age`` seconds ago: 1 now, 1/2 one half-life ago, ...
    (1 for a non-positive age or a non-positive/infinite half-life)."""
    if age_of_observation_seconds <= 0 or not half_life_seconds > 0 or math.isinf(half_life_seconds):
        return 1.0
    return math.exp(-math.log(2.0) * age_of_observation_seconds / half_life_seconds)


# -- the fit --------------------------------------------------------------------------------------

#: One prepared observation: (log lower or -inf, log upper or inf, weight, exact).
_Obs = tuple[float, float, float, bool]


def _prepare(intervals: Iterable[Interval]) -> list[_Obs]:
    out: list[_Obs] = []
    for iv in intervals:
        lo, hi, w = float(iv.lower), float(iv.upper), float(iv.weight)
        if math.isnan(lo) or math.isnan(hi) or not (w > 0 and math.isfinite(w)):
            continue
        lo = max(lo, 0.0)
        if hi < lo:
            lo, hi = hi, lo
        if hi <= 0.0 or (lo == 0.0 and math.isinf(hi)) or math.isinf(lo):
            continue  # says nothing: a job done at age 0, or "somewhere in (0, inf)"
        ly = math.log(lo) if lo > 0 else -math.inf
        uy = math.log(hi) if math.isfinite(hi) else math.inf
        exact = lo > 0 and math.isfinite(hi) and hi - lo <= _EXACT * hi
        out.append((0.5 * (ly + uy) if exact else ly, uy, w, exact))
    return out


def _loglik(obs: list[_Obs], mu: float, s: float, derivatives: bool
            ) -> tuple[float, float, float, float, float, float]:
    """Weighted log-likelihood in (mu, s = log sigma), with its gradient and Hessian if asked:
    (ll, g_mu, g_s, h_mumu, h_mus, h_ss)."""
    sigma = math.exp(s)
    inv = 1.0 / sigma
    ll = g_m = g_s = h_mm = h_ms = h_ss = 0.0
    for ly, uy, w, exact in obs:
        if exact:
            z = (ly - mu) * inv
            ll += w * (-0.5 * z * z - s - _LOG_SQRT_2PI)
            if derivatives:
                g_m += w * z * inv
                g_s += w * (z * z - 1.0)
                h_mm -= w * inv * inv
                h_ms -= w * 2.0 * z * inv
                h_ss -= w * 2.0 * z * z
            continue
        a = (ly - mu) * inv  # -inf when lower == 0
        b = (uy - mu) * inv  # +inf when censored
        lp = _log_mass(a, b)
        ll += w * lp
        if not derivatives:
            continue
        # ratios phi(a)/P, phi(b)/P and their moments; an infinite end contributes nothing
        ra = math.exp(-0.5 * a * a - _LOG_SQRT_2PI - lp) if math.isfinite(a) else 0.0
        rb = math.exp(-0.5 * b * b - _LOG_SQRT_2PI - lp) if math.isfinite(b) else 0.0
        a1 = a * ra if ra else 0.0
        b1 = b * rb if rb else 0.0
        a2 = a * a1 if ra else 0.0
        b2 = b * b1 if rb else 0.0
        a3 = a * a2 if ra else 0.0
        b3 = b * b2 if rb else 0.0
        gm = (ra - rb) * inv
        gs = a1 - b1
        g_m += w * gm
        g_s += w * gs
        h_mm += w * ((a1 - b1) * inv * inv - gm * gm)
        h_ms += w * (((a2 - ra) - (b2 - rb)) * inv - gm * gs)
        h_ss += w * ((a3 - a1) - (b3 - b1) - gs * gs)
    return ll, g_m, g_s, h_mm, h_ms, h_ss


def _start(obs: list[_Obs]) -> tuple[float, float]:
    """Moment estimates from one representative log age per interval."""
    ys: list[tuple[float, float]] = []
    for ly, uy, w, exact in obs:
        if exact or (math.isfinite(ly) and math.isfinite(uy)):
            y = 0.5 * (ly + uy)
        elif math.isfinite(uy):
            y = uy - math.log(2.0)  # finished by upper, never seen running
        else:
            y = ly + math.log(2.0)  # still running at lower
        ys.append((y, w))
    total = sum(w for _, w in ys)
    mean = sum(y * w for y, w in ys) / total
    var = sum(w * (y - mean) ** 2 for y, w in ys) / total
    return mean, math.log(min(max(math.sqrt(var), 0.3), 2.0))


def fit_lognormal(intervals: Iterable[Interval]) -> LogNormal:
    """Maximum-likelihood log-normal for weighted, interval-censored completion times.

    Raises ValueError when no interval says anything (empty, or only ``(0, inf)``). With only
    right-censored data the likelihood grows without bound as the median grows: the result is
    then the box's edge (20x the oldest age seen), which is why callers require
    :data:`MIN_OBSERVATIONS` completed observations (see :func:`model_from`).
    """
    obs = _prepare(intervals)
    if not obs:
        raise ValueError("no informative observation to fit")
    ages = [v for ly, uy, _, _ in obs for v in (ly, uy) if math.isfinite(v)]
    mu_lo, mu_hi = min(ages) - MU_MARGIN, max(ages) + MU_MARGIN
    s_lo, s_hi = math.log(MIN_SIGMA), math.log(MAX_SIGMA)

    def box(m: float, s: float) -> tuple[float, float]:
        return min(max(m, mu_lo), mu_hi), min(max(s, s_lo), s_hi)

    mu, s = box(*_start(obs))
    ll, gm, gs, hmm, hms, hss = _loglik(obs, mu, s, True)
    for _ in range(MAX_ITERATIONS):
        # Newton step on the negated Hessian, made positive definite (Levenberg) when needed.
        a, b, c = -hmm, -hms, -hss
        half_tr, det = 0.5 * (a + c), a * c - b * b
        low_eig = half_tr - math.sqrt(max(half_tr * half_tr - det, 0.0))
        if low_eig <= 1e-8 * max(abs(a) + abs(c), 1e-12):
            shift = 1e-6 * max(abs(a) + abs(c), 1.0) - low_eig
            a, c = a + shift, c + shift
            det = a * c - b * b
        dm = (c * gm - b * gs) / det
        ds = (a * gs - b * gm) / det
        step = 1.0
        for _ in range(40):
            nm, ns = box(mu + step * dm, s + step * ds)
            trial = _loglik(obs, nm, ns, True)
            if trial[0] >= ll - 1e-12 * abs(ll) and math.isfinite(trial[0]):
                break
            step *= 0.5
        else:
            break
        moved = abs(nm - mu) + abs(ns - s)
        gained = trial[0] - ll
        mu, s = nm, ns
        ll, gm, gs, hmm, hms, hss = trial
        if moved < 1e-9 or (moved < 1e-6 and gained < 1e-10 * (1.0 + abs(ll))):
            break
    return LogNormal(mu, math.exp(s), _covariance(obs, hmm, hms, hss))


def _covariance(obs: list[_Obs], hmm: float, hms: float, hss: float) -> tuple[float, float, float]:
    """The covariance of the fitted (mu, log sigma): the inverse of the observed information (the
    negated Hessian at the fit), scaled by sum w^2 / sum w so that recency weights count as the
    effective number of observations they amount to (Kish), not as repetitions. Where the
    information is not positive definite (a degenerate fit, e.g. at the box's edge) the error is
    unknown: infinite variances."""
    a, b, c = -hmm, -hms, -hss
    det = a * c - b * b
    if not (a > 0.0 and c > 0.0 and det > 0.0 and math.isfinite(det)):
        return (math.inf, 0.0, math.inf)
    total = sum(w for _, _, w, _ in obs)
    scale = sum(w * w for _, _, w, _ in obs) / total
    return (scale * c / det, -scale * b / det, scale * a / det)


def completed(intervals: Iterable[Interval]) -> int:
    """How many observations saw the job finish (a finite ``upper``): what MIN_OBSERVATIONS counts."""
    return sum(1 for iv in intervals if math.isfinite(iv.upper) and iv.upper > 0 and iv.weight > 0)


def bracketed(intervals: Iterable[Interval]) -> int:
    """How many completions were seen running first (``lower > 0``): only these tell *when* a job
    finished. An interval ``[0, u]`` says only "before u"; data of nothing else fits any median
    below the first read, and a schedule fitted to it would keep its first read late for good."""
    return sum(1 for iv in intervals if iv.lower > 0 and math.isfinite(iv.upper) and iv.weight > 0)


def model_from(intervals: Iterable[Interval], min_observations: int = MIN_OBSERVATIONS) -> LogNormal | None:
    """The fitted model, or None (use the static schedule, whose early reads bracket completions)
    below ``min_observations`` completions or when fewer than a third of them were bracketed."""
    items = list(intervals)
    if completed(items) < min_observations or bracketed(items) < min_observations // 3:
        return None
    return fit_lognormal(items)


def intervals_from(observations: Iterable[Mapping[str, object]], now: float,
                   half_life_seconds: float) -> list[Interval]:
    """Intervals from stored observations ``{"l": lower, "u": upper (missing/None: censored),
    "t": when observed}``, weighted by recency; malformed items are skipped."""
    out: list[Interval] = []
    for item in observations:
        lo, hi, at = item.get("l"), item.get("u"), item.get("t", now)
        try:
            lower = float(lo)  # type: ignore[arg-type]
            upper = math.inf if hi is None else float(hi)  # type: ignore[arg-type]
            when = float(at)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if math.isnan(lower) or math.isnan(upper) or math.isnan(when):
            continue
        out.append(Interval(lower, upper, recency_weight(now - when, half_life_seconds)))
    return out


def summary(model: LogNormal, observations: int) -> dict[str, float | int]:
    """What a human wants to see of a model (JSON-friendly)."""
    return {"median": round(model.median, 1), "p90": round(model.quantile(0.9), 1),
            "sigma": round(model.sigma, 3), "observations": int(observations)}

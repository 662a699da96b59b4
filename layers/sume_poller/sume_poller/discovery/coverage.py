"""What sweeps have proven, per kind, and what chains may rely on (one Redis hash, one ZSET per kind).

Sweeps (:mod:`sume_poller.discovery.sweep`) list Sume's terminal jobs in bulk, but the list route is not
documented, so nothing relies on a sweep until sweeps have *proven* they see a kind:

* a chain that finds a job terminal by its own status read reports it (:meth:`found`);
* each complete sweep checks those reports: a reported job it listed is *covered*; one that was
  terminal well before the sweep started (more than the list's lag allowance) but was not
  listed is a *miss*;
* a kind is covered once ``MIN_COVERED`` reports in a row were covered - or, while sweeps never
  missed one of its finds, once one was (a kind's first find: the wait for five made chains of
  a busy key read on the normal schedule for its first half hour, the reads a day-bound key
  can least spare) - sweeps are healthy (the last complete sweep is recent) and the route works.
  A miss resets it at once, and from the first miss on the kind needs ``MIN_COVERED`` in a row.
  A wrong stretch costs delay, never an outcome: a job is terminal only by its own routes, the
  canaries keep measuring, and the safety cadence reads every stretched chain.

Webhooks (where Sume sends them) cover a kind too, without proof: deliveries can be lost, and
the safety cadence is what catches a lost one, so chains of a webhook kind stretch while verified
deliveries keep arriving.

What chains found waits in a sorted set per kind (``!sweeps:found:<kind>``) until a complete sweep
judges it. Each set is bounded whatever sweeps do (they may be idle, or never complete): members
older than ``FOUND_MAX_AGE`` go, and at most ``FOUND_MAX`` of the newest stay - enough for any
sweep to judge the finds it can still see (a kind needs ``MIN_COVERED`` in a row).

Chains of a covered kind stretch to a safety cadence, except about one in twenty (canaries,
chosen by job id) that stay on the normal schedule and keep measuring coverage - read no more
often than sweeps run (a find is judged by the next complete sweep: reading more often than that
measures nothing more). Chains read
this state through :class:`CoverageView`, cached for ``COVERAGE_VIEW_TTL`` clock seconds per container,
so a stretched chain that hops every few minutes returns to the normal schedule soon after
sweeps stop proving anything.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Callable
from dataclasses import field
from typing import Any

from ..core.jobs import KINDS
from ..core.values import value
from ..limits.redisconn import RedisFailure

#: Covered finds in a row a kind needs once sweeps have missed one of its finds (before: one).
MIN_COVERED = 5
#: Bounds of each kind's set of chain finds waiting for a sweep's judgement (clock seconds; members).
FOUND_MAX_AGE = 86_400.0
FOUND_MAX = 1_000
CANARY_EVERY = 20
COVERAGE_VIEW_TTL = 30.0


def is_canary(job_id: str) -> bool:
    """About one chain in twenty stays on the normal schedule to keep measuring coverage."""
    return int(hashlib.sha256(job_id.encode()).hexdigest()[:8], 16) % CANARY_EVERY == 0


@value
class Coverage:
    """A snapshot: which kinds chains may stretch for, until when."""

    healthy_until: float = 0.0
    covered: frozenset[str] = frozenset()
    route: str = "unknown"
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # kind -> (covered in a row, misses)
    #: When a verified webhook delivery last arrived (clock seconds; 0: never).
    webhook_at: float = 0.0
    #: Clock seconds between sweeps, as the last complete one planned (0: unknown).
    every: float = 0.0

    def stretches(self, kind: str, now: float) -> bool:
        """Sweeps proved they see this kind, and are healthy."""
        return self.route == "ok" and now < self.healthy_until and kind in self.covered

    def proving(self, kind: str, now: float) -> bool:
        """Sweeps are healthy and have never missed a find of this kind, but none of its finds was
        judged yet (the first one listed covers it): its chains' reads between two sweeps measure
        nothing a sweep would not show first."""
        return (self.route == "ok" and now < self.healthy_until and kind not in self.covered
                and self.counts.get(kind, (0, 0))[1] == 0)

    def webhooks_arrive(self, now: float, within: float) -> bool:
        """Verified webhook deliveries arrived lately (a lost one is caught by the safety cadence)."""
        return now - self.webhook_at < within


class CoverageStore:
    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.key = f"{prefix}!sweeps"
        self.prefix = prefix

    def found_key(self, kind: str) -> str:
        return f"{self.prefix}!sweeps:found:{kind}"

    # -- chains ---------------------------------------------------------------------------------
    def found(self, kind: str, job_id: str, at: float, submitted: float | None = None,
              status: str | None = None) -> None:
        """A chain found this job terminal itself: the next complete sweeps must list it (the member
        carries the job's submission time and its status: a sweep that stopped paging at a creation
        time judges only the finds it could have listed, one that listed some statuses only the finds
        of those). Trims the kind's set to its bounds in the same round trip (one key: cluster mode
        runs it as is)."""
        key = self.found_key(kind)
        pipe = self.client.pipeline(transaction=False)
        member = job_id + ("" if submitted is None else f"|{int(submitted)}") if status is None else \
            f"{job_id}|{'' if submitted is None else int(submitted)}|{status}"
        pipe.zadd(key, {member: at})
        pipe.zremrangebyscore(key, "-inf", f"({at - FOUND_MAX_AGE}")
        pipe.zremrangebyrank(key, 0, -FOUND_MAX - 1)
        pipe.pexpire(key, int(FOUND_MAX_AGE * 1000))
        pipe.execute()

    def snapshot(self, now: float) -> Coverage:
        raw = self.client.hgetall(self.key)
        covered, counts = set(), {}
        for name, count in raw.items():
            if name.startswith("cov:"):
                kind = name[4:]
                counts[kind] = (int(count), int(raw.get(f"miss:{kind}", 0)))
                if int(count) >= (MIN_COVERED if counts[kind][1] else 1):
                    covered.add(kind)
        return Coverage(float(raw.get("healthy_until", 0)), frozenset(covered), raw.get("route", "unknown"), counts,
                        float(raw.get("webhook_at", 0)), float(raw.get("every", 0)))

    def webhook_arrived(self, at: float) -> None:
        """A verified webhook delivery arrived: chains of webhook kinds may stretch."""
        self.client.hset(self.key, "webhook_at", at)

    # -- sweeps ---------------------------------------------------------------------------------
    def state(self) -> dict[str, str]:
        return dict(self.client.hgetall(self.key))

    def update(self, **fields: Any) -> None:
        self.client.hset(self.key, mapping={k: str(v) for k, v in fields.items()})

    def judge(self, listed: dict[str, set[str]], swept_from: float, lag: float,
              created_after: float | None = None, statuses: frozenset[str] | None = None) -> dict[str, tuple[int, int]]:
        """After a complete sweep that started at ``swept_from``: per kind, (covered, missed)
        among the jobs chains reported. ``listed``: kind -> job ids this sweep listed. A sweep that
        stopped paging at a creation time (``created_after``) judges only finds submitted after it,
        one that listed only some ``statuses`` only finds of those (the others wait for a sweep that
        reaches them, or their set's bounds)."""
        kinds = sorted(KINDS | set(listed))
        pipe = self.client.pipeline(transaction=False)
        for kind in kinds:
            pipe.zrangebyscore(self.found_key(kind), "-inf", "+inf", withscores=True)
        verdicts: dict[str, tuple[int, int]] = {}
        for kind, found in zip(kinds, pipe.execute(), strict=True):
            seen = listed.get(kind, set())
            judged = [(m, at) for m, at in found if (created_after is None or _submitted(m) >= created_after)
                      and (statuses is None or _status(m) in statuses)]
            hits = [m for m, _ in judged if _job(m) in seen]
            misses = [m for m, at in judged if _job(m) not in seen and at < swept_from - lag]
            if hits or misses:
                self.client.zrem(self.found_key(kind), *hits, *misses)
            if misses:
                self.client.hset(self.key, mapping={f"cov:{kind}": 0, f"miss:{kind}": int(self.client.hget(
                    self.key, f"miss:{kind}") or 0) + len(misses)})
            elif hits:
                self.client.hincrby(self.key, f"cov:{kind}", len(hits))
            if hits or misses or kind in listed:
                verdicts[kind] = (len(hits), len(misses))
        return verdicts

    def fail(self, route: str, retry_at: float) -> None:
        """Sweeps cannot prove anything for now (route broken or forbidden, or a sweep failed):
        every kind returns to the normal schedule."""
        self.update(route=route, route_until=retry_at, healthy_until=0)

    def fail_status(self, status: str, retry_at: float) -> None:
        """The route does not filter by this status as assumed: sweeps leave it out until
        ``retry_at`` (proving nothing meanwhile), and every kind returns to the normal schedule."""
        self.update(**{f"unfiltered:{status}": retry_at}, healthy_until=0)


def _job(member: str) -> str:
    return member.partition("|")[0]


def _submitted(member: str) -> float:
    """A find's submission time (-inf when it was kept without one: never judged by a bounded sweep)."""
    parts = member.split("|")
    return float(parts[1]) if len(parts) > 1 and parts[1].isdigit() else -math.inf


def _status(member: str) -> str | None:
    """A find's status (None when it was kept without one: judged only by a sweep of every status)."""
    parts = member.split("|")
    return parts[2] if len(parts) > 2 else None


class CoverageView:
    """Per-container cache of :meth:`CoverageStore.snapshot` (Redis down: nothing stretches)."""

    def __init__(self, store: CoverageStore, now: Callable[[], float], ttl: float = COVERAGE_VIEW_TTL) -> None:
        self.store = store
        self.now = now
        self.ttl = ttl
        self._snapshot = Coverage()
        self._at = -1e18
        self._lock = threading.Lock()

    def get(self) -> Coverage:
        now = self.now()
        with self._lock:
            if now - self._at < self.ttl:
                return self._snapshot
        try:
            snapshot = self.store.snapshot(now)
        except RedisFailure:
            snapshot = Coverage()
        with self._lock:
            self._snapshot, self._at = snapshot, now
        return snapshot

"""The gate before a Sume read: the job's lease and a read slot, and what stands in for them while
Redis cannot be asked.

The lease (:mod:`sume_poller.limits.lease`) and the budget (:mod:`sume_poller.limits.budget`) are separate
concerns with separate keys; a poll needs both before it may read. On a standalone Redis one Lua
script runs both (the budget is taken only if the claim succeeded), so the limiter adds no round
trip to a poll. In cluster mode the per-job lease key and the budget key hash to different slots
and a script may only touch one slot: the claim and the take are then two scripts, one extra
round trip per poll that reads. A slot is taken only when the message claimed its own chain's
step: a claim that found the lease free (a new chain) reads the job record first, and takes its
slot after (:meth:`ReadGate.take`) only if the job still needs a read.

Redis failures stop here: :meth:`ReadGate.enter` answers a :class:`Passage` without a claim (the
caller falls back to the job record's fence), :meth:`ReadGate.take` falls back to this
container's outage pacer (:class:`~sume_poller.limits.pacer.LocalPacer`), and what Sume's replies say
(:meth:`ReadGate.tell`) or a key pause are best effort. Each failure is logged once by its kind
(:mod:`sume_poller.limits.redisconn`) and named in the passage or returned as a signal to count.
"""

from __future__ import annotations

import math
import time
from typing import Any

from ..core.observability import logger
from ..core.values import value
from .budget import BUDGET_LUA, Budget, Grant, Mode, RateInfo
from .lease import CLAIM_LUA, ChainStep, Claim, LeaseStore, new_nonce, new_token
from .pacer import LocalPacer
from .redisconn import UNAVAILABLE, Breaker, RedisFailure, describe, failure, lua_script, reconnect, slow

#: The lease key the cold-start probe uses (no job id starts with "!").
PROBE = "!probe"

#: The lease claim and the budget take in one script (gate.lua): its arguments are the claim's,
#: then the take's.
GATE = lua_script(__package__, "gate.lua", CLAIM_LUA + BUDGET_LUA)


@value
class Passage:
    """What the gate gave a message: its lease claim and its read slot."""

    #: None: Redis could not be asked (``failure`` says why); the caller polls without the lease.
    claim: Claim | None
    #: None when no slot was asked for (the message only hops) or the budget is unlimited.
    grant: Grant | None = None
    failure: str | None = None


class ReadGate:
    def __init__(self, lease: LeaseStore, budget: Budget, pacer: LocalPacer, *, cluster: bool,
                 breaker: Breaker | None = None) -> None:
        self.lease = lease
        self.budget = budget
        self.pacer = pacer
        self.cluster = cluster
        self.breaker = breaker or Breaker()
        self._gate = None if cluster else lease.client.register_script(GATE.source)
        #: Pending jobs as fan-out last counted them (the limiter passes it on with each grant).
        self.pending: int | None = None

    def enter(self, job_id: str, step: ChainStep, fresh: ChainStep, ttl_ms: int, *, mode: Mode = Mode.TAKE,
              max_wait: float = math.inf, slot: float = 0.0) -> Passage:
        """Claim ``step`` (or ``fresh`` if the lease is free); then, if ``step`` was claimed and
        ``mode`` is not :attr:`Mode.NONE`, take a read slot as ``mode`` asks (``slot``: the one a
        confirm reserved earlier)."""
        if self.breaker.open:
            return Passage(None, failure=UNAVAILABLE)
        mode = Mode.NONE if self.budget.unlimited else Mode(mode)
        try:
            if self._gate is None:
                claim = self.lease.claim(job_id, step, fresh, ttl_ms)
                if claim is not Claim.OWN or mode is Mode.NONE:
                    return Passage(claim)
                return Passage(claim, self._learn(self.budget.take(mode, max_wait, slot)))
            values = {**step.claim_values(fresh, ttl_ms), **self.budget.take_values(mode, max_wait, slot)}
            reply = self._gate(keys=[self.lease.key(job_id), *self.budget.keys], args=GATE.argv(values))
        except RedisFailure as exc:
            return Passage(None, failure=self.failed(exc, "polling without the lease"))
        claim = Claim(int(reply[0]))
        return Passage(claim, self._learn(Grant.from_reply(reply[1:])) if len(reply) > 1 else None)

    def take(self, mode: Mode = Mode.TAKE, max_wait: float = math.inf, slot: float = 0.0) -> Grant | None:
        """A read slot outside a claim (a fresh chain's, a second read in the same step); this
        container's outage pacer's while Redis cannot be asked. None: the budget is unlimited."""
        if self.budget.unlimited:
            return None
        if not self.breaker.open:
            try:
                return self._learn(self.budget.take(mode, max_wait, slot))
            except RedisFailure as exc:
                self.failed(exc, "pacing this read locally")
        return Grant(True, self.pacer.take())

    def slot_soon(self, max_wait: float, real_time_left: float) -> bool:
        """A read slot for a read outside a chain (the key check), taken ahead of the line: waited
        for here when it is at most ``max_wait`` clock seconds away and fits ``real_time_left`` (a
        fraction of a second: cheaper than re-queueing the job, whose next read would cost one more),
        then confirmed as any reserved read is (the budget's read log counts it when it happens);
        False, nothing reserved or the confirm not now, otherwise."""
        grant = self.take(Mode.AHEAD, max_wait=max_wait)
        if grant is None or grant.now:
            return True
        wait = self.budget.clock_to_real(grant.wait)
        if not grant.granted or wait > real_time_left:
            return False
        slot = self.budget.now() + grant.wait
        time.sleep(wait)
        confirmed = self.take(Mode.RCONFIRM, slot=slot)
        return confirmed is None or confirmed.now

    def pace(self) -> float:
        """Redis is down: seconds until this container's next outage slot (reserved)."""
        return self.pacer.take()

    def tell(self, rate: RateInfo, now: float) -> None:
        """What Sume's reply said of the key's budget (its 429 pauses the outage pacer too)."""
        if rate.retry_after is not None:
            self.pacer.pause(now + rate.retry_after)
        if rate.retry_after is None and not rate.worth_telling(self.budget.per_minute or None):
            return
        try:
            self.budget.feedback(rate)
        except RedisFailure as exc:
            self.failed(exc, "the budget was not told what Sume said")

    def pause_key(self, seconds: float) -> None:
        try:
            self.budget.pause_key(seconds)
        except RedisFailure as exc:
            self.failed(exc, "the key pause was not set")

    def failed(self, exc: BaseException, consequence: str) -> str:
        """Log a Redis failure once, by kind; the signal to count."""
        kind = failure(exc)
        if kind == UNAVAILABLE:
            if slow(exc):  # a refused connection fails at once: only timeouts are worth skipping
                self.breaker.trip()
            reconnect(self.lease.client, exc)
            logger.warning(f"Redis unavailable: {consequence}", extra=describe(exc))
        else:
            logger.error(f"Redis refused a command (misconfigured): {consequence}", extra=describe(exc))
        return kind

    def _learn(self, grant: Grant) -> Grant:
        if grant.pending is not None:
            self.pending = grant.pending
        self.pacer.learn(grant.day_left)
        return grant

    def probe(self) -> None:
        """One run of every script a poll runs, on a key no job uses (the cold-start check, see
        :func:`sume_poller.limits.redisconn.check`): the claim and the budget take together as a poll takes
        them (one script on two keys in standalone mode - a cluster endpoint refuses it), the
        budget's own script, and the release. Raises Redis's errors."""
        step = ChainStep(new_token(), 0, new_nonce())
        if self._gate is None:
            self.lease.claim(PROBE, step, step, 5_000)
        else:
            values: dict[str, Any] = {**step.claim_values(step, 5_000), **self.budget.take_values(Mode.NONE)}
            self._gate(keys=[self.lease.key(PROBE), *self.budget.keys], args=GATE.argv(values))
        if not self.budget.unlimited:
            self.budget.take(Mode.PEEK)
        self.lease.release(PROBE, step.claimed)

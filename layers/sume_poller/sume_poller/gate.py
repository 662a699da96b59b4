"""The gate before a Sume read: claim the job's lease and take a read slot in one round trip.

The lease (:mod:`sume_poller.lease`) and the budget (:mod:`sume_poller.budget`) are separate
concerns with separate keys; a poll needs both before it may read. A slot is taken only when the
message claimed its own chain's step: a claim that found the lease free (a new chain, or a message
that only finishes a terminal job's outbox) reads the job record first, and takes its slot after
(:meth:`Budget.take`) only if the job still needs a read. On a standalone Redis one
Lua script runs both (the budget is taken only if the claim succeeded), so the limiter adds no
round trip to a poll. In cluster mode the per-job lease key and the global budget key hash to
different slots and a script may only touch one slot: the claim and the take are then two
scripts, one extra round trip per poll that reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .budget import BUDGET_LUA, Budget, Grant
from .lease import CLAIM_LUA, Claim, LeaseStore, Step, new_nonce, new_token

#: The lease key the cold-start probe uses (no job id starts with "!").
PROBE = "!probe"

GATE_LUA = CLAIM_LUA + BUDGET_LUA + """
local c = lease_claim(KEYS[1], ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[6])
if c ~= 1 or ARGV[8] == 'none' then return {c} end
local g = budget_take(KEYS[2], tonumber(ARGV[7]), ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10]),
                      ARGV[11], ARGV[12], tonumber(ARGV[13]))
return {c, g[1], g[2], g[3], g[4], g[5]}
"""


@dataclass(frozen=True, slots=True)
class Passage:
    claim: Claim
    #: None when no slot was asked for (the message only hops) or the budget is unlimited.
    grant: Grant | None = None


class ReadGate:
    def __init__(self, lease: LeaseStore, budget: Budget, *, cluster: bool) -> None:
        self.lease = lease
        self.budget = budget
        self.cluster = cluster
        self._gate = None if cluster else lease.client.register_script(GATE_LUA)

    def enter(self, job_id: str, step: Step, fresh: Step, ttl_ms: int, *, mode: str = "take",
              max_wait: float = math.inf, slot: float = 0.0) -> Passage:
        """Claim ``step`` (or ``fresh`` if the lease is free); then, if ``step`` was claimed and
        ``mode`` is not "none", take a read slot ("take" a new one, or "confirm" the one reserved
        at ``slot``)."""
        if self.budget.unlimited:
            mode = "none"
        if self._gate is None:
            claim = self.lease.claim(job_id, step, fresh, ttl_ms)
            if claim is not Claim.OWN or mode == "none":
                return Passage(claim)
            return Passage(claim, self.budget.take(mode, max_wait, slot))
        args = step.claim_args(fresh, ttl_ms) + self.budget.take_args(mode, max_wait, slot)
        if mode == "none":
            args[7] = "none"
        reply = self._gate(keys=[self.lease.key(job_id), self.budget.key], args=args)
        claim = Claim(int(reply[0]))
        return Passage(claim, Grant.from_reply(reply[1:]) if len(reply) > 1 else None)

    def probe(self) -> None:
        """One run of every script a poll runs, on a key no job uses (the cold-start check, see
        :func:`sume_poller.redisconn.check`): the claim and the budget take together as a poll takes
        them (one script on two keys in standalone mode - a cluster endpoint refuses it), the
        budget's own script, and the release."""
        step = Step(new_token(), 0, new_nonce())
        self.enter(PROBE, step, step, 5_000, mode="none")
        if not self.budget.unlimited:
            self.budget.take("peek")
        self.lease.release(PROBE, step.claimed)

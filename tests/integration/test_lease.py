"""The lease protocol (lease.py) on a real redis-server: every operation, its repeat after a lost
reply, duplicates, stale chains and sweeps."""

from __future__ import annotations

import pytest
import redis

from sume_poller.limits.lease import ChainStep, Claim, LeaseStore, new_nonce, new_token

pytestmark = pytest.mark.integration
TTL = 60_000


@pytest.fixture
def lease(rdb: redis.Redis) -> LeaseStore:
    return LeaseStore(rdb, prefix="t:lease:")


def claim(lease: LeaseStore, job_id: str, step: ChainStep) -> Claim:
    """``step`` claims the job's lease (a fresh chain of its own nonce if the lease is free)."""
    return lease.claim(job_id, step, ChainStep(new_token(), 0, step.nonce), TTL)


def steps(seq: int = 0) -> tuple[ChainStep, ChainStep]:
    nonce = new_nonce()
    return ChainStep(new_token(), seq, nonce), ChainStep(new_token(), 0, nonce)


def test_a_chain_walks_start_claim_rest_claim_release(lease: LeaseStore, rdb: redis.Redis) -> None:
    token = new_token()
    assert lease.start("job_a", token, TTL)
    first = ChainStep(token, 0, new_nonce())
    assert claim(lease, "job_a", first) is Claim.OWN
    assert rdb.get("t:lease:job_a") == first.claimed
    assert lease.rest("job_a", first, TTL)
    assert rdb.get("t:lease:job_a") == f"{token}:1"
    second = ChainStep(token, 1, new_nonce())
    assert claim(lease, "job_a", second) is Claim.OWN
    assert lease.release("job_a", second.claimed)
    assert rdb.get("t:lease:job_a") is None


def test_every_operation_is_safe_to_repeat(lease: LeaseStore, rdb: redis.Redis) -> None:
    """What redis-py does after a timeout: send the same script again, which may already have run."""
    token = new_token()
    assert lease.start("job_r", token, TTL) and lease.start("job_r", token, TTL)
    step = ChainStep(token, 0, new_nonce())
    fresh = ChainStep(new_token(), 0, step.nonce)
    assert lease.claim("job_r", step, fresh, TTL) is Claim.OWN
    assert lease.claim("job_r", step, fresh, TTL) is Claim.OWN
    assert lease.rest("job_r", step, TTL) and lease.rest("job_r", step, TTL)
    nxt = ChainStep(token, 1, new_nonce())
    assert claim(lease, "job_r", nxt) is Claim.OWN
    assert lease.release("job_r", nxt.claimed) and lease.release("job_r", nxt.claimed)
    # A free lease taken as a fresh chain, claimed again with the same arguments: still ours.
    step, fresh = steps()
    assert lease.claim("job_f", step, fresh, TTL) is Claim.FRESH
    assert lease.claim("job_f", step, fresh, TTL) is Claim.FRESH
    assert rdb.get("t:lease:job_f") == fresh.claimed


def test_a_duplicate_delivery_of_the_same_step_is_refused(lease: LeaseStore) -> None:
    token = new_token()
    lease.start("job_d", token, TTL)
    first, copy = ChainStep(token, 0, new_nonce()), ChainStep(token, 0, new_nonce())
    assert claim(lease, "job_d", first) is Claim.OWN
    assert claim(lease, "job_d", copy) is Claim.HELD
    assert lease.rest("job_d", first, TTL)
    # ... and after the chain moved on, the late copy of step 0 still cannot act.
    assert claim(lease, "job_d", copy) is Claim.HELD


def test_a_free_lease_starts_a_new_chain_so_a_stale_message_cannot_renew_it(lease: LeaseStore,
                                                                             rdb: redis.Redis) -> None:
    """The lease expired; a late duplicate of step 3 arrives first and takes it - as a new chain.
    The old chain's real next message (step 4) then finds a foreign token and drops itself."""
    old = new_token()
    rdb.set("t:lease:job_s", f"{old}:3", px=TTL)
    rdb.delete("t:lease:job_s")  # expired
    late = ChainStep(old, 3, new_nonce())
    fresh = ChainStep(new_token(), 0, late.nonce)
    assert lease.claim("job_s", late, fresh, TTL) is Claim.FRESH
    assert rdb.get("t:lease:job_s") == fresh.claimed
    real_next = ChainStep(old, 4, new_nonce())
    assert claim(lease, "job_s", real_next) is Claim.HELD


def test_a_chain_that_moved_on_without_redis_takes_back_its_own_older_lease(lease: LeaseStore,
                                                                            rdb: redis.Redis) -> None:
    token = new_token()
    rdb.set("t:lease:job_o", f"{token}:2", px=TTL)
    later = ChainStep(token, 5, new_nonce())
    assert claim(lease, "job_o", later) is Claim.OWN
    other = ChainStep(new_token(), 9, new_nonce())
    assert claim(lease, "job_o", other) is Claim.HELD


def test_a_later_step_waits_while_a_delivery_of_an_older_step_holds_its_claim(lease: LeaseStore,
                                                                               rdb: redis.Redis) -> None:
    """Seed 31856 of the simulation: while Redis was down the chain took step 1 under the record's
    fence and sent step 2; an SQS duplicate of step 1 claimed the lease first once Redis was back,
    and step 2 took it from under that delivery's read. Now step 2 is told busy and takes nothing."""
    token = new_token()
    rdb.set("t:lease:job_b", f"{token}:0", px=TTL)
    stale = ChainStep(token, 1, new_nonce())
    assert claim(lease, "job_b", stale) is Claim.OWN
    current = ChainStep(token, 2, new_nonce())
    assert claim(lease, "job_b", current) is Claim.BUSY
    assert rdb.get("t:lease:job_b") == stale.claimed
    # The stale delivery rests its chain on step 2 (its own next message): the current one is that step.
    assert lease.rest("job_b", stale, TTL)
    assert claim(lease, "job_b", current) is Claim.OWN
    # ... or it finished the job and released the lease: the current step is a fresh chain.
    assert lease.release("job_b", current.claimed)
    assert claim(lease, "job_b", current) is Claim.FRESH


def test_release_and_rest_never_touch_another_chains_lease(lease: LeaseStore, rdb: redis.Redis) -> None:
    mine = ChainStep(new_token(), 0, new_nonce())
    rdb.set("t:lease:job_x", "f" * 32 + ":7", px=TTL)
    assert not lease.rest("job_x", mine, TTL)
    assert not lease.release("job_x", mine.claimed)
    assert rdb.get("t:lease:job_x") == "f" * 32 + ":7"


def evalsha_calls(rdb: redis.Redis) -> int:
    return int(rdb.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_start_many_runs_one_script_per_job_in_one_pipeline_and_skips_held_jobs(lease: LeaseStore,
                                                                               rdb: redis.Redis) -> None:
    rdb.set("t:lease:job_2", "a" * 32 + ":0", px=TTL)
    lease.start_many([("job_warm", new_token())], TTL)  # loads the script once
    before, checks = evalsha_calls(rdb), script_exists_calls(rdb)
    started = lease.start_many([(f"job_{i}", new_token()) for i in range(5)], TTL)
    assert started == [True, True, False, True, True]
    assert evalsha_calls(rdb) - before == 5
    assert script_exists_calls(rdb) == checks  # no second round trip to check the script first


def script_exists_calls(rdb: redis.Redis) -> int:
    return int(rdb.info("commandstats").get("cmdstat_script|exists", {}).get("calls", 0))


def test_start_many_loads_its_script_again_when_redis_lost_it(lease: LeaseStore, rdb: redis.Redis) -> None:
    lease.start_many([("job_a", new_token())], TTL)
    rdb.script_flush()  # what a restart or a failover to a fresh replica does
    assert lease.start_many([("job_b", new_token()), ("job_a", new_token())], TTL) == [True, False]


def test_a_waiting_chain_is_handed_over_to_a_finishing_message(lease: LeaseStore, rdb: redis.Redis) -> None:
    token = new_token()
    rdb.set("t:lease:job_w", f"{token}:4", px=TTL)
    assert lease.hand_over("job_w", new_token(), TTL) == (token, 5, None)
    waiting = ChainStep(token, 4, new_nonce())  # the chain's queued message finds the job taken
    assert claim(lease, "job_w", waiting) is Claim.HELD
    assert rdb.get("t:lease:job_w") == f"{token}:5*"
    finishing = ChainStep(token, 5, new_nonce())
    assert claim(lease, "job_w", finishing) is Claim.OWN
    assert lease.hand_over("job_w", new_token(), TTL) is None  # mid-poll: left alone
    rdb.set("t:lease:job_h", f"{token}:7*", px=TTL)
    assert lease.hand_over("job_h", new_token(), TTL) is None  # handed over already: keeps its place
    fresh = new_token()
    assert lease.hand_over("job_free", fresh, TTL) == (fresh, 0, None)


def test_a_chain_waiting_to_fetch_a_result_rests_as_finishing_and_is_not_handed_over(lease: LeaseStore,
                                                                                    rdb: redis.Redis) -> None:
    token = new_token()
    rdb.set("t:lease:job_r", f"{token}:2", px=TTL)
    step = ChainStep(token, 2, new_nonce())
    assert claim(lease, "job_r", step) is Claim.OWN
    assert lease.rest("job_r", step, TTL, finishing=True)  # it saw the job finished: the result next
    assert rdb.get("t:lease:job_r") == f"{token}:3*"
    assert lease.hand_over("job_r", new_token(), TTL) is None  # a sweep leaves it its reserved slot
    nxt = ChainStep(token, 3, new_nonce())
    assert claim(lease, "job_r", nxt) is Claim.OWN


def test_a_step_waiting_on_a_reserved_read_slot_passes_it_to_whoever_takes_its_place(lease: LeaseStore,
                                                                                    rdb: redis.Redis) -> None:
    token = new_token()
    rdb.set("t:lease:job_s", f"{token}:1", px=TTL)
    step = ChainStep(token, 1, new_nonce())
    assert claim(lease, "job_s", step) is Claim.OWN
    assert lease.rest("job_s", step, TTL, slot=1_800_000_123.456)  # step 2 waits for its read slot
    assert rdb.get("t:lease:job_s") == f"{token}:2@1800000123456"
    waiting = ChainStep(token, 2, new_nonce())
    assert claim(lease, "job_s", waiting) is Claim.OWN  # it may act
    assert lease.rest("job_s", waiting, TTL, slot=1_800_000_200.0)
    assert lease.hand_over("job_s", new_token(), TTL) == (token, 4, 1_800_000_200.0)  # the slot goes with it
    late = ChainStep(token, 3, new_nonce())  # the fenced step never reads, so the slot is used once
    assert claim(lease, "job_s", late) is Claim.HELD


def test_a_hand_over_lease_lives_until_the_inherited_slot_plus_the_margin(lease: LeaseStore, rdb: redis.Redis) -> None:
    """The waiting step reserved a read slot 5 clock minutes away; the finishing message inherits
    it and is due then. Its lease must outlive that wait (a lapsed lease lets the fenced step take
    the job as a fresh chain and read the status of a job already known to be finished)."""
    token, now = new_token(), 1_800_000_000.0
    slot = now + 300.0
    rdb.set("t:lease:job_slow", f"{token}:3@{int(slot * 1000)}", px=TTL)
    held = lease.hand_over("job_slow", new_token(), 60_000, now=now, scale=0.5, margin_ms=120_000)
    assert held == (token, 4, slot)
    # 300 clock s at 0.5 real s each, plus the 120 s margin: 270 real seconds, not the claim's 60
    assert 269_000 < rdb.pttl("t:lease:job_slow") <= 270_000
    rdb.set("t:lease:job_now", f"{token}:3", px=TTL)  # no slot: the claim's TTL
    lease.hand_over("job_now", new_token(), 60_000, now=now, scale=0.5, margin_ms=120_000)
    assert 59_000 < rdb.pttl("t:lease:job_now") <= 60_000

"""The lease scripts against a real redis-server."""

from __future__ import annotations

import redis

from sume_poller.lease import LeaseStore, new_token
from tools.services import RedisServer


def test_acquire_renew_release_only_with_the_matching_value(redis_server: RedisServer) -> None:
    r = redis.Redis.from_url(redis_server.url, decode_responses=True)
    lease = LeaseStore(r, prefix="t:lease:")
    job = "job_" + new_token()[:8]
    mine, theirs = f"{new_token()}:1", f"{new_token()}:1"
    assert lease.acquire(job, mine, 5_000)
    assert not lease.acquire(job, theirs, 5_000)  # SET NX: never takes a held lease
    assert r.get(f"t:lease:{job}") == mine

    assert not lease.renew(job, theirs, theirs, 60_000)  # wrong value: 0, nothing changes
    assert r.get(f"t:lease:{job}") == mine and r.pttl(f"t:lease:{job}") <= 5_000
    assert lease.renew(job, mine, mine, 60_000)  # replaces the TTL (here: lengthens)
    assert 55_000 < r.pttl(f"t:lease:{job}") <= 60_000
    assert lease.renew(job, mine, mine, 1_000)  # replaces, does not only extend
    assert r.pttl(f"t:lease:{job}") <= 1_000
    advanced = mine.rsplit(":", 1)[0] + ":2"
    assert lease.renew(job, mine, advanced, 5_000)  # claim: moves the fence to the next seq
    assert not lease.renew(job, mine, mine, 5_000)  # the old message no longer owns it

    assert not lease.release(job, mine)  # stale value cannot delete the holder's lease
    assert r.exists(f"t:lease:{job}")
    assert lease.release(job, advanced)
    assert not r.exists(f"t:lease:{job}")
    assert not lease.renew(job, advanced, advanced, 5_000)  # lost: 0


def test_live_is_one_pipelined_round_trip_and_reports_the_auth_pause(redis_server: RedisServer) -> None:
    r = redis.Redis.from_url(redis_server.url, decode_responses=True)
    lease = LeaseStore(r, prefix="t:live:")
    jobs = [f"job_{i}" for i in range(5)]
    lease.acquire(jobs[1], "x:1", 5_000)
    lease.acquire(jobs[3], "x:1", 5_000)
    r.config_resetstat()
    paused, live = lease.live(jobs)
    stats = r.info("commandstats")
    assert (paused, live) == (False, [False, True, False, True, False])
    assert stats["cmdstat_exists"]["calls"] == 6  # 5 jobs + the auth pause, one pipeline
    lease.pause_auth(5)
    assert lease.live(jobs)[0] is True


def test_tokens_are_random_and_at_least_16_bytes() -> None:
    tokens = {new_token() for _ in range(1000)}
    assert len(tokens) == 1000 and all(len(t) == 32 for t in tokens)

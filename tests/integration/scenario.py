"""Driving scenarios on the in-process stack: a module-scoped stack per test module (each has its
own clock scale and parameters; all of a test process's stacks share its one moto server), a fresh
state per test, submitting simulated jobs, running them."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pytest
import redis

from sume_poller.creates.createqueue import drain_lease
from sume_poller.store.records import STATS_PREFIX
from sume_poller.store.submissions import QUEUED, submission_id
from tools.services import MotoServer
from tools.stack.inprocess import InProcessStack

#: Leases short in real time, so recovery after a crash takes seconds (the template's minimum
#: claim is 31 s: above the function timeout); Sume timeouts to match (the claim must outlast them).
FAST_LEASES = {"CLAIM_TTL_SECONDS": "2", "LEASE_MARGIN_SECONDS": "1", "START_LEASE_SECONDS": "3",
               "SUME_CONNECT_TIMEOUT": "0.5", "SUME_READ_TIMEOUT": "1"}
#: Leases (and a Sume read timeout) that outlast any in-process invocation and queue backlog, even
#: on a busy CI machine, for scenarios that count every read.
SAFE_LEASES = {**FAST_LEASES, "CLAIM_TTL_SECONDS": "20", "LEASE_MARGIN_SECONDS": "10", "START_LEASE_SECONDS": "20",
               "SUME_READ_TIMEOUT": "5"}
NO_CREATE_BUDGET = {"CreatesPerMinute": 0, "CreatesPerDay": 0}
#: The learned schedule's system tests: 10x fast, with no read budget, so the handlers keep up
#: with the schedule even on a busy machine and the reads counted are the schedule's.
SCHEDULE_SCALE = 0.1
SCHEDULE_PARAMETERS = {**NO_CREATE_BUDGET, "ReadsPerMinute": 0, "ReadsPerDay": 0}
#: The fault suite (test_faults_*.py): 50x fast, 12 jobs a scenario, leases that expire quickly.
FAULT_SCALE = 0.02
FAULT_JOBS = 12
CLAIM_TTL_REAL = float(FAST_LEASES["CLAIM_TTL_SECONDS"])


#: Under every scenario's parameters: two pending partitions, not eight - fan-out's index queries
#: are the in-process stack's costliest calls (moto), and it runs every real second; partitioning
#: itself is tested in test_fanout.py.
SCENARIO_DEFAULTS = {"PendingShards": 2}


def stack_fixtures(scale: float, parameters: Mapping[str, Any], env: Mapping[str, str], *, name: str = "stack",
                   **options: Any) -> tuple[Any, Any]:
    """(module_stack, stack) fixtures: one stack per module, reset before each test (``name``: the
    fixtures' names, ``module_<name>`` and ``<name>``, for a second stack in one module)."""

    @pytest.fixture(scope="module", name=f"module_{name}")
    def module_stack(moto_server: MotoServer) -> Iterator[InProcessStack]:
        with InProcessStack(time_scale=scale, parameters={**SCENARIO_DEFAULTS, **parameters}, env=dict(env),
                            moto=moto_server, **options) as stack:
            yield stack

    @pytest.fixture(name=name)
    def stack(request: pytest.FixtureRequest) -> Iterator[InProcessStack]:
        module_stack: InProcessStack = request.getfixturevalue(f"module_{name}")
        module_stack.reset()
        yield module_stack
        module_stack.step_hook = None
        module_stack.fast_retry = True

    return module_stack, stack


def fault_suite_fixtures() -> tuple[Any, Any]:
    """The fault suite's (module_stack, stack): a 404 is read-after-create lag for 5 clock minutes, and
    refusals the contract does not name are recorded after 5 clock minutes of them (the shortest window)."""
    return stack_fixtures(FAULT_SCALE, {**NO_CREATE_BUDGET, "NotFoundGraceSeconds": 300, "RefusalWindowSeconds": 300},
                          FAST_LEASES)


@contextmanager
def drain_running(stack: InProcessStack, key_id: str = "default") -> Iterator[None]:
    """Hold the key's drain lease, as a running drain does: every submission meanwhile queues behind it,
    however slowly the submissions arrive (else one that comes after the create budget's next slot - on a
    compressed clock a fraction of a real second away - is created at once: what queues would depend on
    the machine's speed).
    On leaving, the lease is freed with nothing to drain it: fan-out restarts the drain, as after one died."""
    name = "sume:poll:" + drain_lease(key_id)
    with redis.Redis.from_url(stack.redis_url) as client:
        assert client.set(name, "held-by-the-test:0", nx=True, px=120_000), "a drain runs already"
        try:
            yield
        finally:
            client.delete(name)


def submit(stack: InProcessStack, n: int, sim: dict[str, Any] | Callable[[int], dict[str, Any]],
           kind: str = "image", key: str | None = None) -> list[str]:
    """``n`` submissions whose simulated jobs follow ``sim`` (or ``sim(i)``), to Sume key ``key``
    (None: the default key); their job ids."""
    ids = []
    for i in range(n):
        spec = sim(i) if callable(sim) else sim
        event = {"kind": kind, "params": {"prompt": uuid.uuid4().hex, "sim": spec}, **({"key": key} if key else {})}
        reply = stack.submit(event)
        assert reply["status"] == "submitted", reply
        assert reply["key"] == (key or "default"), reply
        ids += reply["job_ids"]
    return ids


def rotate_key(stack: InProcessStack, key_id: str) -> str:
    """The simulator rotates ``key_id``'s API key (the old one answers 401 from now on), then the
    key configuration takes the new one; the new API key. A reset restores the old one."""
    new = f"sume_local_{key_id}_{uuid.uuid4().hex}"
    stack.sim.rotate_key(stack.keys[key_id], new)
    stack.keys[key_id] = new
    stack.store_keys()
    return new


def remove_key(stack: InProcessStack, key_id: str, *, at_sume: bool = False) -> None:
    """``key_id`` leaves the key configuration (``at_sume``: the simulator refuses its API key too)."""
    api_key = stack.keys.pop(key_id)
    if at_sume:
        stack.sim.remove_key(api_key)
    stack.store_keys()


def run(stack: InProcessStack, ids: list[str], timeout: float = 60, **drive: Any) -> None:
    """Drive the stack (schedules every real second) until every job is settled."""
    stack.drive(lambda: stack.settled(ids), timeout, fanout_every=drive.pop("fanout_every", 1.0), **drive)


def observations(stack: InProcessStack, profile: str) -> dict[str, object]:
    """The completion-time observations of one profile's statistics item."""
    item = stack.table.get(STATS_PREFIX + profile) or {}
    return {k: v for k, v in item.items() if k.startswith("o")}


def status_reads(stack: InProcessStack, ids: list[str]) -> int:
    jobs = stack.sim.stats()["jobs"]
    return sum(jobs[j]["status_reads"] for j in ids if j in jobs)


def found_by(stack: InProcessStack, ids: list[str]) -> Counter[str]:
    """Who found each job finished: its chain, a sweep or a webhook (from the job records)."""
    return Counter(str(r.get("found_by")) for r in stack.table.get_many(ids).values())


def submission(stack: InProcessStack, key: str) -> dict[str, Any]:
    """The default key's submission record of idempotency key ``key`` (queued, created or rejected)."""
    record = stack.table.get(submission_id("default", key))
    assert record is not None, key
    return record


def settled(stack: InProcessStack, keys: list[str]) -> bool:
    """None of these submissions is still queued."""
    return all(submission(stack, k)["status"] != QUEUED for k in keys)

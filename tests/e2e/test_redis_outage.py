"""A Redis outage on the deployed stack at Sume's documented read budgets (120 a minute, 10,000 a
day: the template's defaults, compressed with the clock like every duration): Redis stops right
after 48 submissions whose jobs Sume finishes in 4-12 clock seconds, for 5 clock minutes. Jobs keep
moving on each container's outage pacer (a share of the minute limit and of what the day has left,
not of the day's average rate): every job Sume finished during the outage is recorded before Redis
returns, and no step that waited for the pacer reserves a second slot.

A stack of its own (the tier's shared one runs a binding 30-a-minute budget), deployed once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from tools.stack.deployed import DeployedStack

pytestmark = pytest.mark.e2e

SCALE = 0.05
OUTAGE = 300.0  # clock seconds
#: Sume's documented budgets (the template's defaults); two poll containers share them while Redis
#: is down (PollMaxConcurrency: each paces itself to half the minute limit).
PARAMETERS = {"PollMaxConcurrency": 2, "JobMaxAgeSeconds": 3_600, "CreatesPerMinute": 0, "CreatesPerDay": 0,
              "Sweeps": "false"}


@pytest.fixture(scope="module")
def outage_stack() -> Iterator[DeployedStack]:
    with DeployedStack(time_scale=SCALE, parameters=PARAMETERS, stack_name="sume-poller-e2e-outage",
                       sim_options={"read_budget": {"per_minute": 120, "per_day": 10_000}}) as stack:
        yield stack


def test_a_five_minute_redis_outage_at_the_documented_budgets_records_every_finished_job(
        outage_stack: DeployedStack) -> None:
    stack = outage_stack
    ids = []
    for i in range(48):
        reply = stack.submit({"kind": "image", "params": {"prompt": f"outage {uuid.uuid4().hex}",
                                                          "sim": {"duration": 4 + i % 9, "steps": 2}}})
        assert reply["status"] == "submitted", reply
        ids += reply["job_ids"]
    stack.redis_server.stop()
    # Redis stays down until every job is recorded: the claim is that nothing needs it, not how fast a
    # machine gets there (a loaded CI run recorded 47 of 48 in the 5 clock minutes, 15 real seconds);
    # three outages' time at most, as the pacer paces reads through any length of outage.
    down_until = time.monotonic() + 3 * stack.clock.to_real(OUTAGE)
    try:
        pending_at_stop = sum(1 for r in stack.records(ids) if r["status"] == "pending")
        stack.drive(lambda: stack.settled(ids) or time.monotonic() >= down_until, 3 * stack.clock.to_real(OUTAGE) + 30)
        recorded_while_down = [r["job_id"] for r in stack.records(ids) if r["status"] != "pending"]
        reads_while_down = stack.sim.stats()
    finally:
        stack.redis_server.start()
    assert pending_at_stop > 0, "every job finished before Redis stopped: the outage tested nothing"
    assert len(recorded_while_down) == len(ids), (  # all of them finished at Sume within 12 clock seconds
        f"{len(ids) - len(recorded_while_down)} of {len(ids)} jobs Sume finished were not recorded during the "
        f"outage ({pending_at_stop} pending when Redis stopped); {stack.pending_summary(ids)}")
    stack.drive(lambda: stack.settled(ids), 60)
    records = stack.records(ids)
    assert {r["status"] for r in records} == {"completed"} and all(r.get("result_json") for r in records)
    jobs = reads_while_down["jobs"]
    assert reads_while_down["rate_limited"] == 0  # inside Sume's limits without the shared limiter
    assert all(jobs[j]["status_reads"] <= jobs[j]["min_reads"] + 2 for j in ids), {
        j: (jobs[j]["status_reads"], jobs[j]["min_reads"]) for j in ids}
    events = [e for e in stack.events() if e.get("job_id") in set(ids)]
    assert len({e["event_id"] for e in events}) == len(ids)

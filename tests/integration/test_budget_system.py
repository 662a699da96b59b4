"""The shared read budget on the whole system (in-process stack): 30 jobs against a Sume that allows
the key 40 reads a minute, on a compressed clock (TimeScale 0.1: a clock minute is 6 real seconds,
so SQS's one-second delays stay small against Sume's minute windows, as they are on AWS)."""

from __future__ import annotations

from typing import Any

import pytest
from invariants import check
from scenario import NO_CREATE_BUDGET, SAFE_LEASES, stack_fixtures, submit

from bench.fig_budget import most_in_a_minute  # the figure's own count, held to the limit here too
from tools.stack.inprocess import InProcessStack

pytestmark = pytest.mark.integration

SCALE = 0.1
LIMIT = 40
#: Sweeps off: their lane would keep 5 reads a minute of the 40 for list reads.
PARAMETERS = {**NO_CREATE_BUDGET, "ReadsPerMinute": LIMIT, "ReadsPerDay": 0, "Sweeps": "false"}


module_stack, stack = stack_fixtures(SCALE, PARAMETERS, SAFE_LEASES,
                                     sim_options={"read_budget": {"per_minute": LIMIT, "per_day": None}})


def windows(stack: InProcessStack) -> list[dict[str, int]]:
    return [w for w in stack.sim.budget_stats()["reads"]["60"] if w["attempts"]]


@pytest.mark.parametrize("other_share", [0.0, 0.1], ids=["alone", "with another client of the key"])
def test_every_job_finishes_with_its_result_inside_the_budget(stack: InProcessStack, other_share: float,
                                                               grants: dict[str, list[float]]) -> None:
    stack.sim.configure(other_consumer_share=other_share)
    ids = submit(stack, 30, {"duration": 30, "steps": 2, "hints": False})
    stack.drive(lambda: stack.settled(ids), 120, fanout_every=1.0)
    other = ", another client takes 10 %" if other_share else ""
    verdict = check(stack, ids, scenario=f"read budget binds ({LIMIT}/min){other}", expected="completed",
                    allowance=100)
    jobs = stack.sim.stats()["jobs"]
    after = {j: (jobs[j], stack.record(j)) for j in ids if jobs[j]["status_reads_after_terminal"]}
    assert not after, f"status reads after a terminal one: {after}"
    assert all(stack.record(j)["result_json"] for j in ids)  # type: ignore[index]
    # Inside the budget: no 60 s of the limiter's clock hold more grants than the limit (the other
    # client is Sume's business). Counted where the limiter grants, not where Sume counts: on this
    # 10x clock a real second of a loaded machine between a grant and its request is 10 clock
    # seconds, which can carry a read granted at a window's end into Sume's next one - and so the
    # 429s that meets are the machine's speed, not the limiter's (bench figure 8, on a virtual clock
    # without that lag, holds them to <= 0.1 %); a 429 is retried, as every job's result above shows.
    granted = [t for times in grants.values() for t in times]  # the default key's budget only
    assert len(grants) == 1 and most_in_a_minute(granted) <= LIMIT, (list(grants), most_in_a_minute(granted), LIMIT)
    attempts = sum(w["attempts"] for w in windows(stack))
    refused = sum(w["refused"] for w in windows(stack))
    assert attempts <= len(granted), (attempts, len(granted))  # no read reached Sume without its grant
    verdict.extra.update(attempts=attempts, refused=refused, granted=len(granted))


def test_stuck_outboxes_take_no_read_slot_from_running_jobs(stack: InProcessStack,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """20 terminal jobs whose event EventBridge keeps refusing, for 5 clock minutes, beside 20
    running jobs that want more reads than the budget: fan-out's outbox messages (re-sent after
    doubling waits) take no read slot, so the running jobs get the budget (the limiter grants 38.6 of
    40 a minute: 0.964 at most)."""
    from sume_poller.core.jobs import OUTBOX_PREFIX, shard_of
    from sume_poller.store.events import EventBus

    stuck = [f"job_stuck{i:02d}" for i in range(20)]
    publish = EventBus.put_terminal

    def refuse_the_stuck(self: EventBus, job_id: str, record: dict[str, object]) -> None:
        if job_id in stuck:
            raise RuntimeError("PutEvents failed (EventBridge down for these)")
        publish(self, job_id, record)

    monkeypatch.setattr(EventBus, "put_terminal", refuse_the_stuck)
    from sume_poller.limits.gate import ReadGate

    entered: list[str] = []
    enter = ReadGate.enter

    def counting_enter(self: ReadGate, job_id: str, *args: Any, **kwargs: Any) -> Any:
        if job_id in stuck:
            entered.append(job_id)
        return enter(self, job_id, *args, **kwargs)

    monkeypatch.setattr(ReadGate, "enter", counting_enter)
    now = stack.clock.now()
    for job_id in stuck:
        stack.table.put({"job_id": job_id, "kind": "image", "profile": "image", "status": "failed",
                         "submitted_at": int(now) - 600, "deadline_at": int(now) + 86_400, "terminal_at": int(now),
                         "event_pending": True, "pending_shard": shard_of(job_id, 2, OUTBOX_PREFIX)})
    running = submit(stack, 20, {"duration": 3_600, "steps": 600})  # hints: each wants a read every 6 s
    start = stack.clock.now()
    stack.drive(lambda: stack.clock.now() >= start + 300, 60, fanout_every=1.0)
    # What the budget served is the harness's speed as much as the code's (0.84-0.92 of the limit measured, a
    # loaded CI run 0.84 of it): a timing goal, not asserted here. What keeps the slots for the running jobs
    # is that no outbox message takes one, and no stuck job is read.
    jobs = stack.sim.stats()["jobs"]
    assert sum(jobs[j]["status_reads"] for j in running) > 0
    assert all(jobs.get(j, {}).get("status_reads", 0) + jobs.get(j, {}).get("result_reads", 0) == 0 for j in stuck)
    assert stack.metric_totals()["FanOutOutboxBackingOff"] > 0  # re-sent after waits, not every tick
    assert entered == []  # an outbox message never asks the gate for a lease or a read slot

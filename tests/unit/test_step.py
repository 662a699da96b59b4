"""What a poll step decides before the gate (step.plan, pure): due now or a hop, the lease's TTL,
the read slot it asks for and how far away a slot it accepts; and the per-step tally (Run)."""

from __future__ import annotations

import math

import pytest

from sume_poller.core.clock import Clock
from sume_poller.core.messages import RESULT_PHASE, Finding, PollMessage, Source
from sume_poller.limits.lease import new_token
from sume_poller.poll.step import HOP_TOLERANCE, LAST_READ_WAIT, Deadline, Run, plan

NOW = 1_800_000_000.0
CLOCK = Clock(0.5)  # two clock seconds a real second


def message(**changes: object) -> PollMessage:
    base = PollMessage(job_id="job_p", kind="image", deadline_at=int(NOW) + 86_400, due_at=NOW, token=new_token())
    return base.next(**changes)


def planned(msg: PollMessage, patience: float = 42.0) -> tuple[float | None, int, str, float]:
    p = plan(msg, NOW, clock=CLOCK, max_delay=1_800.0, margin_real=120.0, claim_ttl_real=60.0,
             patience=lambda m, now: patience)
    return p.hop, p.ttl_ms, p.mode, p.patience


def test_a_due_status_step_takes_a_slot_with_the_cadence_patience_and_the_claim_ttl() -> None:
    assert planned(message()) == (None, 60_000, "take", 42.0)
    assert planned(message(due_at=NOW + HOP_TOLERANCE / 2)) == (None, 60_000, "take", 42.0)  # close enough: now


def test_a_step_not_due_hops_with_a_lease_until_its_next_delivery_plus_the_margin() -> None:
    hop, ttl_ms, mode, patience = planned(message(due_at=NOW + 100.0))
    assert (hop, mode, patience) == (100.0, "none", math.inf)
    assert ttl_ms == (100.0 * 0.5 + 120.0) * 1000  # clock seconds to real, plus the real margin
    far, ttl_far, _, _ = planned(message(due_at=NOW + 10_000.0))  # SQS covers at most max_delay per hop
    assert far == 10_000.0 and ttl_far == (1_800.0 * 0.5 + 120.0) * 1000


def test_the_deadline_caps_the_due_time() -> None:
    assert planned(message(due_at=NOW + 10**6, deadline_at=int(NOW) + 50))[0] == 50.0


@pytest.mark.parametrize(("changes", "mode"), [
    ({"slot_at": NOW}, "confirm"),
    ({"slot_at": NOW, "phase": RESULT_PHASE, "outcome": Finding("completed", Source.STATUS)}, "rconfirm"),
    ({"phase": RESULT_PHASE, "outcome": Finding("completed", Source.STATUS)}, "ahead"),
    ({"found_by": "sweep"}, "ahead"),  # the status read that confirms a failure a sweep listed
])
def test_a_reserved_slot_is_confirmed_and_a_finished_job_goes_ahead_with_any_slot(changes: dict[str, object],
                                                                                    mode: str) -> None:
    assert planned(message(**changes))[2:] == (mode, math.inf)


def test_a_run_tallies_its_reads_and_signals_into_its_outcome() -> None:
    run = Run(message(), hold=None, deadline=Deadline(10.0))  # type: ignore[arg-type]
    run.read_status()
    run.read_result()
    run.signal("BudgetExhausted")
    out = run.outcome("requeued")
    assert (out.status_reads, out.result_reads, out.signals) == (1, 1, ("BudgetExhausted",))
    assert (run.chain.reads, run.chain.result_reads) == (1, 1)


@pytest.mark.parametrize(("finding", "mode"), [
    (Finding("failed", Source.WEBHOOK, "failed"), "none"),  # Sume's signed word: recorded without a read
    (Finding("failed", Source.LIST, "failed"), "ahead"),  # a list's: the status read confirms it
    (Finding("completed", Source.WEBHOOK), "ahead"),  # *.ready: its result read is the proof
    (Finding("completed", Source.STATUS, result_ready=False), "ahead"),  # Sume's gate: the status read waits
])
def test_what_a_finding_still_needs_decides_the_slot(finding: Finding, mode: str) -> None:
    assert planned(message(phase=RESULT_PHASE, outcome=finding))[2] == mode


def test_at_the_deadline_the_last_read_accepts_a_slot_only_so_long_past_it() -> None:
    """Every wait is clamped to the deadline; the step at the deadline reads once more, on a slot at
    most LAST_READ_WAIT past it (the cadence's own patience too, when nearer)."""
    due = message(deadline_at=int(NOW), due_at=NOW + 500.0)
    assert planned(due) == (None, 60_000, "take", 42.0)  # not a hop: the deadline is now
    assert planned(due, patience=math.inf)[3] == LAST_READ_WAIT
    late = message(deadline_at=int(NOW) - 100, phase=RESULT_PHASE, outcome=Finding("completed", Source.STATUS))
    assert planned(late)[2:] == ("ahead", LAST_READ_WAIT - 100)
    assert planned(message(deadline_at=int(NOW) - 1_000))[3] == 0.0  # past the last read's wait: now or never

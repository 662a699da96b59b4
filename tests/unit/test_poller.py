"""The poll state machine (poller.py) through in-process fakes: what each Sume answer, lease
state and budget answer leads to. Each failure mode a real deployment meets has a case here."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field, replace

import pytest
from fakes import (
    FakeBudget,
    FakeBus,
    FakeClock,
    FakeLease,
    FakePacer,
    FakeQueue,
    FakeStore,
    FakeSume,
    done,
    refused,
    retry,
    status,
)

from sume_poller.core.messages import OUTBOX_PHASE, RESULT_PHASE, Finding, PollMessage, Source, parse_message
from sume_poller.discovery.coverage import CANARY_EVERY, Coverage, is_canary
from sume_poller.discovery.deliveries import LOST_WITHIN
from sume_poller.limits.budget import Grant, RateInfo
from sume_poller.limits.gate import ReadGate
from sume_poller.limits.lease import BUSY_RETRY, new_token
from sume_poller.limits.redisconn import Breaker
from sume_poller.poll.cadence import CANARY_SHARE, STRETCHED_SHARE, Cadence
from sume_poller.poll.keycheck import KEY_CHECK_WAIT
from sume_poller.poll.outbox import completion_interval
from sume_poller.poll.poller import Poller, PollSettings
from sume_poller.poll.step import PACED_HOP, Deadline, Outcome
from sume_poller.schedule.durations import LogNormal
from sume_poller.sume.listing import Listing
from sume_poller.sume.status import Oversized, Result

ENV = {"JOBS_TABLE": "jobs", "POLL_QUEUE_URL": "q", "RESULT_BUCKET": "b", "SUME_BASE_URL": "https://sume.test/api/v1",
       "SUME_API_KEY_NAME": "/k", "REDIS_URL": "redis://redis.test:6379", "LEARNED_SCHEDULE": "false"}


@dataclass
class Rig:
    clock: FakeClock = field(default_factory=FakeClock)
    lease: FakeLease = field(default_factory=FakeLease)
    budget: FakeBudget = field(default_factory=FakeBudget)
    pacer: FakePacer = field(default_factory=FakePacer)
    sume: FakeSume = field(default_factory=FakeSume)
    store: FakeStore = field(default_factory=FakeStore)
    bus: FakeBus = field(default_factory=FakeBus)
    queue: FakeQueue = field(default_factory=FakeQueue)
    poller: Poller = field(init=False)

    def __post_init__(self) -> None:
        settings = PollSettings.from_env(ENV)
        settings = replace(settings, common=replace(settings.common, clock=self.clock))
        gate = ReadGate(self.lease, self.budget, self.pacer, cluster=True,  # type: ignore[arg-type]
                        breaker=Breaker(open_for=0.0))
        self.poller = Poller(settings, gate=gate, sume=self.sume, store=self.store, bus=self.bus,  # type: ignore[arg-type]
                             queue=self.queue, cadence=Cadence(settings, rng=random.Random(7)))  # type: ignore[arg-type]

    def submit(self, job_id: str = "job_a", kind: str = "image") -> PollMessage:
        """Record a job and start its chain, as submit does; the first message, due now."""
        now = self.clock.now()
        self.store.put_pending(job_id, kind, now=now, deadline_at=int(now) + 86_400)
        token = new_token()
        self.lease.start(job_id, token, 1)
        return PollMessage(job_id=job_id, kind=kind, deadline_at=int(now) + 86_400, due_at=now, token=token,
                           submitted_at=int(now))

    def run(self, msg: PollMessage, seconds_left: float = 25.0) -> Outcome:
        return self.poller.process(msg, Deadline(seconds_left))

    def next_of(self, outcome: Outcome) -> PollMessage:
        assert outcome.send is not None, outcome
        self.queue.sent.append(outcome.send)
        return parse_message(outcome.send.body)

    def follow(self, msg: PollMessage, steps: int = 50) -> list[Outcome]:
        """Run a chain: each step's next message, at its due time, until it ends."""
        outcomes = []
        for _ in range(steps):
            out = self.run(msg)
            outcomes.append(out)
            if out.send is None:
                return outcomes
            msg = self.next_of(out)
            self.clock.t = max(self.clock.t, msg.due_at)
        raise AssertionError(f"chain still running after {steps} steps: {[o.name for o in outcomes]}")


@pytest.fixture
def rig() -> Rig:
    return Rig()


def test_a_running_job_rests_its_lease_and_hands_back_the_next_step(rig: Rig) -> None:
    rig.sume.status["job_a"] = [status("running")]
    first = rig.submit()
    out = rig.run(first)
    assert out.name == "requeued" and out.status_reads == 1
    nxt = parse_message(out.send.body)  # type: ignore[union-attr]
    assert (nxt.token, nxt.seq, nxt.reads) == (first.token, 1, 1)
    assert nxt.due_at > rig.clock.now() and nxt.seen_running_at == rig.clock.now()
    assert rig.lease.values["job_a"] == f"{first.token}:1"


@pytest.mark.parametrize("hint", [0.3, 2.5, 61.2])
def test_a_rested_lease_outlasts_the_whole_seconds_sqs_delays_its_message_by(rig: Rig, hint: float) -> None:
    """SQS delays a message by whole seconds, rounded up: the lease lives that long plus the margin (before:
    the clock's delay plus the margin, so a 0.3 s delay, sent as 1 s, ate 0.7 s of the margin)."""
    rig.sume.status["job_a"] = [status("running", hint)]
    out = rig.run(rig.submit())
    assert out.send is not None and out.send.delay > 0
    assert rig.lease.rested_ms["job_a"] == (math.ceil(out.send.delay) + rig.poller.s.lease.margin) * 1000


def test_a_chain_runs_to_its_terminal_write_and_one_event(rig: Rig) -> None:
    rig.sume.status["job_a"] = [status("queued"), status("running"), done()]
    outcomes = rig.follow(rig.submit())
    assert [o.name for o in outcomes] == ["requeued", "requeued", "terminal"]
    record = rig.store.records["job_a"]
    assert record["status"] == "completed" and record["result_json"] == '{"url":"u"}'
    assert "pending_shard" not in record and "event_pending" not in record
    assert [j for j, _ in rig.bus.events] == ["job_a"] and "job_a" not in rig.lease.values
    assert (record["status_reads"], record["result_reads"]) == (3, 1)


def test_a_duplicate_delivery_of_a_step_reads_nothing(rig: Rig) -> None:
    rig.sume.status["job_a"] = [status("running")]
    first = rig.submit()
    rig.run(first)
    assert rig.run(first).name == "contention"
    assert rig.sume.reads("status") == 1


def test_a_later_step_never_reads_beside_a_delivery_of_an_older_step_that_holds_its_claim(rig: Rig) -> None:
    """Simulation seed 31856: the chain took step 0 under the record's fence while Redis was down and
    sent step 1; once Redis was back an SQS duplicate of step 0 claimed the lease and read. Step 1
    used to take the claim from under that read and read too; now it comes back later, reading nothing."""
    rig.sume.status["job_a"] = [status("running")]
    first = rig.submit()
    rig.lease.values["job_a"] = f"{first.token}:0!0badcafe"  # the duplicate of step 0, mid-read
    step1 = first.next(seq=1)
    out = rig.run(step1)
    assert out.name == "contention" and rig.sume.calls == [] and rig.budget.takes == 0
    assert out.send is not None and parse_message(out.send.body) == step1
    assert out.send.delay == rig.poller.clock.from_real(BUSY_RETRY)
    assert rig.lease.values["job_a"] == f"{first.token}:0!0badcafe"
    rig.lease.values["job_a"] = f"{first.token}:1"  # that delivery rested its chain on step 1
    again = rig.run(rig.next_of(out))
    assert again.name == "requeued" and rig.sume.reads("status") == 1


def test_a_job_with_no_lease_starts_a_fresh_chain_after_reading_its_record(rig: Rig) -> None:
    rig.sume.status["job_a"] = [status("running")]
    msg = rig.submit()
    rig.lease.values.clear()  # the lease expired
    out = rig.run(msg)
    assert out.name == "requeued"
    assert parse_message(out.send.body).token != msg.token  # type: ignore[union-attr]
    rig.store.records["job_a"].update(status="completed", pending_shard=None)
    rig.lease.values.clear()
    assert rig.run(msg).name == "duplicate" and rig.sume.reads("status") == 1


def test_a_message_that_comes_back_early_hops_without_reading(rig: Rig) -> None:
    msg = rig.submit().next(due_at=rig.clock.now() + 5_000)
    out = rig.run(msg)
    assert out.name == "hopped" and out.send is not None and out.send.delay == rig.queue.max_delay
    assert rig.sume.calls == [] and rig.budget.takes == 0


def test_no_read_slot_now_requeues_for_the_reserved_slot_keeping_the_lease(rig: Rig) -> None:
    rig.budget.grants = [Grant(True, 42.0)]
    msg = rig.submit()
    out = rig.run(msg)
    nxt = rig.next_of(out)
    assert out.name == "budget_wait" and "BudgetExhausted" in out.signals and rig.sume.calls == []
    assert nxt.slot_at == pytest.approx(rig.clock.now() + 42.0) and nxt.due_at == nxt.slot_at
    assert rig.lease.values["job_a"] == f"{msg.token}:1@{int(nxt.slot_at * 1000)}"  # the slot rides in the lease


def test_redis_down_a_chain_keeps_polling_on_its_own_schedule_fenced_against_duplicates(rig: Rig) -> None:
    rig.sume.status["job_a"] = [status("running"), done()]
    msg = rig.submit()
    rig.lease.down = True
    out = rig.run(msg)
    assert out.name == "requeued" and "RedisUnavailable" in out.signals and rig.sume.reads("status") == 1
    assert rig.run(msg).name == "duplicate" and rig.sume.reads("status") == 1  # the copy is fenced out
    record = rig.store.records["job_a"]
    assert record["chain_due_at"] >= rig.next_of(out).due_at  # fan-out leaves the job to this chain
    nxt = parse_message(out.send.body)  # type: ignore[union-attr]
    rig.clock.t = nxt.due_at
    assert rig.run(nxt).name == "terminal" and rig.store.records["job_a"]["status"] == "completed"


def test_redis_down_reads_are_paced_per_container_and_a_waiting_step_keeps_its_slot(rig: Rig) -> None:
    """The outage pacer's slot rides in the message: the step comes back (at least every
    PACED_HOP, in case Redis returns) and reads at its slot without reserving another."""
    msg = rig.submit()
    rig.lease.down = True
    rig.pacer.waits = [100.0]
    rig.sume.status["job_a"] = [status("running")]
    out = rig.run(msg)
    waiting = rig.next_of(out)
    assert out.name == "budget_wait" and rig.sume.calls == [] and rig.pacer.takes == 1
    assert waiting.paced_at == pytest.approx(rig.clock.now() + 100.0) and waiting.due_at == pytest.approx(
        rig.clock.now())  # its own due time is unchanged: Redis back, it reads at once
    assert out.send is not None and out.send.delay == PACED_HOP
    rig.clock.advance(PACED_HOP)
    again = rig.run(waiting)
    assert again.name == "budget_wait" and rig.pacer.takes == 1 and rig.sume.calls == []  # no second slot
    rig.clock.t = waiting.paced_at  # type: ignore[assignment]
    read = rig.run(rig.next_of(again))
    assert read.name == "requeued" and rig.sume.reads("status") == 1 and rig.pacer.takes == 1


def test_redis_back_a_step_that_waited_for_the_pacer_reads_at_its_own_due_time(rig: Rig) -> None:
    rig.sume.status["job_a"] = [status("running")]
    msg = rig.submit()
    rig.lease.down = True
    rig.pacer.waits = [500.0]
    waiting = rig.next_of(rig.run(msg))
    rig.lease.down = False
    rig.lease.values["job_a"] = f"{msg.token}:1"
    rig.clock.advance(PACED_HOP)
    out = rig.run(waiting)
    assert out.name == "requeued" and rig.sume.reads("status") == 1 and rig.next_of(out).paced_at is None


def test_a_result_sume_says_is_not_ready_is_waited_for_on_the_status_then_read_once(rig: Rig) -> None:
    """Sume's gate decides: while the status says result_ready false the wait reads the status
    (result-phase backoff), never the result route; once it says true, one result read."""
    rig.sume.status["job_a"] = [done(ready=False)] * 8 + [done(ready=True)]
    msg = rig.submit()
    outcomes = rig.follow(msg)
    assert [o.name for o in outcomes] == ["result_not_ready"] * 8 + ["terminal"]
    assert rig.sume.reads("status") == 9 and rig.sume.reads("result") == 1
    record = rig.store.records["job_a"]
    assert record["status"] == "completed" and record["result_json"] == '{"url":"u"}'
    assert record["seen_terminal_at"] == msg.due_at  # when Sume first said it was done
    assert rig.clock.now() - msg.due_at > 10 * 60  # the waits grew (5 s doubling)


@pytest.mark.parametrize("not_there", [refused("not_found", 404), retry(409), retry(425)])
def test_without_a_gate_the_wait_reads_the_result_route_until_the_result_comes(rig: Rig, not_there: object) -> None:
    """No ``result_ready`` in the status: the result is assumed ready; whatever the route answers
    while it is not (404, 409 or 425: the contract does not say) is waited out on the result route,
    never recorded as "no result", and the status is not read again."""
    rig.sume.status["job_a"] = [done(gated=False)]
    rig.sume.result["job_a"] = [not_there] * 6 + [Result({"url": "u"})]
    outcomes = rig.follow(rig.submit())
    assert outcomes[-1].name == "terminal" and rig.store.records["job_a"]["result_json"] == '{"url":"u"}'
    assert rig.sume.reads("status") == 1 and rig.sume.reads("result") == 7
    assert "error" not in rig.store.records["job_a"] or rig.store.records["job_a"]["error"] is None


def test_a_result_that_never_comes_ends_only_at_the_deadline(rig: Rig) -> None:
    rig.sume.status["job_a"] = [done()]
    rig.sume.result["job_a"] = [refused("not_found", 404)]
    outcomes = rig.follow(rig.submit(), steps=200)
    record = rig.store.records["job_a"]
    assert outcomes[-1].status == "timed_out" and record["error"]["code"] == "result_not_ready"
    assert record["sume_status"] == "completed" and rig.sume.reads("status") == 1
    assert rig.sume.reads("result") < 24 * 6 + 10  # the backoff reaches 10 minutes: bounded by the deadline


def test_a_job_a_list_called_completed_whose_result_is_not_there_goes_back_to_its_status_once(rig: Rig) -> None:
    msg = rig.submit()
    handed = msg.next(seq=1, phase=RESULT_PHASE, found_by="sweep", seen_terminal_at=rig.clock.now(),
                      outcome=Finding("completed", Source.LIST, "completed"))
    rig.lease.values["job_a"] = f"{msg.token}:1*"
    rig.sume.result["job_a"] = [refused("not_found", 404)]
    rig.sume.status["job_a"] = [status("running")]
    back = rig.run(handed)
    nxt = rig.next_of(back)
    assert back.name == "unconfirmed" and nxt.phase == "status" and nxt.outcome is None
    out = rig.run(nxt)  # the list was wrong: the job runs, and its chain goes on
    assert out.name == "requeued" and rig.store.records["job_a"]["status"] == "pending"
    assert rig.sume.reads("result") == 1 and rig.sume.reads("status") == 1


def test_a_failure_a_list_reported_is_recorded_only_after_the_jobs_status_says_so(rig: Rig) -> None:
    msg = rig.submit()
    for job_status, expected in ((status("running"), "pending"), (done("failed", error={"code": "x"}), "failed")):
        rig.sume.status["job_a"] = [job_status]
        handed = msg.next(seq=1, phase=RESULT_PHASE, found_by="sweep", token=msg.token,
                          outcome=Finding("failed", Source.LIST, "failed"))
        rig.lease.values["job_a"] = f"{msg.token}:1*"
        rig.run(handed)
        assert rig.store.records["job_a"]["status"] == expected
    assert rig.sume.reads("status") == 2 and rig.store.records["job_a"]["found_by"] == "sweep"


def test_a_failure_a_signed_webhook_stated_is_recorded_without_a_read_or_a_slot(rig: Rig) -> None:
    msg = rig.submit()
    handed = msg.next(seq=1, phase=RESULT_PHASE, found_by="webhook", seen_terminal_at=rig.clock.now(),
                      outcome=Finding("canceled", Source.WEBHOOK, "canceled",
                                      {"code": "user_canceled", "message": "canceled by its owner"}))
    rig.lease.values["job_a"] = f"{msg.token}:1*"
    out = rig.run(handed)
    record = rig.store.records["job_a"]
    assert out.status == "canceled" and rig.sume.calls == [] and rig.budget.takes == 0
    assert record["error"]["code"] == "user_canceled" and record["found_by"] == "webhook"


def test_a_result_over_the_maximum_is_recorded_completed_without_it(rig: Rig) -> None:
    rig.sume.status["job_a"] = [done()]
    rig.sume.result["job_a"] = [Oversized(80_000_000)]
    out = rig.run(rig.submit())
    record = rig.store.records["job_a"]
    assert out.status == "completed" and record["error"]["code"] == "result_too_large"
    assert record["result_bytes"] == 80_000_000 and "result_json" not in record and len(rig.bus.events) == 1


def test_a_status_read_that_crosses_the_deadline_still_fetches_the_result_it_found_ready(rig: Rig) -> None:
    """The last read records what it finds: a job Sume finished with its result ready at the deadline is
    recorded with its result (it is paid for; before, it was recorded timed_out without the read)."""
    msg = rig.submit()
    rig.sume.status["job_a"] = [done()]
    rig.clock.t = msg.deadline_at - 0.01
    late = msg.next(due_at=rig.clock.t)

    def reading_takes_time(job_id: str, timeout: float | None = None) -> object:
        rig.clock.advance(1.0)  # the status read crosses the deadline
        return done()

    rig.sume.get_status = reading_takes_time  # type: ignore[method-assign]
    out = rig.run(late)
    record = rig.store.records["job_a"]
    assert out.status == "completed" and rig.sume.reads("result") == 1 and record["result_json"] == '{"url":"u"}'
    assert record["evidence"] == "result_read"


def test_a_message_that_only_finishes_an_outbox_takes_no_read_slot(rig: Rig) -> None:
    rig.sume.status["job_a"] = [done("failed")]
    msg = rig.submit()
    rig.bus.fail_next = 1
    with pytest.raises(RuntimeError):
        rig.run(msg)
    takes = rig.budget.takes
    rig.lease.values.clear()  # fan-out's outbox message: no lease of its own
    out = rig.run(msg.next(token=new_token()))
    assert out.name == "outbox" and rig.budget.takes == takes  # the record said: no read, so no slot


def test_fan_outs_outbox_message_finishes_the_outbox_whatever_holds_the_lease(rig: Rig) -> None:
    """A poller crashed right after the terminal write: its claim still holds the lease. Fan-out's
    outbox message needs neither lease nor read nor slot: it finishes the outbox from the record."""
    rig.sume.status["job_a"] = [done("failed")]
    msg = rig.submit()
    rig.bus.fail_next = 1
    with pytest.raises(RuntimeError):
        rig.run(msg)
    assert "!" in rig.lease.values["job_a"]  # the crashed delivery's claim
    out = rig.run(msg.next(token=new_token(), seq=0, phase=OUTBOX_PHASE))
    assert out.name == "outbox" and len(rig.bus.events) == 1 and rig.budget.takes == 1
    assert "event_pending" not in rig.store.records["job_a"]
    assert rig.run(msg.next(token=new_token(), seq=0, phase=OUTBOX_PHASE)).name == "duplicate"


@pytest.mark.parametrize("found_by", [None, "sweep", "webhook"])
def test_a_chain_started_on_a_free_lease_after_the_job_finished_reads_nothing(rig: Rig, found_by: str | None) -> None:
    """Simulation (``read-after-end``, 16 seeds in 2,000 before): fan-out read a page with the job pending, or
    a sweep or webhook its record; the job's chain then finished it and released the lease; the fan-out's
    start (or the hand-over) found the lease free and sent a step 0 that used to read Sume again. A
    chain's first step now reads the record first, as a step that finds the lease free does."""
    rig.sume.status["job_a"] = [done()]
    rig.follow(rig.submit())
    assert rig.store.records["job_a"]["status"] == "completed" and "job_a" not in rig.lease.values
    calls = len(rig.sume.calls)
    token = new_token()
    rig.lease.values["job_a"] = f"{token}:0" + ("*" if found_by else "")  # started (or handed over) on the free lease
    started = PollMessage(job_id="job_a", kind="image", deadline_at=int(rig.clock.now()) + 86_400,
                          due_at=rig.clock.now(), token=token, found_by=found_by)
    if found_by:
        started = started.next(seq=0, phase=RESULT_PHASE, outcome=Finding("completed", Source.LIST, "completed"))
    out = rig.run(started)
    assert out.send is None and len(rig.sume.calls) == calls and len(rig.bus.events) == 1
    assert "job_a" not in rig.lease.values


def test_a_fresh_chain_of_a_pending_job_takes_its_slot_after_reading_the_record(rig: Rig) -> None:
    rig.sume.status["job_a"] = [status("running")]
    msg = rig.submit()
    rig.lease.values.clear()
    rig.budget.grants = [Grant(True, 30.0)]
    out = rig.run(msg)
    assert out.name == "budget_wait" and rig.budget.takes == 1 and rig.sume.calls == []


def test_a_result_is_any_json_value_stored_whole(rig: Rig) -> None:
    for job_id, payload in (("job_list", [{"url": "a"}, {"url": "b"}]), ("job_str", "https://x/y")):
        rig.sume.status[job_id] = [done()]
        rig.sume.result[job_id] = [Result(payload)]
        rig.follow(rig.submit(job_id))
        assert json.loads(rig.store.records[job_id]["result_json"]) == payload


def test_the_key_check_takes_its_reads_from_the_budget(rig: Rig) -> None:
    rig.sume.status["job_f"] = [refused("forbidden", 403)]
    rig.sume.listing = [Listing(({"id": "job_x"},), None, False)]
    rig.budget.grants = [Grant(True, 0.0), Grant(False, 20.0)]  # the job's read, then no slot free for the check
    out = rig.run(rig.submit("job_f"))
    assert out.name == "transient" and rig.sume.reads("list") == 0  # asked again later, nothing decided
    assert rig.budget.modes[-1] == "ahead" and rig.budget.patience[-1] == KEY_CHECK_WAIT
    assert rig.store.records["job_f"]["status"] == "pending"
    rig.clock.advance(60)
    out = rig.run(rig.next_of(out))
    assert out.status == "failed" and rig.sume.reads("list") == 1 and rig.budget.takes == 4


def test_a_key_check_slot_waited_for_is_confirmed_before_the_read(rig: Rig) -> None:
    """A slot a fraction of a second away is waited for, then confirmed as any reserved read is (the
    budget counts the read when it happens): no read where the confirm is not now."""
    rig.budget.grants = [Grant(True, 0.01), Grant(True, 0.0), Grant(True, 0.01), Grant(True, 2.0)]
    assert rig.poller.gate.slot_soon(2.0, 1.0)
    assert rig.budget.modes == ["ahead", "rconfirm"] and rig.budget.slots == [0.0, 1_000.01]
    assert not rig.poller.gate.slot_soon(2.0, 1.0)  # the read log held it back: asked again later
    assert rig.budget.modes[2:] == ["ahead", "rconfirm"]


def test_a_403_fails_only_that_job_when_the_key_check_passes(rig: Rig) -> None:
    rig.sume.status["job_f"] = [refused("forbidden", 403)]
    rig.sume.listing = [Listing(({"id": "job_x"},), None, False)]
    out = rig.run(rig.submit("job_f"))
    assert out.name == "terminal" and out.status == "failed"
    assert rig.store.records["job_f"]["error"]["code"] == "forbidden"
    assert rig.budget.key_paused_for is None
    # the check holds for a minute: the next foreign job costs no second check
    rig.sume.status["job_g"] = [refused("forbidden", 403)]
    rig.run(rig.submit("job_g"))
    assert rig.sume.reads("list") == 1


def test_a_403_pauses_every_read_when_the_key_itself_is_refused(rig: Rig) -> None:
    rig.sume.status["job_f"] = [refused("forbidden", 403)]
    rig.sume.listing = [refused("key", 401)]
    out = rig.run(rig.submit("job_f"))
    assert out.name == "key_rejected" and "SumeAuthFailed" in out.signals
    assert rig.budget.key_paused_for == 300 and rig.store.records["job_f"]["status"] == "pending"


def test_a_401_pauses_every_read_and_the_chain_waits_it_out(rig: Rig) -> None:
    rig.sume.status["job_a"] = [refused("key", 401)]
    out = rig.run(rig.submit())
    assert out.name == "key_rejected" and rig.budget.key_paused_for == 300
    assert rig.next_of(out).due_at >= rig.clock.now() + 300


def test_a_404_soon_after_submission_is_lag_and_later_final(rig: Rig) -> None:
    rig.sume.status["job_a"] = [refused("not_found", 404)]
    msg = rig.submit()
    out = rig.run(msg)
    assert out.name == "transient" and "NotFoundGrace" in out.signals
    rig.clock.advance(301)
    nxt = rig.next_of(out)
    final = rig.run(nxt.next(due_at=rig.clock.now()))
    assert final.status == "failed" and rig.store.records["job_a"]["error"]["code"] == "not_found"


def test_a_429_tells_the_budget_and_backs_off(rig: Rig) -> None:
    rig.sume.status["job_a"] = [retry(429, retry_after=7.0)]
    rig.sume.status["job_a"][0] = type(rig.sume.status["job_a"][0])(
        "rate_limit_exceeded", 7.0, 429, rate=RateInfo(retry_after=7.0))
    out = rig.run(rig.submit())
    assert out.name == "transient" and "SumeThrottled" in out.signals
    assert rig.budget.feedback_seen and rig.budget.feedback_seen[0].retry_after == 7.0
    assert rig.next_of(out).due_at == pytest.approx(rig.clock.now() + 7.0)


def test_no_job_outlives_its_deadline_and_a_late_result_is_named(rig: Rig) -> None:
    rig.sume.status["job_a"] = [status("running", hint=10**9)]
    msg = rig.submit()
    out = rig.run(msg)
    nxt = rig.next_of(out)
    assert nxt.due_at == msg.deadline_at  # the far hint is capped at the deadline
    rig.clock.t = nxt.due_at
    assert rig.run(nxt).status == "timed_out"
    rig.sume.status["job_b"] = [done(ready=False)]
    late = rig.next_of(rig.run(rig.submit("job_b")))
    assert late.phase == RESULT_PHASE
    rig.clock.t = late.deadline_at
    rig.run(late)
    assert rig.store.records["job_b"]["error"]["code"] == "result_not_ready"


def test_a_record_without_enough_invocation_time_left_is_not_started(rig: Rig) -> None:
    out = rig.run(rig.submit(), seconds_left=2.0)
    assert out.name == "out_of_time" and rig.sume.calls == [] and out.send is not None


def test_a_terminal_write_that_loses_finishes_the_earlier_attempts_outbox(rig: Rig) -> None:
    rig.sume.status["job_a"] = [done("failed")]
    msg = rig.submit()
    rig.bus.fail_next = 1
    with pytest.raises(RuntimeError):
        rig.run(msg)  # crashed between the terminal write and the event
    assert rig.store.records["job_a"]["event_pending"]
    rig.lease.values.clear()
    out = rig.run(msg)  # SQS delivers the message again
    assert out.name == "outbox" and len(rig.bus.events) == 1 and rig.sume.reads("status") == 1


def test_under_a_binding_budget_a_job_unlikely_to_be_done_lets_others_read_first(rig: Rig) -> None:
    """With a learned model a young video accepts only a near slot; refused a far one it comes back
    when its chance of being done has grown. Past the max-gap backstop it takes any slot."""
    model = LogNormal(math.log(360.0), 0.6)
    rig.poller.cadence.models = lambda profile, kind: model
    rig.poller.cadence.s = replace(rig.poller.s, schedule=replace(rig.poller.s.schedule, learned=True))
    rig.sume.status["job_v"] = [status("running")]
    msg = rig.submit("job_v", "video").next(seen_running_at=rig.clock.now())
    rig.clock.advance(30)
    rig.budget.grants = [Grant(False, 600.0, pending=10)]
    out = rig.run(msg.next(due_at=rig.clock.now()))
    assert out.name == "deferred" and rig.sume.calls == [] and rig.budget.patience[-1] < 60
    assert rig.next_of(out).due_at > rig.clock.now() + 30
    rig.clock.advance(5_000)  # far past the round-robin period of 10 pending jobs at 2 reads/s
    rig.run(rig.next_of(out).next(due_at=rig.clock.now()))
    assert math.isinf(rig.budget.patience[-1])


class FixedCoverage:
    """A CoverageView whose snapshot the test sets."""

    def __init__(self, snapshot: Coverage) -> None:
        self.snapshot = snapshot
        self.store = type("Store", (), {"found": lambda *a: None})()

    def get(self) -> Coverage:
        return self.snapshot


def test_chains_stretch_only_where_sweeps_proved_coverage_and_come_back_when_it_lapses(rig: Rig) -> None:
    now = rig.clock.now()
    covered = Coverage(healthy_until=now + 3_600, covered=frozenset({"image"}), route="ok")
    rig.poller.cadence.coverage = FixedCoverage(covered)  # type: ignore[assignment]
    rig.sume.status["job_a"] = [status("running"), status("running")]
    safety, check = rig.poller.s.discovery.safety, rig.poller.s.discovery.check
    first = rig.run(rig.submit("job_a"))  # covered from the start: even the first read waits
    hop = rig.next_of(first)
    assert first.name == "hopped" and first.status_reads == 0 and hop.due_at >= now + safety
    assert hop.normal_due is not None and hop.normal_due < now + 60
    assert first.send is not None and first.send.delay <= check  # it hops to check the cover holds
    rig.clock.t = hop.due_at
    out = rig.run(hop)
    nxt = rig.next_of(out)
    assert out.name == "stretched" and out.status_reads == 1 and nxt.due_at >= rig.clock.t + safety
    assert nxt.normal_due is not None and nxt.normal_due < rig.clock.t + 60
    assert out.send is not None and out.send.delay <= check
    rig.poller.cadence.coverage = FixedCoverage(Coverage())  # sweeps stopped proving anything
    rig.clock.t = nxt.normal_due + 1
    assert rig.run(nxt).name == "requeued"  # read at its normal time, no longer stretched
    rig.poller.cadence.coverage = FixedCoverage(covered)
    rig.sume.status["job_v"] = [status("running")]
    assert rig.run(rig.submit("job_v", "video")).name == "requeued"  # video was never proven
    rig.poller.cadence.coverage = FixedCoverage(Coverage())
    rig.sume.status["job_b"] = [status("running")]
    lapsed = rig.run(rig.submit("job_b"))  # not covered: the first read at its normal time
    assert lapsed.name == "requeued" and lapsed.status_reads == 1


def test_with_many_jobs_pending_stretched_chains_and_canaries_space_out_to_fit_their_share_of_the_budget(
        rig: Rig) -> None:
    now = rig.clock.now()
    rig.poller.cadence.coverage = FixedCoverage(Coverage(  # type: ignore[assignment]
        healthy_until=now + 10**6, covered=frozenset({"image"}), route="ok", every=300.0))
    cadence = rig.poller.cadence
    cadence.rate, cadence.pending = 10_000 / 86_400, 1_000  # 1,000 pending on 10,000 reads a day
    rig.poller.gate.pending = 1_000  # as the limiter last told it (each step passes it on)
    spread = 1_000 / (cadence.rate * STRETCHED_SHARE)  # together a tenth of the budget: a read a day each
    assert cadence.stretched_gap("image", now) == pytest.approx(spread)
    # not covered by sweeps: only webhooks could stretch it, and then a lost delivery is found within LOST_WITHIN
    assert cadence.stretched_gap("video", now) == min(LOST_WITHIN, rig.poller.s.discovery.safety)
    rig.sume.status["job_a"] = [status("running")]
    hop = rig.next_of(rig.run(rig.submit("job_a")))
    assert hop.due_at >= now + spread  # even the first read
    canary = next(f"job_c{i}" for i in range(1_000) if is_canary(f"job_c{i}"))
    rig.sume.status[canary] = [status("running")]
    nxt = rig.next_of(rig.run(rig.submit(canary)))
    assert nxt.normal_due is None and nxt.due_at >= now + 1_000 / CANARY_EVERY / (cadence.rate * CANARY_SHARE)
    cadence.pending = 10  # few pending: the safety cadence and the sweeps' interval
    assert cadence.stretched_gap("image", now) == rig.poller.s.discovery.safety


def test_a_webhook_hand_over_reads_now_even_where_chains_are_stretched(rig: Rig) -> None:
    rig.poller.cadence.coverage = FixedCoverage(Coverage(healthy_until=rig.clock.now() + 3_600,  # type: ignore[assignment]
                                                 covered=frozenset({"image"}), route="ok"))
    rig.sume.status["job_w"] = [status("running")]
    handed = rig.submit("job_w").next(found_by="webhook", due_at=rig.clock.now())
    out = rig.run(handed)
    assert out.status_reads == 1 and out.name == "stretched"  # read at once, then back to the safety cadence


def test_a_canary_stays_on_the_normal_schedule_to_keep_measuring_coverage(rig: Rig) -> None:
    canary = next(f"job_c{i}" for i in range(1_000) if is_canary(f"job_c{i}"))
    rig.poller.cadence.coverage = FixedCoverage(Coverage(healthy_until=rig.clock.now() + 3_600,  # type: ignore[assignment]
                                                 covered=frozenset({"image"}), route="ok"))
    rig.sume.status[canary] = [status("running")]
    assert rig.run(rig.submit(canary)).name == "requeued"


def test_a_canary_reads_no_more_often_than_sweeps_run(rig: Rig) -> None:
    canary = next(f"job_c{i}" for i in range(1_000) if is_canary(f"job_c{i}"))
    rig.poller.cadence.coverage = FixedCoverage(Coverage(healthy_until=rig.clock.now() + 3_600,  # type: ignore[assignment]
                                                 covered=frozenset({"image"}), route="ok", every=300.0))
    rig.sume.status[canary] = [status("running")]
    out = rig.run(rig.submit(canary))
    assert out.name == "requeued" and out.send is not None  # not stretched: no normal time kept...
    nxt = parse_message(out.send.body)
    assert nxt.normal_due is None and nxt.due_at >= rig.clock.now() + 300.0  # ...but not before the next sweep


def test_a_chain_of_a_kind_sweeps_are_still_proving_reads_no_more_often_than_sweeps_run(rig: Rig) -> None:
    """Healthy sweeps that never missed a video find, none judged yet: the chain's reads between two
    sweeps would measure nothing the next sweep does not show. Once a video find was missed, the
    normal schedule."""
    proving = Coverage(healthy_until=rig.clock.now() + 3_600, covered=frozenset({"image"}), route="ok", every=300.0)
    rig.poller.cadence.coverage = FixedCoverage(proving)  # type: ignore[assignment]
    rig.sume.status["job_v"] = [status("running")]
    out = rig.run(rig.submit("job_v", "video"))
    nxt = rig.next_of(out)
    assert out.name == "requeued" and out.status_reads == 1 and nxt.normal_due is None
    assert nxt.due_at >= rig.clock.now() + 300.0
    missed = Coverage(healthy_until=rig.clock.now() + 3_600, covered=frozenset({"image"}), route="ok", every=300.0,
                      counts={"video": (0, 1)})
    rig.poller.cadence.coverage = FixedCoverage(missed)
    rig.sume.status["job_w"] = [status("running")]
    assert rig.next_of(rig.run(rig.submit("job_w", "video"))).due_at < rig.clock.now() + 300.0
    backing_off = Coverage(healthy_until=rig.clock.now() + 10**5, route="ok", every=16 * 300.0)  # idle sweeps
    rig.poller.cadence.coverage = FixedCoverage(backing_off)
    rig.sume.status["job_x"] = [status("running")]
    due = rig.next_of(rig.run(rig.submit("job_x", "video"))).due_at
    assert rig.clock.now() + 300.0 <= due <= rig.clock.now() + rig.poller.s.discovery.safety


def test_the_completion_interval_comes_from_the_reads_around_it() -> None:
    record = {"submitted_at": 1000, "seen_running_at": 1030.0, "seen_terminal_at": 1045.0, "status": "completed"}
    assert completion_interval(record) == (30.0, 45.0)
    assert completion_interval({**record, "seen_running_at": None}) == (0.0, 45.0)
    timed_out = {"submitted_at": 1000, "seen_running_at": 1500.0, "status": "timed_out"}
    assert completion_interval(timed_out) == (500.0, None)
    assert completion_interval({"status": "failed"}) is None


def test_the_poller_never_emits_metrics_itself() -> None:
    """Powertools' Metrics is not thread-safe: worker threads only return signals."""
    import inspect

    import sume_poller.poll.poller as module
    assert "metrics" not in inspect.getsource(module).split('"""', 2)[2]

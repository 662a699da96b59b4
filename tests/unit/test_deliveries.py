"""Late reads where webhooks arrive (deliveries.py, cadence.py, poller.py's probe): the plan drawn
from delivery ages, where a webhook kind's chain reads, and what a probe of the result route does."""

from __future__ import annotations

import itertools
import math
import random
from collections import defaultdict
from dataclasses import replace
from typing import Any

import pytest
from fakes import FakeClock, refused, retry
from test_poller import ENV, FixedCoverage, Rig

from sume_poller.config.settings import DiscoverySettings
from sume_poller.core.messages import STATUS_PHASE, PollMessage
from sume_poller.discovery.coverage import Coverage, is_canary
from sume_poller.discovery.deliveries import LOST_LATE_SHARE, LOST_WITHIN, MIN_SAMPLE, DeliveryStore, LatePlan, plans
from sume_poller.poll.cadence import Cadence
from sume_poller.poll.poller import PollSettings
from sume_poller.sume.client import Retryable

KINDS = {"image": (20.0, 0.4), "video": (360.0, 0.6), "ad_video": (720.0, 0.5)}


def lognormal(median: float, sigma: float, n: int, rng: random.Random) -> list[float]:
    return [median * math.exp(sigma * rng.gauss(0.0, 1.0)) for _ in range(n)]


def reads_before_and_late(plan: LatePlan, ages: list[float]) -> tuple[float, float]:
    """(reads made before completion a job, share found later than LOST_WITHIN if lost)."""
    reads = late = 0
    for a in ages:
        t = plan.first
        while t < a:
            reads += 1
            t = plan.next_age(t)
        late += t - a > LOST_WITHIN
    return reads / len(ages), late / len(ages)


# -- the plan --------------------------------------------------------------------------------------------

def test_reads_after_the_first_come_a_gap_apart_up_to_the_tail_then_space_out() -> None:
    plan = LatePlan(first=426.43, tail=1533.2)
    ages = [plan.first]
    for _ in range(6):
        ages.append(plan.next_age(ages[-1]))
    assert [round(b - a, 6) for a, b in itertools.pairwise(ages[:4])] == [LOST_WITHIN] * 3  # no float stall
    assert all(b > a for a, b in itertools.pairwise(ages))
    assert plan.next_age(2_000.0) == 3_000.0 and plan.next_age(10.0) == plan.first
    assert plan.probes(plan.tail + 1) and not plan.probes(plan.tail + LOST_WITHIN)  # a read due at the tail, late


def test_a_kind_with_too_few_deliveries_learns_a_gap_after_its_youngest_delivery_and_one_with_none_has_no_plan(
) -> None:
    rng = random.Random(1)
    few = lognormal(360, 0.6, MIN_SAMPLE - 1, rng)
    got = plans({"ad_video": [], "image": lognormal(20, 0.4, MIN_SAMPLE, rng), "video": few}, {}, loss=0.3)
    assert set(got) == {"image", "video"} and not got["image"].learning
    learning = got["video"]
    assert learning == LatePlan(min(few) + LOST_WITHIN, max(few), LOST_WITHIN, learning=True)
    # A lost job that finished at the youngest age seen or later is read within LOST_WITHIN of it,
    # past the tail too (reads stay a gap apart while the kind learns), the reads up to the tail
    # asking the result route and the later ones the status.
    for done in (min(few), max(few), 5 * max(few)):
        age = learning.first
        while age < done:
            age = learning.next_age(age)
        assert age - done <= LOST_WITHIN + 1e-6
    assert learning.next_age(0.0) == learning.first
    assert learning.probes(learning.tail) and not learning.probes(learning.tail + LOST_WITHIN)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_plan_keeps_lost_deliveries_found_late_within_the_share_and_reads_before_completion_few(
        seed: int) -> None:
    rng = random.Random(seed)
    samples = {k: lognormal(m, s, 200, rng) for k, (m, s) in KINDS.items()}
    got = plans(samples, {k: 1.0 for k in KINDS}, loss=0.3)
    fresh = {k: lognormal(m, s, 4_000, rng) for k, (m, s) in KINDS.items()}
    measured = {k: reads_before_and_late(got[k], fresh[k]) for k in KINDS}
    late = sum(v[1] for v in measured.values()) / len(KINDS)
    assert late * 0.3 <= LOST_LATE_SHARE + 0.015, measured  # the sample's own noise apart
    assert sum(v[0] for v in measured.values()) / len(KINDS) < 0.5, measured
    assert got["image"].first < 80 and measured["image"][0] < 0.05  # a short kind: read once, after nearly all


def test_more_loss_reads_earlier() -> None:
    rng = random.Random(4)
    samples = {"video": lognormal(360, 0.6, 200, rng)}
    assert plans(samples, {}, loss=0.9)["video"].first < plans(samples, {}, loss=0.1)["video"].first


class ListRedis:
    """The list commands DeliveryStore uses, pipelined, over a dict."""

    def __init__(self) -> None:
        self.lists: dict[str, list[str]] = defaultdict(list)
        self.calls: list[tuple[Any, ...]] = []

    def pipeline(self, transaction: bool = False) -> ListRedis:
        return self

    def lpush(self, key: str, value: Any) -> None:
        self.calls.append(("lpush", key))
        self.lists[key].insert(0, str(value))

    def ltrim(self, key: str, start: int, end: int) -> None:
        self.calls.append(("ltrim", key))
        self.lists[key] = self.lists[key][start:end + 1]

    def pexpire(self, key: str, ms: int) -> None:
        self.calls.append(("pexpire", key))

    def lrange(self, key: str, start: int, end: int) -> None:
        self.calls.append(("lrange", key))

    def execute(self) -> list[Any]:
        out = [list(self.lists[c[1]]) if c[0] == "lrange" else None for c in self.calls]
        self.calls = []
        return out


def test_the_store_keeps_bounded_samples_and_plans_from_the_loss_it_saw() -> None:
    client = ListRedis()
    store = DeliveryStore(client, "sume:poll:")
    rng = random.Random(5)
    for age in lognormal(360, 0.6, 250, rng):
        store.delivered("video", age)
    for _ in range(100):
        store.found("video")
    assert len(client.lists["sume:poll:!webhooks:ages:video"]) == 200
    assert client.lists["sume:poll:!webhooks:finds:video"].count("f") == 100
    got = store.plans()
    assert set(got) == {"video"}
    ages = [float(a) for a in client.lists["sume:poll:!webhooks:ages:video"]]
    assert got["video"] == plans({"video": ages}, {"video": 250.0}, loss=100 / 350)["video"]


# -- where a webhook kind's chain reads --------------------------------------------------------------------

class FixedPlans:
    def __init__(self, plans: dict[str, LatePlan]) -> None:
        self.plans = plans
        self.store = type("Store", (), {"found": lambda *a: None})()

    def get(self, kind: str) -> LatePlan | None:
        return self.plans.get(kind)


def hooked(clock: FakeClock, plan: dict[str, LatePlan], *, arriving: bool = True) -> Cadence:
    settings = PollSettings.from_env(ENV)
    settings = replace(settings, common=replace(settings.common, clock=clock),
                       discovery=DiscoverySettings(sweeps=False, webhook_kinds=frozenset({"video"})))
    coverage = FixedCoverage(Coverage(webhook_at=clock.now() if arriving else 0.0))
    return Cadence(settings, coverage=coverage, deliveries=FixedPlans(plan),  # type: ignore[arg-type]
                   rng=random.Random(1))


def message(clock: FakeClock, job_id: str = "job_v", kind: str = "video", **changes: Any) -> PollMessage:
    now = clock.now()
    return PollMessage(job_id=job_id, kind=kind, deadline_at=int(now) + 86_400, due_at=now, token="ab" * 16,
                       submitted_at=int(now), **changes)


def test_a_webhook_kind_reads_late_by_its_plan_and_at_the_safety_cadence_while_it_learns() -> None:
    clock = FakeClock()
    plan = LatePlan(first=500.0, tail=1_500.0)
    cadence = hooked(clock, {"video": plan})
    canary = next(f"job_c{i}" for i in range(1_000) if is_canary(f"job_c{i}"))
    for job_id in ("job_v", canary):  # canaries measure sweeps' coverage: webhooks read late on them too
        first = cadence.adjust(message(clock, job_id), clock.now())
        assert first.due_at == clock.now() + 500 and first.normal_due == clock.now()
    running = message(clock, reads=1)
    clock.advance(520)
    due, normal = cadence.next_read(running, clock.now(), None)
    assert due == running.submitted_at + 800 and normal is not None and normal < due  # type: ignore[operator]
    assert cadence.probes(running, clock.now())
    assert not cadence.probes(running.next(errors=1), clock.now())  # a fault: a status read decides
    assert not cadence.probes(running.next(found_by="webhook"), clock.now())
    assert not cadence.probes(message(clock, kind="image"), clock.now())  # no webhooks for images
    clock.advance(1_200)  # past the tail: status reads, spaced out
    assert not cadence.probes(running, clock.now())
    learning = hooked(clock, {})  # no delivery age yet to plan on: a read every LOST_WITHIN, status reads
    assert learning.adjust(message(clock), clock.now()).due_at == clock.now() + LOST_WITHIN
    assert learning.next_read(message(clock, reads=1), clock.now(), None)[0] == clock.now() + LOST_WITHIN
    assert not learning.probes(message(clock, reads=1), clock.now())
    few = hooked(clock, {"video": LatePlan(first=450.0, tail=600.0, learning=True)})  # a few ages: late reads
    assert few.adjust(message(clock), clock.now()).due_at == clock.now() + 450
    young = message(clock, reads=1)
    clock.advance(460)
    assert few.probes(young, clock.now()) and few.next_read(young, clock.now(), None)[0] == young.submitted_at + 750
    clock.advance(600)  # past the few ages' tail: status reads, still a gap apart
    assert not few.probes(young, clock.now())
    assert few.next_read(young, clock.now(), None)[0] == young.submitted_at + 1_350
    lapsed = hooked(clock, {"video": plan}, arriving=False)  # no delivery lately: the normal schedule
    msg = message(clock)
    assert lapsed.adjust(msg, clock.now()) == msg and not lapsed.probes(msg, clock.now())


# -- the probe -------------------------------------------------------------------------------------------

@pytest.fixture
def rig() -> Rig:
    r = Rig()
    r.poller.cadence = hooked(r.clock, {"video": LatePlan(first=500.0, tail=1_500.0)})
    return r


def test_a_late_chain_s_probe_that_finds_the_result_records_it_with_one_read(rig: Rig) -> None:
    first = rig.submit("job_v", "video")
    hop = rig.next_of(rig.run(first))
    assert hop.due_at == first.due_at + 500 and rig.sume.calls == []
    rig.clock.t = hop.due_at
    out = rig.run(hop)
    record = rig.store.records["job_v"]
    assert out.name == "terminal" and (out.status_reads, out.result_reads) == (0, 1)
    assert record["status"] == "completed" and record["found_by"] == "chain" and record["result_json"]
    assert rig.sume.calls == [("result", "job_v")] and len(rig.bus.events) == 1


def test_a_probe_without_a_result_leaves_the_job_to_its_next_late_read_and_a_refused_one_to_a_status_read(
        rig: Rig) -> None:
    rig.sume.result["job_v"] = [Retryable("result_not_ready", http_status=409), refused("request", 400),
                                retry(409)]
    first = rig.submit("job_v", "video")
    rig.clock.t = first.due_at + 500
    out = rig.run(first.next(due_at=rig.clock.t, normal_due=first.due_at))
    nxt = rig.next_of(out)
    assert out.name == "probed" and out.result_reads == 1 and nxt.phase == STATUS_PHASE and nxt.errors == 0
    assert nxt.due_at == first.due_at + 800 and rig.store.records["job_v"]["status"] == "pending"
    rig.clock.t = nxt.due_at
    out = rig.run(nxt)
    assert out.name == "transient" and rig.next_of(out).errors == 1  # never recorded from a refusal
    assert rig.store.records["job_v"]["status"] == "pending"
    assert not rig.poller.cadence.probes(rig.next_of(out), rig.clock.t)  # the next read is a status read


# -- the receiver learns ---------------------------------------------------------------------------------

def test_a_verified_delivery_keeps_its_job_s_age_also_for_a_job_already_recorded_which_reads_nothing() -> None:
    from fakes import FakeLease, FakeQueue, FakeStore

    from sume_poller.discovery.coverage import CoverageStore
    from sume_poller.discovery.webhook import WebhookReceiver, signature

    clock, store, queue, client = FakeClock(), FakeStore(), FakeQueue(), ListRedis()
    coverage = CoverageStore(client, "sume:poll:")
    coverage.webhook_arrived = lambda at: None  # type: ignore[method-assign]
    receiver = WebhookReceiver(clock, secret=lambda: "s", tolerance=300, store=store,  # type: ignore[arg-type]
                               lease=FakeLease(), queue=queue, handover_ttl_real=60, coverage=coverage)  # type: ignore[arg-type]
    for job_id in ("job_p", "job_t"):
        store.put_pending(job_id, "video", now=clock.now(), deadline_at=int(clock.now()) + 3_600)
    store.records["job_t"]["status"] = "completed"
    clock.advance(400)
    for n, job_id in enumerate(("job_p", "job_t")):
        raw = f'{{"type": "video_generation.ready", "data": {{"job_id": "{job_id}"}}}}'.encode()
        stamp = str(int(clock.now()))
        headers = {"X-Sume-Event-Id": f"evt_{n}", "X-Sume-Timestamp": stamp,
                   "X-Sume-Signature": signature("s", stamp, raw)}
        assert receiver.handle(headers, raw).status == 202
    assert client.lists["sume:poll:!webhooks:ages:video"] == ["400.0", "400.0"]
    assert len(queue.sent) == 1  # the recorded job: no read queued, no second event


def test_a_delivery_says_deliveries_arrive_only_once_its_age_is_kept() -> None:
    """A container that sees deliveries arrive but no age for the kind stretches the chains it starts to
    ``LOST_WITHIN`` from submission and keeps that view for ``DELIVERY_VIEW_TTL``: so the receiver keeps
    the job's age first, then says deliveries arrive (a duplicate says it too)."""
    from fakes import FakeLease, FakeQueue, FakeStore

    from sume_poller.discovery.coverage import CoverageStore
    from sume_poller.discovery.webhook import WebhookReceiver, signature

    clock, store, queue, client = FakeClock(), FakeStore(), FakeQueue(), ListRedis()
    deliveries, coverage = DeliveryStore(client, "sume:poll:"), CoverageStore(client, "sume:poll:")
    seen_at_arrival: list[dict[str, LatePlan]] = []
    coverage.webhook_arrived = lambda at: seen_at_arrival.append(deliveries.plans(["video"]))  # type: ignore[method-assign]
    receiver = WebhookReceiver(clock, secret=lambda: "s", tolerance=300, store=store,  # type: ignore[arg-type]
                               lease=FakeLease(), queue=queue, handover_ttl_real=60, coverage=coverage)  # type: ignore[arg-type]
    store.put_pending("job_p", "video", now=clock.now(), deadline_at=int(clock.now()) + 3_600)
    clock.advance(120)
    raw = b'{"type": "video_generation.ready", "data": {"job_id": "job_p"}}'
    stamp = str(int(clock.now()))
    headers = {"X-Sume-Event-Id": "evt_0", "X-Sume-Timestamp": stamp, "X-Sume-Signature": signature("s", stamp, raw)}
    assert [receiver.handle(headers, raw).status for _ in range(2)] == [202, 200]  # the second: a duplicate
    assert seen_at_arrival == [{"video": LatePlan(120 + LOST_WITHIN, 120, learning=True)}] * 2

"""Fault suite (issue #5): crashes at every step, duplicate and out-of-order deliveries, Redis
outages and key loss, Sume fault storms, a rejected key, absurd hints, and secrets in logs.

The promise under test: every submitted job reaches exactly one recorded terminal outcome; its
terminal event is never lost and never doubled for a consumer that dedupes by ``event_id``; and
no fault makes the system spend Sume reads without bound. After each scenario
:func:`invariants.check_invariants` checks the whole promise (see that module for the list) and
records a figures row; the rows are printed at the end of the module and merged into
``.scratch/fault-figures.md`` (and ``.json``) for the README's "Guarantees" section.

Everything runs on the real handlers (``tools.localrun.LocalSystem``): real redis-server, moto
server over HTTP, the Sume simulator. Time is real but short: leases of 2 s (conftest.TEST_ENV),
jobs of a few seconds. Two fast-forwards are used and named where they happen:

* SQS redelivery of a crashed batch after the queue's VisibilityTimeout (180 s in the template)
  is fast-forwarded with ``ChangeMessageVisibility(0)``, but only after the claim TTL has run
  out, as in production (visibility 180 s > claim TTL 60 s);
* ``sume_poller.poller.REDIS_RETRY_DELAY`` (30 s, a module constant) is monkeypatched to 1 s in
  the Redis-outage test. It is a timing constant only; no behaviour is patched.

Tests named ``test_a_...``/``test_terminal_event_...`` after the scenarios are regressions of
faults this suite found (fixed in df14ae9): the outbox lost after a crash on the last receive,
reads with a rejected key during the auth pause, a far Sume hint outliving the job deadline.

Size: every scenario uses ``SUME_FAULTS_JOBS`` jobs (default 50); this module takes about 5 min
on a shared 2-core machine (the crash scenario, 8 x ~20 s, is most of it). The larger variant::

    SUME_FAULTS_JOBS=500 .venv/bin/python -m pytest tests/test_faults.py

(moto's SQS slows down with queue depth, so 500 takes several times longer; deadlines scale).
Run the default with ``.venv/bin/python -m pytest tests/test_faults.py tests/test_fuzz.py``;
the figures are printed at the end of the run and written to ``.scratch/fault-figures.md``.
"""

from __future__ import annotations

import io
import json
import logging
import os
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from conftest import API_KEY, TEST_ENV
from invariants import (
    FIGURES,
    Crash,
    Driver,
    FakeSume,
    SumeTrace,
    check_invariants,
    record_figures,
    summary_line,
    write_figures,
)

from sume_poller.messages import PollMessage
from tools.localrun import API_KEY_NAME, LocalSystem
from tools.services import RedisServer

pytestmark = pytest.mark.integration

JOBS = int(os.environ.get("SUME_FAULTS_JOBS", "50"))
#: Deadlines grow with the job count (moto's SQS slows down with queue depth).
SCALE = max(1.0, JOBS / 50)
CLAIM_TTL = int(TEST_ENV["CLAIM_TTL_SECONDS"])
#: When a crashed batch is redelivered (stands for the 180 s VisibilityTimeout; > claim TTL).
REDELIVER_AFTER = CLAIM_TTL + 1.0


# -- fixtures ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def figures(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if not FIGURES:
        return
    write_figures(list(FIGURES))
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("")
        reporter.write_line(f"fault-suite figures ({JOBS} jobs per scenario; .scratch/fault-figures.md):")
        for row in FIGURES:
            reporter.write_line("  " + summary_line(row))


@pytest.fixture
def trace(fsys: LocalSystem) -> Iterator[SumeTrace]:
    """Per-job record of what the handlers' Sume client returned."""
    from sume_poller import runtime
    t = SumeTrace(runtime.sume_client()).install()
    yield t
    t.uninstall()


class SendSpy:
    """Records every poll message the handlers send (body, delay, when), then sends it."""

    def __init__(self) -> None:
        from sume_poller import runtime
        self.queue = runtime.poll_queue()
        self.sent: list[tuple[str, int, float]] = []
        self._lock = threading.Lock()
        original = self.queue.send

        def send(body: str, delay_seconds: int) -> None:
            with self._lock:
                self.sent.append((body, delay_seconds, time.monotonic()))
            original(body, delay_seconds)

        self.queue.send = send  # type: ignore[method-assign]

    def uninstall(self) -> None:
        self.queue.__dict__.pop("send", None)

    def for_job(self, job_id: str) -> list[tuple[dict[str, Any], int]]:
        with self._lock:
            return [(json.loads(b), d) for b, d, _ in self.sent if json.loads(b).get("job_id") == job_id]


@pytest.fixture
def spy(fsys: LocalSystem) -> Iterator[SendSpy]:
    s = SendSpy()
    yield s
    s.uninstall()


@pytest.fixture
def metric_names(fsys: LocalSystem, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Names of the metrics the handlers add (the EMF output's content)."""
    from sume_poller.observability import metrics
    names: Counter[str] = Counter()
    original = metrics.add_metric

    def add_metric(name: str, unit: Any, value: float, **kw: Any) -> None:
        names[name] += 1
        original(name=name, unit=unit, value=value, **kw)

    monkeypatch.setattr(metrics, "add_metric", add_metric)
    return names


# -- helpers ---------------------------------------------------------------------------------------------
def submit_jobs(system: LocalSystem, n: int, sim: dict[str, Any] | Callable[[int], dict[str, Any]],
                kind: str = "image") -> list[str]:
    """Submit ``n`` paid jobs through the Submit function (each queues its own first poll)."""
    ids: list[str] = []
    for i in range(n):
        spec = sim(i) if callable(sim) else sim
        reply = system.submit(kind, {"prompt": f"fault-suite {uuid.uuid4().hex[:8]} {i}", "sim": spec})
        assert reply["status"] == "submitted" and len(reply["new"]) == 1, reply
        ids.extend(reply["new"])
    return ids


def outcomes() -> Counter[str]:
    from sume_poller.poller import OUTCOME_TOTALS
    return Counter(OUTCOME_TOTALS)


def sim_reads(system: LocalSystem) -> int:
    return int(system.sim_stats()["status_reads"])


def no_outbox_left(system: LocalSystem, ids: list[str]) -> bool:
    return not any(r.get("event_pending") for r in system.jobs(ids).values())


def settled(system: LocalSystem, ids: list[str]) -> Callable[[], bool]:
    """All terminal, outboxes finished, and nothing left in the poll queue."""
    return lambda: (system.all_terminal(ids) and no_outbox_left(system, ids) and system.queue_depth() == 0)


def log_messages(caplog: pytest.LogCaptureFixture, level: str, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelname == level and text in r.getMessage()]


# == 1. a crash at every step of the poll path ==========================================================
CRASH_STEPS = ["claimed", "read", "renewed", "requeued", "result", "written", "published", "released"]


@pytest.mark.parametrize("step", CRASH_STEPS)
def test_crash_at_each_step_is_recovered_by_lease_expiry_fanout_and_redelivery(fsys: LocalSystem, step: str) -> None:
    """Every job's poller dies once at ``step`` (the whole batch with it: nothing is deleted).

    Phase 1, no redelivery at all: lease expiry plus fan-out alone must bring every job to a
    terminal record. Phase 2: SQS redelivers the crashed batches (visibility fast-forwarded once
    the claim TTL has passed): that must finish every outbox (a crash after the terminal write)
    and cost no Sume read. Bound: status_reads <= min_reads + 1 (the forced "running" first
    read) + 1 (the crash) + 1.
    """
    crashed: Counter[str] = Counter()
    lock = threading.Lock()

    def checkpoint(name: str, job_id: str) -> None:
        if name != step:
            return
        with lock:
            first = not crashed[job_id]
            crashed[job_id] += 1
        if first:
            raise Crash(f"{step} {job_id}")

    # The first status read of every job answers "running" (1 s hint) whenever it comes, so every
    # job passes renewed/requeued before its terminal read, however loaded the machine is.
    ids = submit_jobs(fsys, JOBS, {"duration": 3, "steps": 1, "status_override": {"status": "running", "reads": 1}})
    driver = Driver(fsys, poller=fsys.poller(checkpoint=checkpoint), fanout_every=2.0)
    phase1 = driver.run_until(lambda: fsys.all_terminal(ids), timeout=90 * SCALE,
                              what="every job terminal from lease expiry + fan-out alone")
    assert set(crashed) == set(ids), f"{len(set(ids) - set(crashed))} jobs never reached {step!r}"
    reads_before_redelivery = sim_reads(fsys)

    def redelivered_and_settled() -> bool:
        driver.redeliver_crashed(older_than=REDELIVER_AFTER)
        return all(b.redelivered for b in driver.crashed) and settled(fsys, ids)()

    driver.run_until(redelivered_and_settled, timeout=60 * SCALE, what="crashed batches redelivered, outboxes done")
    assert sim_reads(fsys) == reads_before_redelivery, "a redelivered crashed message read Sume again"
    verdict = check_invariants(
        fsys, ids, scenario=f"1 crash at {step}", faults=len(crashed),
        allowance=dict.fromkeys(ids, 2), result_allowance=dict.fromkeys(ids, 1 if step == "result" else 0),
        expected_status=dict.fromkeys(ids, "completed"),
        bound="status_reads <= min_reads + 1 forced running read + 1 crash + 1",
        notes=f"{len(driver.crashed)} batches crashed; phase 1 (fan-out only) {phase1:.0f} s")
    if step == "published":  # the event went out, the outbox mark did not: it is published again
        assert verdict.raw_duplicate_events >= len(ids)


def test_terminal_event_survives_a_crash_after_the_write_on_the_last_receive(fsys: LocalSystem) -> None:
    """Regression (found by this suite, fixed in df14ae9): the poller dies after the terminal
    write on the message's 5th receive (maxReceiveCount), so SQS moves that message to the DLQ
    instead of redelivering it. The event used to be lost for good (the write took the job out of
    the index; only a poll message could finish the outbox). Now the job sits in the index's
    outbox partition and fan-out finishes it. (Same shape: PutEvents failing 5 times in a row, or
    a ClaimTtlSeconds above the queue's 180 s VisibilityTimeout, which the template allows.)"""
    job = fsys.sim_seed("image", {"duration": 0.2, "steps": 1})
    fsys.record(job)
    fsys.send(PollMessage(job_id=job, kind="image", deadline_at=4_102_444_800, due_at=0).to_json())
    # Four receives that died before doing anything (Lambda timeouts/crashes before the claim).
    for _ in range(4):
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            got = fsys.receive(1)
        assert got, "message not received"
        fsys.sqs.change_message_visibility(QueueUrl=fsys.queue_url, ReceiptHandle=got[0]["ReceiptHandle"],
                                           VisibilityTimeout=0)
    driver = Driver(fsys, poller=fsys.poller(checkpoint=lambda step, _job: _crash_on(step, "written")),
                    fanout_every=2.0)
    driver.run_until(lambda: bool(driver.crashed), timeout=20, what="the 5th receive crashing after the write")
    assert fsys.jobs([job])[job]["status"] == "completed"

    def finished() -> bool:
        driver.redeliver_crashed(older_than=REDELIVER_AFTER)
        return no_outbox_left(fsys, [job])

    try:
        driver.run_until(finished, timeout=30, what="the terminal event of the crashed write")
    finally:
        events = fsys.drain_events()
        record_figures(scenario="1b crash after write on last receive", dlq=fsys.queue_depth(fsys.dlq_url),
                       event_pending=fsys.jobs([job])[job].get("event_pending", False),
                       events=len(events))
    assert [e["job_id"] for e in events] == [job]


def _crash_on(step: str, target: str) -> None:
    if step == target:
        raise Crash(step)


# == 2. duplicates and disorder ==========================================================================
def test_every_message_delivered_twice_reads_no_more(fsys: LocalSystem) -> None:
    """At-least-once delivery: every message arrives twice in its batch, fan-out ticking too.
    Bound: status_reads <= min_reads + 1."""
    ids = submit_jobs(fsys, JOBS, {"duration": 4, "steps": 2})
    driver = Driver(fsys, duplicate=True, fanout_every=2.0)
    driver.run_until(settled(fsys, ids), timeout=90 * SCALE, what="all jobs settled")
    assert fsys.stats.duplicates_delivered >= 2 * JOBS
    check_invariants(fsys, ids, scenario="2a every message twice", faults=fsys.stats.duplicates_delivered,
                     expected_status=dict.fromkeys(ids, "completed"),
                     bound="status_reads <= min_reads + 1", notes="duplicates in the same batch")


def test_out_of_order_late_copies_and_held_messages(fsys: LocalSystem) -> None:
    """Messages arrive out of order: batches are shuffled; a quarter of the messages are
    overtaken by a copy of themselves (the copy is processed first, the original arrives 1-6 s
    later); a tenth are held back past their lease (fan-out takes the job over) and arrive
    6-10 s late. Late and stale messages must drop themselves.
    Bound: status_reads <= min_reads + (messages held for that job) + 1."""
    rng = random.Random(5)
    held: list[tuple[float, str]] = []
    holds: Counter[str] = Counter()
    once: set[str] = set()
    late_copies = [0]

    def shape(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        now = time.monotonic()
        deliver_now: list[dict[str, Any]] = []
        for m in messages:
            body = m["Body"]
            r = rng.random()
            if body in once or r >= 0.35:
                deliver_now.append(m)
                continue
            once.add(body)
            holds[json.loads(body)["job_id"]] += 1
            fsys.sqs.delete_message(QueueUrl=fsys.queue_url, ReceiptHandle=m["ReceiptHandle"])
            if r < 0.25:  # a copy overtakes the original
                fsys.send(body)
                held.append((now + rng.uniform(1, 6), body))
                late_copies[0] += 1
            else:  # held past the lease
                held.append((now + rng.uniform(6, 10), body))
        rng.shuffle(deliver_now)
        return deliver_now

    def release_held() -> None:
        now = time.monotonic()
        for item in [h for h in held if h[0] <= now]:
            held.remove(item)
            fsys.send(item[1])

    ids = submit_jobs(fsys, JOBS, {"duration": 6, "steps": 3})
    before = outcomes()
    driver = Driver(fsys, fanout_every=2.0, shape=shape, on_cycle=release_held)
    driver.run_until(lambda: not held and settled(fsys, ids)(), timeout=120 * SCALE, what="all settled")
    dropped = outcomes() - before
    assert sum(holds.values()) >= JOBS // 4
    check_invariants(
        fsys, ids, scenario="2b out of order + late copies", faults=sum(holds.values()),
        allowance=holds, expected_status=dict.fromkeys(ids, "completed"),
        bound="status_reads <= min_reads + holds + 1",
        notes=f"{late_copies[0]} overtaken by a copy, {sum(holds.values()) - late_copies[0]} held past the lease; "
              f"stale dropped: {dropped['contention']} contention, {dropped['duplicate']} duplicate")


# == 3. Redis outage and key loss ============================================================================
def test_redis_outage_mid_run_keeps_chains_without_reads_and_loses_nothing(
        fsys: LocalSystem, redis_server: RedisServer, trace: SumeTrace, spy: SendSpy,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Redis stops in the middle of a batch (right after a Sume read) and stays down for a
    stretch, then comes back empty on the same port. Policy checked: a read whose lease renew
    fails re-queues anyway; a poll message that cannot reach Redis is re-sent unchanged after
    REDIS_RETRY_DELAY without reading Sume; fan-out sends nothing while Redis is down; after
    the restart nothing is lost. Bound: status_reads <= min_reads + 1 (restart) + 1.

    REDIS_RETRY_DELAY (30 s) is monkeypatched to 1 s: a timing constant only."""
    import sume_poller.poller as poller_module
    monkeypatch.setattr(poller_module, "REDIS_RETRY_DELAY", 1)
    outage_seconds = 4.0
    ids = submit_jobs(fsys, JOBS, {"duration": 6, "steps": 3})
    state: dict[str, Any] = {"stopped": None}
    lock = threading.Lock()

    def checkpoint(step: str, job_id: str) -> None:
        # Stop Redis right after a non-terminal read, once every job has been read at least once.
        if step != "read" or state["stopped"] is not None or trace.total("status_pending") < JOBS:
            return
        last = [w for _, j, w in trace.log if j == job_id][-1:]
        if last != ["status_pending"]:
            return
        with lock:
            if state["stopped"] is None:
                redis_server.stop()
                state["stopped"] = time.monotonic()

    caplog.set_level(logging.INFO)
    driver = Driver(fsys, poller=fsys.poller(checkpoint=checkpoint), fanout_every=2.0)
    try:
        driver.run_until(lambda: state["stopped"] is not None, timeout=60 * SCALE, what="Redis stopped mid-batch")
        reads_at_stop = sim_reads(fsys)
        sends_at_stop = len(spy.sent)
        seen_at_stop = len(fsys.seen_bodies)
        reports_at_stop = len(driver.fanout_reports)
        before = outcomes()
        driver.run_until(lambda: time.monotonic() - state["stopped"] > outage_seconds,
                         timeout=outage_seconds + 30 * SCALE, what="the outage stretch")
        during = outcomes() - before
        reads_during = sim_reads(fsys) - reads_at_stop
        outage_sends = spy.sent[sends_at_stop:]
        outage_reports = driver.fanout_reports[reports_at_stop:]
        delivered_before = set(fsys.seen_bodies[:len(fsys.seen_bodies)])
    finally:
        if not redis_server.running:
            redis_server.start()
    assert reads_during == 0, "Sume was read while Redis was down"
    assert during["redis_unavailable"] > 0 and set(during) <= {"redis_unavailable"}, during
    assert outage_sends and all(d == 1 for _, d, _ in outage_sends), "re-sent without REDIS_RETRY_DELAY"
    assert all(b in delivered_before for b, _, _ in outage_sends), "a message was changed when re-sent"
    assert outage_reports and all(r["redis_unavailable"] and r["sent"] == 0 for r in outage_reports)
    renew_failed = log_messages(caplog, "WARNING", "lease renew failed (Redis); re-queueing anyway")
    assert renew_failed, "no read was caught between claim and renew by the outage"
    assert seen_at_stop < len(fsys.seen_bodies)

    driver.run_until(settled(fsys, ids), timeout=120 * SCALE, what="all settled after Redis came back")
    assert fsys.stats.failures == 0
    check_invariants(fsys, ids, scenario="3a Redis down mid-run", faults=during["redis_unavailable"],
                     allowance=dict.fromkeys(ids, 1), expected_status=dict.fromkeys(ids, "completed"),
                     bound="status_reads <= min_reads + 1 restart + 1",
                     notes=f"down {outage_seconds:.0f} s: {during['redis_unavailable']} messages re-sent unchanged, "
                           f"0 reads, {len(outage_reports)} fan-outs sent 0, {len(renew_failed)} renews failed")


def test_redis_losing_all_keys_twice_mid_run_loses_nothing(fsys: LocalSystem, redis_server: RedisServer,
                                                            trace: SumeTrace) -> None:
    """FLUSHALL (as after a failover to an empty replica) twice while every job has a live chain:
    old chains re-take free leases, fan-out starts new chains, the lease fences them back to one.
    Bound: status_reads <= min_reads + 2 flushes + 1."""
    client = redis.Redis.from_url(redis_server.url)
    flushes: list[int] = []

    def flush_when_due() -> None:
        reads = trace.total("status_pending", "status_terminal")
        if len(flushes) < 2 and reads >= JOBS * (len(flushes) + 1):
            client.flushall()
            flushes.append(reads)

    ids = submit_jobs(fsys, JOBS, {"duration": 6, "steps": 3})
    before = outcomes()
    driver = Driver(fsys, fanout_every=2.0, on_cycle=flush_when_due)
    driver.run_until(lambda: len(flushes) == 2 and settled(fsys, ids)(), timeout=120 * SCALE, what="settled")
    during = outcomes() - before
    check_invariants(fsys, ids, scenario="3b Redis FLUSHALL x2", faults=2,
                     allowance=dict.fromkeys(ids, 2), expected_status=dict.fromkeys(ids, "completed"),
                     bound="status_reads <= min_reads + 2 flushes + 1",
                     notes=f"contention drops {during['contention']}")


# == 4. Sume faults ===========================================================================================
FAULT_MENU: list[dict[str, Any]] = [
    {"faults": ["429:2", "429:1"]},                   # a 429 burst with Retry-After
    {"faults": ["slow:2000"]},                         # a read timeout (SUME_READ_TIMEOUT 1.5 s)
    {"faults": ["slow:2000", "slow:2000"]},            # two in a row
    {"faults": ["malformed", "html"]},                 # garbage bodies
    {"faults": ["empty"]},
    {"status_override": {"status": "mystery", "reads": 2}},  # an unknown status
    {"faults": ["503:1", "502"]},
    {"result_faults": ["500"]},                        # the result fetch fails once
    {},
]


def test_sume_fault_storm_never_reaches_the_dlq(fsys: LocalSystem, trace: SumeTrace, spy: SendSpy,
                                                 caplog: pytest.LogCaptureFixture,
                                                 metric_names: Counter[str]) -> None:
    """20 % random 5xx on every status read plus per-job faults: 429 bursts with Retry-After,
    read timeouts, malformed/HTML/empty bodies, an unknown status, 5xx runs, result failures.
    Transient faults never fail a message (no batch item failure, empty DLQ) and every job ends
    completed. Faults per job are counted from what the client returned (a timed-out read is one
    read: the client never retries a read in-process).
    Bound: status_reads <= min_reads + faults served to the job + 1."""
    fsys.sim_config(error_rate_5xx=0.2, seed=11)
    caplog.set_level(logging.INFO)
    specs: dict[str, dict[str, Any]] = {}
    ids = submit_jobs(fsys, JOBS, lambda i: {"duration": 3, "steps": 2, **FAULT_MENU[i % len(FAULT_MENU)]})
    for i, job in enumerate(ids):
        specs[job] = FAULT_MENU[i % len(FAULT_MENU)]
    driver = Driver(fsys, fanout_every=2.0)
    driver.run_until(settled(fsys, ids), timeout=150 * SCALE, what="all settled")

    assert fsys.stats.failures == 0, "a transient fault failed a message (would go to the DLQ)"
    allowance: dict[str, int] = {}
    result_allowance: dict[str, int] = {}
    faults = 0
    for job in ids:
        served = trace.count(job, "status_retryable", "status_unknown", "result_retryable")
        allowance[job] = served
        result_allowance[job] = trace.count(job, "result_retryable")
        faults += served
    # Retry-After is the re-queue delay: the 429:2 jobs' first error re-queue waits 2 s.
    for job in ids:
        if specs[job].get("faults", [None])[0] == "429:2":
            first_error = [d for body, d in spy.for_job(job) if body["errors"] == 1]
            assert first_error and first_error[0] == 2, first_error
    mystery = [j for j in ids if "status_override" in specs[j]]
    assert len(log_messages(caplog, "WARNING", "unknown Sume status")) >= 2 * len(mystery)
    assert metric_names["UnknownStatus"] >= 2 * len(mystery)
    random_5xx = trace.total("status_retryable") - sum(len(specs[j].get("faults", [])) for j in ids)
    check_invariants(fsys, ids, scenario="4a Sume fault storm (20% 5xx + per-job faults)", faults=faults,
                     allowance=allowance, result_allowance=result_allowance,
                     expected_status=dict.fromkeys(ids, "completed"),
                     bound="status_reads <= min_reads + faults served + 1",
                     notes=f"~{max(random_5xx, 0)} random 5xx; {trace.total('status_retryable')} retryable status "
                           f"replies, {trace.total('result_retryable')} retryable result replies")


def test_sume_404_records_the_job_failed_once(fsys: LocalSystem, trace: SumeTrace) -> None:
    """A job Sume does not know (404), at the first read or after a transient fault, is recorded
    failed with code not_found: one event, no further reads, nothing in the DLQ."""
    half = max(1, JOBS // 2)
    unknown = [f"job_missing_{i:04d}_{uuid.uuid4().hex[:6]}" for i in range(half)]
    for job in unknown:  # registered, but Sume never heard of them
        assert fsys.invoke("SubmitFunction", {"kind": "image", "job_id": job})["status"] == "registered"
    later = submit_jobs(fsys, JOBS - half, {"duration": 30, "faults": ["500", "404"]})
    ids = unknown + later
    driver = Driver(fsys, fanout_every=2.0)
    driver.run_until(settled(fsys, ids), timeout=90 * SCALE, what="all settled")
    records = fsys.jobs(ids)
    assert all(r["error"]["code"] == "not_found" for r in records.values())
    stats = fsys.sim_stats()["jobs"]
    assert all(stats[j]["status_reads"] == 1 for j in unknown)
    assert all(stats[j]["status_reads"] == 2 for j in later)
    check_invariants(fsys, ids, scenario="4b Sume 404", faults=len(ids),
                     allowance=dict.fromkeys(unknown, 1), slack=0,
                     expected_status=dict.fromkeys(ids, "failed"),
                     bound="status_reads == 1 (+1 transient fault before a 404)")


def test_rejected_key_stops_polling_loudly_then_resumes_after_rotation(
        fsys: LocalSystem, trace: SumeTrace, caplog: pytest.LogCaptureFixture,
        metric_names: Counter[str], rdb: redis.Redis) -> None:
    """Sume starts rejecting the key while every job has a live chain. Every chain stops at its
    next read (no re-queue: the queue drains), fan-out pauses (AUTH_PAUSE_SECONDS, 5 s in tests),
    loudly: an ERROR line and an Outcome_auth_failed metric per rejected read; other messages
    for the job drop without a read while the pause lasts. Reads with the rejected key: at most
    one per live chain, plus the reads already in flight in the batch that met the first 401.
    The jobs stay pending in the index (fan-out's way back); once the key is rotated in SSM and
    the pause ends, every job completes. Bound: status_reads <= min_reads + 1 (restart) + 1."""
    caplog.set_level(logging.INFO)
    ids = submit_jobs(fsys, JOBS, {"duration": 15, "steps": 4})
    driver = Driver(fsys, fanout_every=2.0)
    driver.run_until(lambda: len([j for j in ids if trace.count(j, "status_pending")]) == len(ids),
                     timeout=60 * SCALE, what="every job's chain live")
    new_key = "sume_rotated_" + uuid.uuid4().hex
    in_flight = fsys.queue_depth()
    fsys.sim_config(api_key=new_key)
    t_rejected = time.monotonic()
    unauthorized_0 = fsys.sim_stats()["unauthorized"]
    driver.run_until(lambda: fsys.queue_depth() == 0, timeout=30 * SCALE, what="every chain stopped")
    rejected_reads = fsys.sim_stats()["unauthorized"] - unauthorized_0
    stopped_after = time.monotonic() - t_rejected
    per_job = Counter({j: trace.count(j, "status_fatal_key") for j in ids})
    assert 1 <= rejected_reads <= len(ids) + 10, (rejected_reads, in_flight)
    assert max(per_job.values()) <= 2, per_job.most_common(3)
    assert rdb.exists("sume:poll:!auth-paused")
    assert fsys.pending_count() == len(ids)  # still pending, still indexed: fan-out's way back
    paused_report = driver.fanout()  # a fan-out tick during the pause sends nothing
    assert paused_report["auth_paused"] and paused_report["sent"] == 0, paused_report
    errors = log_messages(caplog, "ERROR", "Sume rejected the API key: polling stopped")
    client_saw = trace.total("status_fatal_key", "result_fatal")
    assert len(errors) == metric_names["Outcome_auth_failed"] == client_saw >= 1, (
        len(errors), metric_names["Outcome_auth_failed"], client_saw, rejected_reads)
    assert API_KEY not in caplog.text and new_key not in caplog.text

    fsys.ssm.put_parameter(Name=API_KEY_NAME, Value=new_key, Type="SecureString", Overwrite=True)
    driver.run_until(settled(fsys, ids), timeout=120 * SCALE, what="all settled after rotation")
    total_rejected = fsys.sim_stats()["unauthorized"] - unauthorized_0
    check_invariants(fsys, ids, scenario="4c Sume 401 (key rejected, then rotated)", faults=total_rejected,
                     allowance=dict.fromkeys(ids, 1), expected_status=dict.fromkeys(ids, "completed"),
                     bound="status_reads <= min_reads + 1 + 1; rejected reads <= chains + 1 batch",
                     notes=f"{rejected_reads} rejected reads ({in_flight} messages in flight, {len(ids)} chains; "
                           f"up to {max(per_job.values())} for one job); all chains stopped "
                           f"{stopped_after:.1f} s after the rejection; {total_rejected} rejected in all")


def test_a_rejected_key_is_not_tried_again_for_the_same_job_during_the_pause(
        fsys: LocalSystem, trace: SumeTrace) -> None:
    """Regression (found by this suite, fixed in df14ae9): after a 401 the poller released the
    job's lease and paused fan-out but did not honour the pause itself, so any other message
    for the job (an SQS duplicate, a fan-out starter sent while the chain's message waited in a
    backlog) took the free lease and read Sume again with the rejected key (~2.6 rejected reads
    per job in the 401 scenario). A second message per job arriving during the pause must not
    read."""
    n = max(10, JOBS // 5)
    jobs = [fsys.sim_seed("image", {"duration": 60}) for _ in range(n)]
    for job in jobs:
        fsys.record(job)
    fsys.sim_config(api_key="sume_rotated_" + uuid.uuid4().hex)
    for job in jobs:
        fsys.send(PollMessage(job_id=job, kind="image", deadline_at=4_102_444_800, due_at=0).to_json())
    driver = Driver(fsys, fanout_every=None)
    driver.run_until(lambda: fsys.queue_depth() == 0, timeout=30, what="first messages processed")
    first = fsys.sim_stats()["unauthorized"]
    for job in jobs:  # a second message per job arrives while fan-out is paused
        fsys.send(PollMessage(job_id=job, kind="image", deadline_at=4_102_444_800, due_at=0).to_json())
    driver.run_until(lambda: fsys.queue_depth() == 0, timeout=30, what="second messages processed")
    total = fsys.sim_stats()["unauthorized"]
    record_figures(scenario="4e 401 then a second message per job", jobs=n, rejected_first=first,
                   rejected_during_pause=total - first)
    assert 1 <= first <= n
    assert total - first == 0, f"{total - first} more reads with the rejected key during the pause"


def test_a_far_sume_hint_never_outlives_the_job_deadline(fsys: LocalSystem) -> None:
    """Regression (found by this suite, fixed in df14ae9): a Sume reply with
    ``next_poll_after_seconds`` far in the future (1e9 s) made the chain hop toward that due time
    forever (hop before the deadline check; the lease renewed on every hop kept fan-out away): the
    job was never recorded timed_out. Hops are capped at 1 s here (``max_delay_seconds=1``)
    instead of 900 s so it shows in seconds."""
    from sume_poller import runtime
    from sume_poller.poller import Poller
    from sume_poller.sume import SumeClient

    with FakeSume() as fake:
        fake.default = (200, {}, lambda path: json.dumps({"job": {
            "id": path.rsplit("/", 1)[-1], "status": "running", "next_poll_after_seconds": 1e9}}).encode())
        settings = fsys.poller(max_delay_seconds=1).s
        poller = Poller(settings, runtime.lease_store(), SumeClient(fake.url, lambda: "k", read_timeout=2),
                        runtime.job_store(), runtime.poll_queue(), runtime.event_bus())
        job = "job_far_hint_" + uuid.uuid4().hex[:8]
        deadline = int(time.time()) + 3
        assert runtime.job_store().put_pending(job, "image", deadline, settings.pending_shards)
        fsys.send(PollMessage(job_id=job, kind="image", deadline_at=deadline, due_at=0).to_json())
        driver = Driver(fsys, poller=poller, fanout_every=2.0)
        try:
            driver.run_until(lambda: fsys.all_terminal([job]), timeout=15,
                             what="the job recorded timed_out after its deadline (3 s)")
        finally:
            record_figures(scenario="4d far hint vs deadline", sume_reads=len(fake.requests),
                           status=fsys.jobs([job])[job]["status"],
                           hops=len([b for b in fsys.seen_bodies if json.loads(b)["job_id"] == job]))
    assert fsys.jobs([job])[job]["status"] == "timed_out"


# == 7. secrets never reach the logs ==============================================================================
def test_no_key_and_no_result_url_in_any_log_line(fsys: LocalSystem, capsys: pytest.CaptureFixture[str],
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Every log line of a full run - submit, polls with transient faults and timeouts, results
    fetched (their signed URLs are in Sume's replies), a 404, a rejected key and its rotation,
    malformed messages, fan-out - with the project logger at DEBUG, and everything printed
    (EMF metrics) or logged by any library at DEBUG: neither the Sume API key nor a result URL
    (the simulator's contain "/signed/" and "sig=") appears anywhere."""
    from sume_poller.observability import logger

    n = 16
    stream = io.StringIO()
    handlers = [h for h in logger.handlers if hasattr(h, "setStream")]
    old_streams = [h.setStream(stream) for h in handlers]  # type: ignore[attr-defined]
    old_level = logger.log_level
    logger.setLevel("DEBUG")
    caplog.set_level(logging.INFO)  # every library logger at INFO (Lambda's root logger: WARNING)
    try:
        short = submit_jobs(fsys, n // 2, lambda i: {"duration": 2, "steps": 1, **FAULT_MENU[i % len(FAULT_MENU)]})
        long = submit_jobs(fsys, n // 2, lambda i: {"duration": 12, "steps": 2, **FAULT_MENU[i % len(FAULT_MENU)]})
        ids = short + long
        missing = "job_missing_" + uuid.uuid4().hex[:8]
        fsys.invoke("SubmitFunction", {"kind": "image", "job_id": missing})
        fsys.send("not json")
        fsys.send(PollMessage(job_id="job_x", kind="image", deadline_at=1, due_at=0).to_json()[:-5])
        driver = Driver(fsys, fanout_every=2.0)
        driver.run_until(lambda: fsys.all_terminal(short), timeout=60 * SCALE, what="the short jobs terminal")
        new_key = "sume_rotated_" + uuid.uuid4().hex
        fsys.sim_config(api_key=new_key)  # the long ones meet a rejected key...
        driver.run_until(lambda: fsys.sim_stats()["unauthorized"] > 0, timeout=30, what="a rejected read")
        fsys.ssm.put_parameter(Name=API_KEY_NAME, Value=new_key, Type="SecureString", Overwrite=True)
        fsys.invoke("SubmitFunction", {"kind": "image", "params": {"p": 1}})  # ...then a create after rotation
        driver.run_until(lambda: fsys.all_terminal([*ids, missing]), timeout=90 * SCALE, what="all terminal")
    finally:
        for h, old in zip(handlers, old_streams, strict=True):
            h.setStream(old)  # type: ignore[attr-defined]
        logger.setLevel(old_level)
    records = fsys.jobs(ids)
    urls = [json.loads(r["result_json"])["result"]["url"] for r in records.values() if "result_json" in r]
    assert urls and all("/signed/" in u and "sig=" in u for u in urls)  # the secrets did flow through
    written = stream.getvalue()
    printed = capsys.readouterr()
    everything = "\n".join([written, printed.out, printed.err, caplog.text,
                            *(json.dumps(r.__dict__, default=str) for r in caplog.records)])
    lines = written.splitlines()
    assert len([ln for ln in lines if '"job terminal"' in ln]) >= n  # the capture saw the run
    assert any("rejected the API key" in ln for ln in lines)
    assert all(ln.startswith("{") for ln in lines), "a log line is not one JSON object"
    for secret in [API_KEY, new_key, *urls, "/signed/", "sig="]:
        assert secret not in everything, f"{secret[:20]}... appears in the logs"
    events = fsys.drain_events()
    assert events and not any("/signed/" in json.dumps(e) for e in events)
    record_figures(scenario="7 secrets in logs", log_lines=len(lines), library_records=len(caplog.records),
                   result_urls_checked=len(urls), leaks=0)

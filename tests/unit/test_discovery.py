"""Bulk discovery through fakes: sweeps (sweep.py) and webhooks (webhook.py). What a sweep proves,
when it runs at all, how it hands finished jobs over; what a webhook accepts and refuses."""

from __future__ import annotations

import json

import pytest
from fakes import FakeBudget, FakeClock, FakeCoverage, FakeLease, FakeQueue, FakeStore, FakeSume, refused

from sume_poller.core.messages import RESULT_PHASE, STATUS_PHASE, parse_message
from sume_poller.discovery.sweep import Sweeper, SweepSettings
from sume_poller.discovery.webhook import WebhookReceiver, signature
from sume_poller.limits.budget import Grant
from sume_poller.limits.lease import new_token
from sume_poller.sume.listing import Listing


class Parts:
    def __init__(self) -> None:
        self.clock, self.sume, self.store, self.queue = FakeClock(), FakeSume(), FakeStore(), FakeQueue()
        self.lease, self.budget, self.coverage = FakeLease(), FakeBudget(), FakeCoverage()
        self.budget.pending = 1_000

    def sweeper(self, **settings: object) -> Sweeper:
        return Sweeper(SweepSettings(period=60.0, **settings), self.clock, sume=self.sume,  # type: ignore[arg-type]
                       store=self.store, queue=self.queue, lease=self.lease, budget=self.budget,  # type: ignore[arg-type]
                       coverage=self.coverage, remaining_ms=lambda: 50_000, handover_ttl_real=60)  # type: ignore[arg-type]

    def pending(self, job_id: str, kind: str = "video") -> str:
        self.store.put_pending(job_id, kind, now=self.clock.now(), deadline_at=int(self.clock.now()) + 86_400)
        token = new_token()
        self.lease.values[job_id] = f"{token}:3"  # a chain waiting for step 3
        return token


@pytest.fixture
def parts() -> Parts:
    return Parts()


def page(*items: tuple[str, str], cursor: str | None = None, has_cursor: bool = True) -> Listing:
    return Listing(tuple({"id": i, "status": s} for i, s in items), cursor, has_cursor)


def test_a_sweep_hands_listed_pending_jobs_over_to_a_read_that_confirms_them(parts: Parts) -> None:
    """A completed job gets its result read (the proof), a failed one its status read: a list
    never makes a job terminal by itself."""
    token = parts.pending("job_done")
    parts.pending("job_failed", "image")
    parts.sume.listing = [page(("job_done", "completed"), ("job_other_workspace", "completed")),
                          page(("job_failed", "failed")), page(), page()]
    report = parts.sweeper().run()
    assert report.complete and report.handed_over == 2 and report.reads == 4
    first = parse_message(parts.queue.sent[0].body)
    assert (first.token, first.seq, first.phase, first.found_by) == (token, 4, RESULT_PHASE, "sweep")
    assert first.outcome is not None and first.outcome.to_json() == {
        "status": "completed", "sume_status": "completed", "source": "list"}
    assert parts.lease.values["job_done"] == f"{token}:4*"  # the chain's waiting step 3 is fenced out
    failed = parse_message(parts.queue.sent[1].body)
    assert (failed.phase, failed.outcome, failed.found_by) == (STATUS_PHASE, None, "sweep")


def test_a_job_handed_over_is_due_at_once_with_the_slot_its_fenced_step_had_reserved(parts: Parts) -> None:
    token = parts.pending("job_slot")
    slot = parts.clock.now() + 120.0
    parts.lease.values["job_slot"] = f"{token}:3@{int(slot * 1000)}"  # step 3 waits for a slot 2 minutes away
    parts.pending("job_failed")
    parts.sume.listing = [page(("job_slot", "completed")), page(("job_failed", "failed")), page(), page()]
    assert parts.sweeper().run().handed_over == 2
    sent = [parse_message(m.body) for m in parts.queue.sent]
    assert [(m.seq, m.phase, m.slot_at, m.due_at) for m in sent] == [
        (4, RESULT_PHASE, pytest.approx(slot), parts.clock.now()), (4, STATUS_PHASE, None, parts.clock.now())]
    assert [m.delay for m in parts.queue.sent] == [0.0, 0.0]


def test_a_sweep_starts_only_when_its_lane_has_its_reads_free_and_reserves_none_otherwise(parts: Parts) -> None:
    parts.pending("job_done")
    parts.sume.listing = [page(("job_done", "completed"))]
    parts.budget.grants = [Grant(False, 40.0)] * 3  # the lane's next reads are 40 s away; the line spares none
    report = parts.sweeper().run()
    assert not report.ran and report.reads == 0 and (report.why_not or "").startswith("read budget busy")
    assert parts.budget.patience == [0.0] * 3 and parts.budget.modes == ["list"] * 3  # a refusal reserves nothing
    assert parts.budget.counts == [4, 2, 1]  # every status; completed and a failure status; completed alone
    assert parts.sume.calls == [] and parts.budget.lane is not None  # the lane stays open for the next tick


def test_a_sweep_borrows_the_reads_the_line_leaves_unspent_when_its_lane_has_none_free(parts: Parts) -> None:
    parts.sume.listing = [page()] * 4
    parts.budget.grants = [Grant(False, 40.0)] * 2  # the lane's next reads are 40 s away...
    parts.budget.spares = True  # ...and the line spends less than an evenly spent day
    report = parts.sweeper().run()
    assert report.ran and report.complete and parts.budget.modes[:3] == ["list", "list", "spare"]
    assert parts.budget.patience[:3] == [0.0] * 3 and parts.budget.counts[:3] == [4, 2, 2]


def test_a_sweep_reserves_its_usual_reads_at_once_and_each_page_past_them_alone(parts: Parts) -> None:
    parts.sume.listing = [page(cursor="a"), page(cursor="b"), page(cursor="c"), page(), page(), page(), page()]
    report = parts.sweeper(read_share=0.2).run()
    assert report.complete and report.reads == 7
    assert parts.budget.modes == ["list"] * 4 and parts.budget.counts == [4, 1, 1, 1]  # 4 at the start, then one a page
    assert parts.budget.lane == (0.2, parts.clock.now() + 2 * 86_400)
    parts.budget.counts.clear()
    parts.sume.listing = [page()] * 4
    for _ in range(2):  # an idle sweep doubles the interval: the next tick skips
        parts.clock.advance(60)
        parts.sweeper().run()
    assert parts.budget.counts == [7]  # this time the 7 the last sweep cost, at once


def test_a_job_mid_poll_is_left_to_its_chain(parts: Parts) -> None:
    token = parts.pending("job_busy")
    parts.lease.values["job_busy"] = f"{token}:3!abcd"
    parts.sume.listing = [page(("job_busy", "completed")), page(), page(), page()]
    report = parts.sweeper().run()
    assert report.left_to_chain == 1 and parts.queue.sent == []


def test_a_full_page_without_a_cursor_proves_nothing(parts: Parts) -> None:
    parts.sume.listing = [Listing(tuple({"id": f"job_{i}", "status": "completed"} for i in range(100)), None, False),
                          page(), page(), page()]
    report = parts.sweeper().run()
    assert not report.complete and "without a usable cursor" in (report.incomplete_reason or "")
    assert "healthy_until" not in parts.coverage.fields


def test_the_page_cap_makes_a_sweep_incomplete(parts: Parts) -> None:
    parts.sume.listing = [page(("job_x", "completed"), cursor=f"c{i}") for i in range(3)]
    report = parts.sweeper(max_pages=3).run()
    assert not report.complete and "capped at 3" in (report.incomplete_reason or "")


@pytest.mark.parametrize(("status", "route"), [(404, "broken"), (400, "broken"), (403, "forbidden")])
def test_a_list_route_that_refuses_turns_sweeps_off_without_pausing_the_key(parts: Parts, status: int,
                                                                         route: str) -> None:
    why = {404: "not_found", 400: "request", 403: "forbidden"}[status]
    parts.sume.listing = [refused(why, status)]
    report = parts.sweeper().run()
    assert not report.complete and parts.coverage.fields["route"] == route
    assert parts.budget.key_paused_for is None  # a 403 on the list is about the list, not the key
    parts.sume.listing = [page()]
    assert not parts.sweeper().run().ran  # stays off until the route is tried again


def test_few_pending_jobs_make_sweeps_back_off_and_chains_return_to_normal(parts: Parts) -> None:
    parts.budget.pending = 10
    parts.coverage.update(healthy_until=parts.clock.now() + 600)
    report = parts.sweeper().run()
    assert not report.ran and "chains are cheaper" in (report.why_not or "") and parts.sume.calls == []
    assert float(parts.coverage.fields["healthy_until"]) == 0


def test_few_pending_jobs_are_swept_when_their_chains_status_reads_cost_more_than_a_sweep(parts: Parts) -> None:
    """The cost rule weighs what chains spend (the limiter's status-read counter over a tick, per
    pending job, measured while no chain is stretched) against a sweep's list reads."""
    parts.budget.pending = 10  # 2.5 jobs per list read: by the pending count alone, chains are cheaper
    parts.sume.listing = [page()] * 8
    assert not parts.sweeper().run().ran  # no measure yet
    parts.clock.advance(60)
    parts.budget.status_taken = 2  # 2 status reads in a minute on 10 jobs: 2 a sweep of 4 list reads
    report = parts.sweeper().run()
    assert not report.ran and "status reads 2.0 a sweep: chains are cheaper" in (report.why_not or "")
    parts.clock.advance(60)
    parts.budget.status_taken += 19  # 19 in the next minute: under 5 a list read of a sweep of 4
    assert not parts.sweeper().run().ran
    parts.clock.advance(60)
    parts.budget.status_taken += 20  # 20: a sweep pays
    assert parts.sweeper().run().ran
    assert float(parts.coverage.fields["status_rate"]) == pytest.approx(20 / 60 / 10)


def test_a_complete_sweep_keeps_coverage_for_two_of_the_lanes_intervals_where_the_lane_is_slower(
        parts: Parts) -> None:
    parts.sume.listing = [page()] * 4
    parts.budget.lane_per_second = 4 / 300  # the lane sustains a sweep of 4 list reads every 300 s
    started = parts.clock.now()
    assert parts.sweeper(lag=60.0).run().complete
    assert float(parts.coverage.fields["healthy_until"]) == pytest.approx(started + 2 * 300 + 60)


def test_idle_sweeps_double_their_interval(parts: Parts) -> None:
    parts.sume.listing = [page()]
    assert parts.sweeper().run().ran
    parts.clock.advance(61)
    assert not parts.sweeper().run().ran  # one idle sweep: wait two periods
    parts.clock.advance(61)
    assert parts.sweeper().run().ran


def test_coverage_counts_what_chains_found_and_a_miss_resets_it(parts: Parts) -> None:
    start = parts.clock.now()
    for i in range(5):
        parts.coverage.found("video", f"job_{i}", start - 10)
    parts.store.records.update({f"job_{i}": {"job_id": f"job_{i}", "kind": "video", "status": "completed"}
                                for i in range(5)})
    parts.sume.listing = [page(*((f"job_{i}", "completed") for i in range(5))), page(), page(), page()]
    assert parts.sweeper().run().coverage == {"video": (5, 0)}
    assert parts.coverage.fields["cov:video"] == "5"
    parts.clock.advance(120)
    parts.coverage.found("video", "job_missed", parts.clock.now() - 100)  # terminal long before the sweep
    parts.sume.listing = [page()]
    assert parts.sweeper(lag=60.0).run().coverage["video"] == (0, 1)
    assert parts.coverage.fields["cov:video"] == "0"


class _Hash:
    """The one Redis call a coverage snapshot makes."""

    def __init__(self, fields: dict[str, str]) -> None:
        self.fields = fields

    def hgetall(self, key: str) -> dict[str, str]:
        return dict(self.fields)


def test_a_kind_never_missed_is_covered_on_its_first_find_and_once_missed_needs_five_in_a_row() -> None:
    from sume_poller.discovery.coverage import MIN_COVERED, CoverageStore

    healthy = {"route": "ok", "healthy_until": "1000"}
    first = CoverageStore(_Hash({**healthy, "cov:video": "1", "cov:image": "0"}), "p:").snapshot(0.0)
    assert first.covered == {"video"} and first.stretches("video", 10.0) and not first.stretches("image", 10.0)
    missed = {**healthy, "miss:video": "1"}
    for n in range(1, MIN_COVERED + 1):
        snapshot = CoverageStore(_Hash({**missed, "cov:video": str(n)}), "p:").snapshot(0.0)
        assert snapshot.stretches("video", 10.0) == (n == MIN_COVERED)
    assert not CoverageStore(_Hash({**healthy, "cov:video": "1", "healthy_until": "5"}), "p:").snapshot(
        0.0).stretches("video", 10.0)  # sweeps no longer healthy


def test_where_the_lane_cannot_pay_for_every_status_a_sweep_lists_completed_and_an_overdue_failure_status(
        parts: Parts) -> None:
    """And judges only the chains' finds of the statuses it listed; each failure status at least
    every safety cadence (rare_every), from the lane or the line's spare reads."""
    parts.sume.listing = [page()] * 4
    assert parts.sweeper().run().reads == 4  # every status (the lane sustains 4 a tick and had them free)
    parts.coverage.found("video", "job_failed", parts.clock.now(), status="failed")
    parts.store.records["job_failed"] = {"job_id": "job_failed", "kind": "video", "status": "failed"}
    parts.clock.advance(300)
    parts.budget.modes.clear()
    parts.budget.counts.clear()
    parts.budget.grants = [Grant(False, 300.0)]  # 4 not free now; the failure statuses are not due
    report = parts.sweeper(lag=60.0).run()
    assert report.complete and report.reads == 1 and parts.sume.calls[-1] == ("list", "completed")
    assert parts.budget.counts == [4, 1]
    assert report.coverage.get("video", (0, 0)) == (0, 0)  # the failed find waits for a sweep of failures
    # every failure status due: the one listed longest ago beside completed
    parts.clock.advance(SweepSettings(period=60.0).rare_every)
    parts.coverage.update(**{"read_at:canceled": parts.clock.now() - 1, "read_at:expired": parts.clock.now() - 1})
    parts.budget.modes.clear()
    parts.budget.grants = [Grant(False, 300.0)] * 2
    parts.budget.spares = True
    parts.sume.listing = [page(), page(("job_failed", "failed"))]
    report = parts.sweeper(lag=60.0).run()
    assert parts.budget.modes == ["list", "list", "spare"] and report.reads == 2
    assert parts.sume.calls[-2:] == [("list", "completed"), ("list", "failed")] and report.coverage["video"] == (1, 0)


# -- webhooks ------------------------------------------------------------------------------------------
SECRET = "whsec_test"


class Hooks:
    def __init__(self) -> None:
        self.clock, self.store, self.queue, self.lease = FakeClock(), FakeStore(), FakeQueue(), FakeLease()
        self.receiver = WebhookReceiver(self.clock, secret=lambda: SECRET, tolerance=300, store=self.store,  # type: ignore[arg-type]
                                        lease=self.lease, queue=self.queue, handover_ttl_real=60)  # type: ignore[arg-type]

    def deliver(self, job_id: str, event_id: str = "evt_1", *, at: float | None = None, secret: str = SECRET,
                body: bytes | None = None, event: str = "ready",
                data: dict[str, object] | None = None) -> tuple[int, dict[str, object]]:
        raw = body if body is not None else json.dumps({"id": event_id, "type": f"video_generation.{event}",
                                                        "data": {"job_id": job_id, "status": "completed",
                                                                 **(data or {})}}).encode()
        stamp = str(int(at if at is not None else self.clock.now()))
        answer = self.receiver.handle({"X-Sume-Event-Id": event_id, "X-Sume-Timestamp": stamp,
                                       "X-Sume-Signature": signature(secret, stamp, raw)}, raw)
        return answer.status, answer.body


@pytest.fixture
def hooks() -> Hooks:
    return Hooks()


def test_a_signed_delivery_is_sume_s_word_a_ready_job_goes_to_its_result_read_a_failed_one_is_recorded(
        hooks: Hooks) -> None:
    """Verified, a delivery is trusted like a per-job read: ``*.ready`` hands the waiting chain to
    its result read (one read), ``*.failed`` to a step that records the failure the body carries
    (no read), any other type to a status read."""
    now = hooks.clock.now()
    for job_id in ("job_r", "job_f", "job_o"):
        hooks.store.put_pending(job_id, "video", now=now, deadline_at=int(now) + 60)
        hooks.lease.values[job_id] = "ab" * 16 + ":2"
    assert hooks.deliver("job_r")[0] == 202
    assert hooks.deliver("job_f", "evt_2", event="failed",
                         data={"status": "canceled", "error": {"code": "user_canceled", "message": "x"}})[0] == 202
    assert hooks.deliver("job_o", "evt_3", event="progress")[0] == 202
    ready, failed, other = (parse_message(m.body) for m in hooks.queue.sent)
    assert (ready.seq, ready.phase, ready.found_by) == (3, "result", "webhook")
    assert ready.outcome is not None and ready.outcome.to_json() == {
        "status": "completed", "sume_status": "completed", "source": "webhook"}
    assert failed.outcome is not None and failed.outcome.to_json() == {
        "status": "canceled", "sume_status": "canceled", "source": "webhook",
        "error": {"code": "user_canceled", "message": "x"}}
    assert (other.phase, other.outcome) == ("status", None)
    assert hooks.deliver("job_r") == (200, {"duplicate": True}) and len(hooks.queue.sent) == 3


@pytest.mark.parametrize(("case", "expected"), [("forged", 401), ("replayed", 401), ("oversized", 413),
                                                ("malformed", 400)])
def test_bad_deliveries_get_their_documented_answer_and_queue_nothing(hooks: Hooks, case: str,
                                                                      expected: int) -> None:
    hooks.store.put_pending("job_w", "video", now=hooks.clock.now(), deadline_at=int(hooks.clock.now()) + 60)
    kwargs: dict[str, object] = {"forged": {"secret": "wrong"}, "replayed": {"at": hooks.clock.now() - 3_600},
                                 "oversized": {"body": b"x" * 70_000}, "malformed": {"body": b"{not json"}}[case]
    assert hooks.deliver("job_w", **kwargs)[0] == expected  # type: ignore[arg-type]
    assert hooks.queue.sent == []


def test_a_delivery_for_a_job_already_finished_or_not_ours_reads_nothing(hooks: Hooks) -> None:
    assert hooks.deliver("job_unknown")[0] == 202 and hooks.queue.sent == []
    hooks.store.put_pending("job_t", "video", now=hooks.clock.now(), deadline_at=int(hooks.clock.now()) + 60)
    hooks.store.records["job_t"]["status"] = "completed"
    assert hooks.deliver("job_t", event_id="evt_2")[0] == 202 and hooks.queue.sent == []


def test_one_keys_event_ids_never_silence_another_keys_delivery(hooks: Hooks) -> None:
    """Event ids are remembered per key: a delivery signed with one workspace's secret (a tenant
    may hold its own) cannot mark another workspace's event id seen and drop its delivery."""
    hooks.receiver.secrets = lambda: {"default": SECRET, "acme": "whsec_acme"}
    now = hooks.clock.now()
    hooks.store.put_pending("job_b", "video", now=now, deadline_at=int(now) + 60, key="acme")
    hooks.store.put_pending("job_d", "video", now=now, deadline_at=int(now) + 60)
    hooks.lease.values["job_b"] = hooks.lease.values["job_d"] = "ab" * 16 + ":2"
    assert hooks.deliver("job_d", "evt_shared")[0] == 202  # the default key's delivery, its own job
    assert hooks.deliver("job_b", "evt_shared", secret="whsec_acme") == (202, {"job_id": "job_b", "queued": True})
    assert [parse_message(m.body).job_id for m in hooks.queue.sent] == ["job_d", "job_b"]
    assert hooks.deliver("job_b", "evt_shared", secret="whsec_acme") == (200, {"duplicate": True})  # its own repeat


def dated(job_id: str, status: str, created: float) -> dict[str, object]:
    return {"id": job_id, "status": status, "created_at": created}


def test_pages_newest_created_first_stop_at_the_oldest_pending_submission(parts: Parts) -> None:
    """No job of ours was created before the oldest pending job's submission (fan-out's last round
    said when, less a margin): a list that comes newest-created first stops paging there - history
    does not make a sweep dearer - and the sweep judges only the finds it could have listed."""
    now = parts.clock.now()
    parts.budget.oldest = now - 600
    parts.pending("job_new")
    first = (dated("job_new", "completed", now - 100), dated("job_old1", "completed", now - 400))
    second = (dated("job_old2", "completed", now - 900), dated("job_old3", "completed", now - 5_000))
    pages = [Listing(first, "c1", True), Listing(second, "c2", True)]
    parts.sume.listing = [*pages, page(), page(), page()]  # a third completed page is never asked for
    report = parts.sweeper().run()
    assert report.complete and report.handed_over == 1
    assert report.reads == 2 + 3  # completed stopped at its 2nd page (created 900 s ago < 600 + 60)
    assert parts.coverage.judged_created_after == pytest.approx(now - 600 - 60)


def test_pages_out_of_created_order_are_read_to_the_end(parts: Parts) -> None:
    now = parts.clock.now()
    parts.budget.oldest = now - 600
    pages = [Listing((dated("job_a", "completed", now - 5_000), dated("job_b", "completed", now - 100)), "c1", True),
             Listing((dated("job_c", "completed", now - 9_000),), "c2", True),
             Listing((dated("job_d", "completed", now - 200),), None, True)]
    parts.sume.listing = [*pages, page(), page(), page()]
    report = parts.sweeper().run()
    assert report.complete and report.reads == 3 + 3 and parts.coverage.judged_created_after is None

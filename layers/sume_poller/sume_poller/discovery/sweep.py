"""Sweeps: find finished jobs in bulk on Sume's list route, and hand them to their chains' end.

``GET /jobs`` lists the workspace's jobs, a page per read. Its order, cursor field and filters
are not documented, so a sweep assumes nothing it has not checked:

* one ``status`` per call (completed, failed, canceled, expired), no ``type`` filter: listed ids
  are matched to this project's pending jobs by their records (which know each job's kind);
  ids this project never submitted are ignored. Where the lane cannot pay for all four each tick, a
  sweep lists ``completed`` and beside it the failure status listed longest ago once that is
  the safety cadence ago (else ``completed`` alone), and judges only the chains' finds of the
  statuses it listed;
* the filter filters: every item of a page must carry a terminal status equal to the one asked
  (case-insensitive, synonyms allowed: ``complete`` for ``completed``, ``cancelled`` for
  ``canceled``...). Anything else on the page - a running job, an item without a status, another
  terminal status - is evidence that the route does not filter as assumed: nothing of that page is
  handed over, the sweep stops, and that status is left out of sweeps for an hour (proving nothing
  meanwhile, so every kind is on the normal schedule; ``SweepRouteBroken`` and its alarm);
* pages are read until the reply says there are no more (a cursor field that comes back empty),
  or - when items carry ``updated_at`` and it never increases down the pages - until they reach
  back past the previous complete sweep (minus the list's lag allowance), or - when items carry
  ``created_at`` and it never increases down the pages (newest created first, checked on every
  page) - until they reach back past the oldest pending job's submission (less a margin): no job
  of ours is older (fan-out learns that submission on each full round of the pending index, and
  none is older than ``JobMaxAgeSeconds`` anyway). Such a sweep judges coverage only on the
  chains' finds it could have listed. A full page without a
  usable cursor, a cursor that comes back again, a failed page read (5xx, garbage) or reaching the
  page cap makes the sweep *incomplete*: it handed over what it saw but proves nothing;
* a 404/400 on the route (or garbage) marks it broken and a 403 forbidden, for an hour: sweeps
  stop and every kind returns to the normal schedule. A 403 on the list is about the list, not
  the key: chains are not paused;
* every list read takes a slot from the shared read budget: from the sweeps' lane, a share of
  each window kept for them (:meth:`Budget.open_lane`, opened on every tick), so however far
  chains have reserved the budget ahead, a sweep reads now; where the lane has none free, from the
  reads the line leaves unspent (it spends less than an evenly spent day: :meth:`Budget.spare`).

Sweeps run per Sume key (the list route lists one workspace), each in its key's budget lane with
its own state; a listed id whose record belongs to another key is ignored.

A listed job that is pending here is handed over (:meth:`LeaseStore.hand_over`): its waiting
chain step is fenced out and a message that reads now is queued in its place. A list never makes a
job terminal by itself - only the job's own routes do: a completed job gets its result read (the
result is the proof; a result route that says it has none sends the job back to a status read,
once), a failed/canceled/expired one gets its status read, which records it (the same one read a
sweep that checked the status itself would spend, and the poll path's fences and budget come with
it). If a delivery of the chain is mid-poll, the sweep leaves the job to it. Complete sweeps then
judge coverage (:mod:`sume_poller.discovery.coverage`).

Cadence: the schedule ticks (the sweep measures how often, in clock time), but a sweep runs only
while it saves reads: when the pending jobs it could finish are many per list read it costs
(``MIN_JOBS_PER_READ``), or the status reads chains spend between two sweeps are (measured from the
limiter's ``status_taken`` over each tick, per pending job, while no chain is stretched). While no
kind is covered, every idle sweep (nothing finished, no coverage confirmed) doubles the wait
before the next one, up to 16 periods; once chains rely on sweeps, they run every period. A
complete sweep keeps coverage healthy for two intervals of sweeps (the tick's, or the lane's for a
sweep of every status where that is slower) plus the lag.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import asdict, field
from typing import Any, ClassVar

from ..config.keys import SumeKey, record_key
from ..config.settings import (
    SAFETY_MARGIN_MS,
    DiscoverySettings,
    JobSettings,
    SumeReaderSettings,
    default,
    safety_cadence,
    schedule_period,
    setting,
)
from ..core.clock import Clock
from ..core.jobs import InvalidJobId, State, canonical_terminal_status, classify_status, validate_job_id
from ..core.messages import RESULT_PHASE, STATUS_PHASE, Finding, PollMessage, Source
from ..core.observability import logger
from ..core.values import value
from ..limits.budget import Budget, Mode
from ..limits.lease import LeaseStore, new_token
from ..limits.redisconn import RedisFailure, describe, failure
from ..store.queue import Outgoing, PollQueue
from ..store.records import JobStore
from ..sume.client import Refused, SumeClient
from ..sume.listing import Listing
from .coverage import CoverageStore

#: Defaults written once, for the function's settings and a sweep's own.
MAX_PAGES = 20
LAG = 60.0
READ_SHARE = 0.1


@value(kw_only=True)
class SweepFunctionSettings(SumeReaderSettings):
    """The sweep function's settings, read and validated once per container
    (:mod:`sume_poller.config.settings`)."""

    what: ClassVar[str] = "sweep function"
    #: Between schedule ticks (a sweep runs on a tick only while it saves reads).
    period: float = schedule_period("SWEEP_PERIOD_MINUTES")
    max_pages: int = setting("SWEEP_MAX_PAGES", MAX_PAGES, 1, 1_000)
    #: How long Sume's list may lag a job's terminal status (clock seconds).
    lag: float = setting("SWEEP_LAG_SECONDS", LAG, 0.0, 3_600.0)
    #: Percent of each read-budget window kept for list reads while sweeps are on (their lane).
    read_share: int = setting("SWEEP_READ_SHARE_PERCENT", round(READ_SHARE * 100), 1, 50)
    #: The safety cadence: where the lane cannot list every status each tick, a failure status is
    #: listed at least this often (clock seconds).
    safety: float = safety_cadence()

    def sweep(self) -> SweepSettings:
        """What one sweep reads of these (its shares as fractions, its clock seconds)."""
        return SweepSettings(self.period, self.max_pages, self.lag, self.safety_margin_ms, self.read_share / 100,
                             max_age=float(self.jobs.max_age), rare_every=self.safety)

STATUSES = ("completed", "failed", "canceled", "expired")
PAGE_SIZE = 100
#: What a sweep reads of a listed job's record (not its result: a finished job's may be 100 KB inline).
RECORD_FIELDS = ("kind", "status", "key", "deadline_at", "submitted_at", "profile")
MIN_JOBS_PER_READ = 5
MAX_IDLE_DOUBLINGS = 4
ROUTE_RETRY = 3_600.0


@value(frozen=False, slots=False)
class SweepReport:
    """What one sweep tick did: whether it ran (or why not), its reads, what it listed and handed over."""

    ran: bool = False
    why_not: str | None = None
    reads: int = 0
    listed: int = 0
    ours: int = 0
    handed_over: int = 0
    left_to_chain: int = 0
    complete: bool = False
    incomplete_reason: str | None = None
    coverage: dict[str, tuple[int, int]] = field(default_factory=dict)

    #: Per Sume key (when several swept): each key's own report.
    by_key: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def combined(cls, reports: dict[str, SweepReport]) -> SweepReport:
        """One report of several keys' sweeps: their sums, each kept under ``by_key``."""
        if len(reports) == 1:
            return next(iter(reports.values()))
        ran = [r for r in reports.values() if r.ran]
        out = cls(ran=bool(ran), why_not=None if ran else "; ".join(f"{k}: {r.why_not}" for k, r in reports.items()),
                  complete=bool(ran) and all(r.complete for r in ran),
                  incomplete_reason=next((r.incomplete_reason for r in ran if r.incomplete_reason), None),
                  by_key={k: r.as_dict() for k, r in reports.items()})
        for r in reports.values():
            out.reads += r.reads
            out.listed += r.listed
            out.ours += r.ours
            out.handed_over += r.handed_over
            out.left_to_chain += r.left_to_chain
            for kind, (covered, missed) in r.coverage.items():
                was = out.coverage.get(kind, (0, 0))
                out.coverage[kind] = (was[0] + covered, was[1] + missed)
        return out


#: Why a sweep stopped when its lane of the shared budget had no read slot free at once.
BUDGET_BUSY = "read budget busy"
#: How long one tick keeps the sweeps' lane of the read budget open (clock seconds): the lane
#: stays while the sweep function ticks at all, so its share is not given to chains and taken back
#: from one tick to the next (that would let a window see both).
LANE_OPEN = 2 * 86_400.0


@value
class SweepSettings:
    """What one sweep reads of its function's settings (:meth:`SweepFunctionSettings.sweep` builds
    it; its defaults are the function's, for tests and the bench)."""

    period: float  # clock seconds between schedule ticks
    max_pages: int = MAX_PAGES
    lag: float = LAG  # how long the list may lag a job's terminal status (clock seconds)
    safety_margin_ms: int = SAFETY_MARGIN_MS
    read_share: float = READ_SHARE  # of each budget window, kept for list reads (the lane)
    max_age: float = float(default(JobSettings, "max_age"))  # no pending job was submitted longer ago
    #: Where the lane cannot pay for every status each tick, a sweep lists ``completed``, and beside
    #: it a failure status last listed this long ago (clock seconds: the safety cadence).
    rare_every: float = default(DiscoverySettings, "safety")


class Sweeps:
    """Every key's sweep in one invocation, in turn (each stops before the invocation's end)."""

    def __init__(self, sweepers: list[Sweeper]) -> None:
        self.sweepers = sweepers

    def run(self) -> SweepReport:
        return SweepReport.combined({s.key.id if s.key else str(i): s.run() for i, s in enumerate(self.sweepers)})


class Sweeper:
    def __init__(self, settings: SweepSettings, clock: Clock, *, sume: SumeClient, store: JobStore,
                 queue: PollQueue, lease: LeaseStore, budget: Budget, coverage: CoverageStore,
                 remaining_ms: Callable[[], int], handover_ttl_real: float, margin_real: float = 0.0,
                 key: SumeKey | None = None) -> None:
        self.s = settings
        #: The Sume key whose workspace this sweep lists (None: the deployment has one key).
        self.key = key
        self.clock = clock
        self.sume = sume
        self.store = store
        self.queue = queue
        self.lease = lease
        self.budget = budget
        self.coverage = coverage
        self.remaining_ms = remaining_ms
        self.handover_ttl_ms = max(1, int(handover_ttl_real * 1000))
        self.margin_ms = int(margin_real * 1000)
        self.report = SweepReport()
        self.tick = settings.period
        self._created_floor = -math.inf
        self._created_bound_used = False
        self._prepaid = 0  # list reads reserved at once when the sweep started
        self._statuses: tuple[str, ...] = STATUSES  # what this sweep lists

    @property
    def _default_id(self) -> str:
        return self.key.id if self.key is not None and self.key.default else ""

    # -- whether to sweep ---------------------------------------------------------------------------
    def run(self) -> SweepReport:
        now = self.clock.now()
        try:
            self.budget.open_lane(self.s.read_share, now + LANE_OPEN)
            state = self.coverage.state()
            budget = self.budget.state()
            self.tick = self._tick_interval(state, now)
            spend = self._chains_spend(state, budget, now)
            self.coverage.update(tick_at=now, tick=self.tick, **spend)
            state.update({k: str(v) for k, v in spend.items()})
            why_not = self._why_not(state, budget, now) or self._reserve(state, budget, now)
            if why_not:
                self.report.why_not = why_not
                if "cheaper" in why_not and float(state.get("healthy_until", 0)) > now:
                    self.coverage.update(healthy_until=0)  # no sweep is coming: chains back to normal
                return self.report
            self.coverage.update(last_at=now)
        except RedisFailure as exc:
            self.report.why_not = f"{failure(exc)} ({type(exc).__name__}: {describe(exc).get('redis_message', '')})"
            return self.report
        self.report.ran = True
        self._sweep(now, state)
        return self.report

    def _tick_interval(self, state: dict[str, str], now: float) -> float:
        """Clock seconds between this sweep's ticks, as measured (the schedule fires in real time;
        a compressed clock or a manual run changes what that is in clock time)."""
        last = float(state.get("tick_at", 0))
        measured = now - last if 0 < now - last < 4 * self.s.period else float(state.get("tick", self.s.period))
        return max(1.0, measured)

    def _chains_spend(self, state: dict[str, str], budget: dict[str, float], now: float) -> dict[str, float]:
        """The status reads chains spend on the normal schedule, per pending job and clock second,
        measured from the limiter's counter over the last tick - only over a tick when no chain was
        stretched (sweeps' coverage not healthy): while they are, the last such measure stands."""
        taken, pending = budget.get("status_taken", 0.0), budget.get("pending", 0.0)
        fields = {"taken": taken, "taken_at": now}
        since = float(state.get("taken_at", 0))
        if "taken" in state and now - since > 0 and pending > 0 and float(state.get("healthy_until", 0)) <= since:
            fields["status_rate"] = max(0.0, taken - float(state["taken"])) / (now - since) / pending
        return fields

    def _every(self, cost: int) -> float:
        """Clock seconds between sweeps of ``cost`` list reads: a tick, or what the lane sustains."""
        return max(self.tick, cost / self.budget.lane_rate(self.s.read_share))

    def _why_not(self, state: dict[str, str], budget: dict[str, float], now: float) -> str | None:
        if state.get("route", "ok") != "ok" and now < float(state.get("route_until", 0)):
            return f"list route {state['route']} until {float(state['route_until']):.0f}"
        pending = budget.get("pending", 0.0)
        cost = max(len(STATUSES), int(float(state.get("reads", len(STATUSES)))))
        # What chains would spend on status reads between two sweeps: a sweep pays, like 5 pending
        # jobs per list read, where that is 5 status reads per list read (stretching has its costs:
        # canaries, the safety reads, the reads before coverage is proven).
        saves = float(state.get("status_rate", 0)) * pending * self._every(cost)
        if pending / cost < MIN_JOBS_PER_READ and saves < MIN_JOBS_PER_READ * cost:
            return (f"{pending:.0f} pending jobs for {cost} list reads, chains' status reads {saves:.1f} a sweep: "
                    "chains are cheaper")
        relied_on = any(k.startswith("cov:") and int(v) > 0 for k, v in state.items())
        idle = 0 if relied_on else min(int(state.get("idle", 0)), MAX_IDLE_DOUBLINGS)
        if now < float(state.get("last_at", 0)) + self.tick * (2**idle - 0.5):
            return f"backing off after {idle} idle sweeps"
        return None

    def _reserve(self, state: dict[str, str], budget: dict[str, float], now: float) -> str | None:
        """Reserve the pages each status took last time (as many as the lane grants at once), so a
        sweep starts only when it can finish: a half sweep proves nothing and wastes its reads.
        Every status where the lane sustains that each tick and has the reads free now; else
        ``completed`` and the failure status listed longest ago if that was the safety cadence
        (``rare_every``) ago, else ``completed`` alone - each from the lane, or from the reads the
        line leaves unspent (it spends less than an evenly spent day), if free now."""
        def pages(statuses: tuple[str, ...]) -> int:
            wanted = sum(max(1, int(float(state.get(f"pages:{s}", 1)))) for s in statuses)
            return min(wanted, self.budget.lane_burst(self.s.read_share))

        due = sorted((float(state.get(f"read_at:{s}", 0)), s) for s in STATUSES[1:])
        first = STATUSES[:1]
        rare = (*first, due[0][1]) if now >= due[0][0] + self.s.rare_every else first
        rich = self.budget.lane_rate(self.s.read_share) * self.tick >= pages(STATUSES)
        plans = [*([(STATUSES, Mode.LIST)] if rich else []), (rare, Mode.LIST), (rare, Mode.SPARE),
                 *([(first, Mode.LIST), (first, Mode.SPARE)] if rare != first else [])]
        for statuses, mode in plans:
            count = pages(statuses)
            if mode is Mode.SPARE and not self.budget.spare(count, self.s.read_share, budget):
                continue
            if self.budget.take(mode=mode, max_wait=0.0, count=count).now:
                self._prepaid, self._statuses = count, statuses
                return None
        return f"{BUDGET_BUSY} (list reads not free in the sweeps' lane nor spare in the line)"

    # -- the sweep ----------------------------------------------------------------------------------
    def _sweep(self, started: float, state: dict[str, str]) -> None:
        listed: dict[str, set[str]] = {}
        watermarks: dict[str, float] = {}
        complete = True
        budget = self.budget.state()
        # No job of ours was created before this (less a margin for the two clocks and the list's lag).
        oldest = float(budget.get("oldest_pending") or started - self.s.max_age)
        self._created_floor = max(oldest, started - self.s.max_age) - max(self.s.lag, 60.0)
        self._created_bound_used = False
        per_status: dict[str, Any] = {}
        for status in self._statuses:
            if started < float(state.get(f"unfiltered:{status}", 0)):
                complete = self._incomplete(f"status={status} left out: the route did not filter by it")
                continue
            before = self.report.reads
            done, newest = self._status(status, float(state.get(f"wm:{status}", 0)), started, listed)
            complete = complete and done
            per_status[f"pages:{status}"] = self.report.reads - before
            if done:
                per_status[f"read_at:{status}"] = started
            if newest is not None:
                watermarks[f"wm:{status}"] = newest
            if self.report.incomplete_reason and self.report.incomplete_reason.startswith(("route", BUDGET_BUSY)):
                break
        self.report.complete = complete
        if complete:  # a sweep of some statuses judges only the finds of those
            self.report.coverage = self.coverage.judge(
                listed, started, self.s.lag, created_after=self._created_floor if self._created_bound_used else None,
                statuses=None if self._statuses == STATUSES else frozenset(self._statuses))
        useful = self.report.handed_over or any(hits for hits, _ in self.report.coverage.values())
        # A sweep the budget stopped proved nothing either way: it does not count as idle.
        idle = 0 if useful else int(state.get("idle", 0)) + (self.report.incomplete_reason != BUDGET_BUSY)
        fields: dict[str, Any] = {"reads": self.report.reads, "idle": idle, **per_status}
        if complete:
            # Coverage holds for two intervals of sweeps (the ticks', or the lane's for a sweep of every
            # status where that is slower).
            full = sum(max(1, int(float({**state, **per_status}.get(f"pages:{s}", 1)))) for s in STATUSES)
            every = max(self.tick * 2 ** min(idle, MAX_IDLE_DOUBLINGS), self._every(full))
            healthy = started + 2 * every + self.s.lag
            fields.update(route="ok", healthy_until=healthy, complete_at=started, every=every, **watermarks)
        self.coverage.update(**fields)
        if not complete:
            logger.warning("sweep incomplete: chains keep the normal schedule",
                           extra={"reason": self.report.incomplete_reason})

    def _status(self, status: str, watermark: float, started: float,
                listed: dict[str, set[str]]) -> tuple[bool, float | None]:
        """Page through one status; (complete, newest updated_at seen)."""
        cursor: str | None = None
        cursors: set[str] = set()
        newest: float | None = None
        last_seen: float | None = None
        monotone = True
        created_last: float | None = None
        created_order = True  # newest created first, on every page so far
        for page in range(self.s.max_pages):
            if self.remaining_ms() < self.s.safety_margin_ms:
                return self._incomplete("out of time"), newest
            # Past what it reserved, a sweep reads only on a slot free now: it never reserves one it
            # would not wait for.
            if self._prepaid > 0:
                self._prepaid -= 1
            elif not self.budget.take(mode=Mode.LIST, max_wait=0.0).now:
                return self._incomplete(BUDGET_BUSY), newest
            reply = self.sume.list_jobs(limit=PAGE_SIZE, cursor=cursor, status=status)
            self.report.reads += 1
            if isinstance(reply, Refused) and reply.why in ("forbidden", "not_found", "request"):
                route = "forbidden" if reply.why == "forbidden" else "broken"
                logger.error(f"the list route answers {reply.http_status}: sweeps off, chains keep the normal schedule",
                             extra={"route": route})
                self.coverage.fail(route, self.clock.now() + ROUTE_RETRY)
                return self._incomplete(f"route {route} ({reply.http_status})"), newest
            if not isinstance(reply, Listing):
                return self._incomplete(f"list read failed ({getattr(reply, 'reason', reply)})"), newest
            times = [_timestamp(i.get("updated_at")) for i in reply.items]
            for t in times:
                if t is None:
                    monotone = False
                    continue
                newest = t if newest is None else max(newest, t)
                monotone = monotone and (last_seen is None or t <= last_seen)
                last_seen = t
            for item in reply.items:
                created = _timestamp(item.get("created_at"))
                created_order = created_order and created is not None and (
                    created_last is None or created <= created_last)
                created_last = created if created is not None else created_last
            stray = _stray(reply.items, status)
            if stray is not None:
                logger.error(f"the list route does not filter status={status}: sweeps leave it out, chains keep "
                             "the normal schedule", extra={"item": stray})
                self.coverage.fail_status(status, self.clock.now() + ROUTE_RETRY)
                return self._incomplete(f"route does not filter status={status} ({stray})"), newest
            self._finish_listed(reply.items, status, listed)
            if reply.has_cursor and reply.next_cursor is None:
                return True, newest
            if monotone and last_seen is not None and watermark and last_seen < watermark - self.s.lag:
                return True, newest  # the rest is older than the previous complete sweep saw
            if created_order and created_last is not None and created_last < self._created_floor:
                self._created_bound_used = True
                return True, newest  # the rest was created before any job of ours that is pending
            if not reply.has_cursor:
                if len(reply.items) < PAGE_SIZE:
                    return True, newest
                return self._incomplete("a full page without a usable cursor"), newest
            if reply.next_cursor in cursors or reply.next_cursor == cursor:
                return self._incomplete("the list's cursor came back again"), newest
            cursor = reply.next_cursor
            cursors.add(cursor or "")
            if page + 1 == self.s.max_pages:
                return self._incomplete(f"capped at {self.s.max_pages} pages"), newest
        return self._incomplete("capped"), newest

    def _incomplete(self, reason: str) -> bool:
        self.report.incomplete_reason = self.report.incomplete_reason or reason
        return False

    def _finish_listed(self, items: tuple[dict[str, Any], ...], status: str, listed: dict[str, set[str]]) -> None:
        """Hand over the listed jobs that are pending here (every item already checked by
        :func:`_stray`: a terminal status equal to ``status``)."""
        ids: dict[str, str] = {}
        for item in items:
            try:
                job_id = validate_job_id(item.get("id") or item.get("job_id"))
            except InvalidJobId:
                continue
            ids[job_id] = str(item["status"]).strip().lower()
        self.report.listed += len(ids)
        records = self.store.get_many(list(ids), RECORD_FIELDS)
        outgoing: list[tuple[Outgoing, str]] = []
        for job_id, record in records.items():
            if self.key is not None and record_key(record, self._default_id) != self.key.id:
                continue  # another key's job: this workspace's list says nothing of it
            kind = str(record.get("kind"))
            listed.setdefault(kind, set()).add(job_id)
            self.report.ours += 1
            if record.get("status") != "pending":
                continue
            handed = self._hand_over(job_id, record, ids[job_id])
            if handed is None:
                self.report.left_to_chain += 1
            else:
                outgoing.append(handed)
        unsent = self.queue.send(m for m, _ in outgoing)
        for message, held in outgoing:  # its waiting message is fenced out: free the lease for it
            if message.key in unsent:
                logger.error("finishing message not sent; the job's chain takes over", extra={"job_id": message.key})
                with contextlib.suppress(*RedisFailure):
                    self.lease.release(message.key, held)
        self.report.handed_over += len(outgoing) - len(unsent)

    def _hand_over(self, job_id: str, record: dict[str, Any], sume_status: str) -> tuple[Outgoing, str] | None:
        now = self.clock.now()
        held = self.lease.hand_over(job_id, new_token(), self.handover_ttl_ms, now=now, scale=self.clock.scale,
                                    margin_ms=self.margin_ms)
        if held is None:
            return None
        submitted = record.get("submitted_at")
        # Due at once: ahead of the line of status reads (a job Sume lists as finished), or on the read
        # slot its fenced status step had reserved (counted in the day), read before its time where the
        # minute has room (the limiter's early confirm).
        message = PollMessage(
            job_id=job_id, kind=str(record["kind"]), deadline_at=int(record["deadline_at"]), due_at=round(now, 3),
            token=held.token, seq=held.seq, submitted_at=int(submitted) if isinstance(submitted, int | float) else None,
            profile=record.get("profile"), found_by="sweep", slot_at=held.slot,
            key=None if self.key is None or self.key.default else self.key.id)
        if canonical_terminal_status(sume_status) == "completed":  # its result read is the proof
            message = message.next(phase=RESULT_PHASE, seen_terminal_at=now,
                                   outcome=Finding("completed", Source.LIST, sume_status))
        else:  # a failure is recorded only once the job's own status read says so
            message = message.next(phase=STATUS_PHASE)
        return Outgoing(job_id, message.to_json(), 0.0), f"{held.token}:{held.seq}*"


def _stray(items: tuple[dict[str, Any], ...], status: str) -> str | None:
    """The first item of a page filtered by ``status`` whose own status is not that terminal status
    (described for the log), or None when every item is as asked."""
    for item in items:
        raw = item.get("status")
        if not isinstance(raw, str) or not raw.strip():
            return "an item without a status"
        if classify_status(raw) not in (State.SUCCEEDED, State.FAILED) or canonical_terminal_status(raw) != status:
            return f"an item with status {raw.strip()[:40]!r}"
    return None


def _timestamp(value: Any) -> float | None:
    """Seconds from an ISO-8601 ``updated_at`` (or a number), else None."""
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    if not isinstance(value, str):
        return None
    from datetime import datetime

    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None

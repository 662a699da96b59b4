"""The invariants, checked as the run goes (at the service call where each can first be seen to fail)
and at its end. Each is the promise of the README's Guarantees, with the exception stated there and
no other:

``one-record``      a job's record becomes terminal once and never changes after (status, time,
                    result), and is never deleted.
``sume-said``       its status is one Sume stated: the outcome of the job, once Sume had it (a 403 on a
                    job of another workspace: ``failed``); or ``timed_out`` at or after its deadline.
``result``          a ``completed`` record holds its result (inline or in S3, the object claimed);
                    Sume always has one for a success - except the Guarantees' two outcome paths
                    without it: a result too large to keep (``result_too_large``), and a job Sume's
                    status route called completed whose routes then refused it over the refusal
                    window (evidence ``status_read``).
``one-event``       one terminal event per job, carrying the record's status - more only where a
                    ``PutEvents`` outcome was unknown to its caller: the call raised (a timeout after
                    EventBridge accepted it), or the caller died (a crash or timeout) after an attempt
                    was accepted and before its step ended. Every terminal job's event is published and
                    its outbox cleared.
``one-read``        never two reads (status or result) of one job in flight at once - except after Redis
                    lost its data: one read's step took its hold (lease or fence) before the loss and the
                    other's after it; or while a container cannot reach Redis: one read's step holds the
                    record's fence (which keeps out the fenced steps of other chains, not a chain whose
                    container reached Redis and holds the lease), the other's the lease.
``read-after-end``  no step reads a job after taking its hold (lease or fence) once the job's record
                    was terminal: a step that finds the lease free reads the record first, and so does
                    a sweep's or webhook's finishing step that found it free (the chain may have
                    finished and released it) - except a job one of whose steps held the record's
                    fence (a container that cannot reach Redis: the lease does not see its write). A
                    key check's probe is no read of the job's own: it reads the status of a job its
                    container read fine (finished or not) under a lease of its own, to learn whether a
                    403 was the key's.
``budget``          Sume's read windows (its fixed minutes) never see more than the configured limit -
                    except a window that overlaps a Redis outage, which may see what the shared limiter
                    granted plus what each container's outage pacer grants a minute.
``deadline``        every job Sume created for us is recorded, terminal, with its outbox done, by its
                    deadline plus its last read's wait for a slot (at most ``LAST_READ_WAIT``) plus the
                    lag of delivering its step due then: one visibility timeout, one
                    more for each delivery of its messages that failed (a crash, a timeout, an error),
                    and the start lease's life plus a fan-out period for each invocation that died while
                    working on it, a fan-out's pipelined chain start included (its chain may be lost:
                    fan-out starts another once that lease expires) - except a job whose submission was
                    rejected at its queue deadline with creates of unknown outcome, settled only after its
                    create had been replayed for the whole ``REPLAY_WINDOW`` without an answer.
``counted-once``    a drain invocation that returns counts (created, rejected, expired) exactly the queued
                    submissions whose queue items its deletes removed with their records settled naming
                    them: each settled submission is counted once, by the step that removed its item - an
                    invocation that dies loses its counts, as a Lambda loses the metrics it had not flushed.
``dlq``             nothing in a dead-letter queue (the simulation sends no poison).
``submissions``     every submission ends created or rejected; none is left queued.
``crash``           no actor ends with an exception the function would not catch (a handler crash).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sume_poller.creates.drain import REPLAY_WINDOW
from sume_poller.limits.budget import granted_per_window
from sume_poller.limits.lease import START_LUA
from sume_poller.poll.step import LAST_READ_WAIT
from sume_poller.store.submissions import submission_id

from .plan import VISIBILITY
from .world import PREFIX, World

#: The lease's start script, as EVALSHA names it: in a poll invocation, only the key check's probe starts a lease.
START_SHA = hashlib.sha1(START_LUA.encode()).hexdigest()
SUCCESS = {"completed", "complete", "succeeded", "success", "ready"}
FAILURE = {"failed": "failed", "error": "failed", "errored": "failed", "canceled": "canceled",
           "cancelled": "canceled", "expired": "expired"}


def canonical(outcome: str) -> str:
    outcome = outcome.lower()
    return "completed" if outcome in SUCCESS else FAILURE.get(outcome, outcome)


def _s(item: dict[str, Any] | None, name: str) -> str | None:
    value = (item or {}).get(name)
    if isinstance(value, dict):
        return str(value.get("S") if "S" in value else value.get("N"))
    return None


def _n(item: dict[str, Any] | None, name: str) -> float | None:
    value = (item or {}).get(name)
    return float(value["N"]) if isinstance(value, dict) and "N" in value else None


@dataclass
class Violation:
    invariant: str
    job: str | None
    at: float
    detail: str


class Checker:
    def __init__(self, world: World) -> None:
        self.world = world
        self.violations: list[Violation] = []
        self.history: dict[str, list[tuple[float, str, str]]] = defaultdict(list)
        self.holds: dict[tuple[int, str], float] = {}
        self.in_flight: dict[str, dict[int, tuple[Any, str, float]]] = defaultdict(dict)
        self.failed_deliveries: dict[str, int] = defaultdict(int)
        #: Invocations killed while they worked on a job (each may have left it without a chain).
        self.kills: dict[str, int] = defaultdict(int)
        #: (actor, job) -> whether its terminal write won; the (actor, job) whose fence lost.
        self.terminal_writes: dict[tuple[int, str], bool] = {}
        self.fence_losses: set[tuple[int, str]] = set()
        #: The (actor, job) whose hold is the record's fence (its container could not reach Redis).
        self.fenced: set[tuple[int, str]] = set()
        world.redis.observers.append(self._redis)
        world.ddb.observers.append(self._write)
        world.ddb.update_observers.append(self._update)
        world.sume.watch.append(self._read)
        world.sume.creates.append(self._created)
        #: A job Sume created -> the idempotency key of the create that did.
        self.created_by: dict[str, str] = {}
        world.sqs.observers.append(self._sent)
        world.delivery_failed.append(self._delivery_failed)
        world.drain_reports.append(self._drain_report)
        #: Per drain invocation (by id: the invocation, the queue items its deletes removed with their
        #: submission settled by the drain).
        self.drain_removed: dict[int, tuple[Any, list[str]]] = {}
        world.events.observers.append(self.note)
        world.sched.on_kill = self._killed
        self.touched: dict[int, set[str]] = defaultdict(set)
        #: The order of holds and terminal writes (many happen at one clock time): (actor, job) -> the
        #: order of its last hold; job -> the order of its terminal write.
        self.order = 0
        self.hold_order: dict[tuple[int, str], int] = {}
        self.ended: dict[str, int] = {}

    # -- as it goes ----------------------------------------------------------------------------------
    def fail(self, invariant: str, job: str | None, detail: str) -> None:
        self.violations.append(Violation(invariant, job, self.world.sched.now, detail))
        if job:
            self.note(job, f"VIOLATION {invariant}: {detail}")

    def note(self, job: str, what: str) -> None:
        actor = self.world.sched.current
        self.history[job].append((self.world.sched.now, actor.name if actor else "env", what))
        if actor is not None:
            self.touched[id(actor.invocation)].add(job)

    def _killed(self, inv: Any) -> None:
        for job in sorted(self.touched.get(id(inv), ())):
            self.kills[job] += 1
            self.history[job].append((self.world.sched.now, inv.name, f"invocation killed ({inv.reason})"))

    def _redis(self, actor: Any, name: str, args: list[str]) -> None:
        if name not in ("EVALSHA", "EVAL") or len(args) < 3 or actor is None or args[1] == "0":
            return
        key = str(args[2])
        if key.startswith(PREFIX) and not key.startswith(PREFIX + "!"):
            job = key[len(PREFIX):]
            self.holds[(id(actor), job)] = self.world.sched.now
            if args[0] == START_SHA and actor.name.startswith("poll#"):  # the key check's probe (keycheck.py)
                self.hold_order.pop((id(actor), job), None)
            else:
                self._held(actor, job)
            self.touched[id(actor.invocation)].add(job)

    def _held(self, actor: Any, job: str) -> None:
        self.order += 1
        self.hold_order[(id(actor), job)] = self.order

    def _update(self, job: str, sets: frozenset[str], won: bool) -> None:
        actor = self.world.sched.current
        if actor is None:
            return
        if "fence_token" in sets:
            self.note(job, f"fence {'won' if won else 'lost'}")
            if won:
                self.holds[(id(actor), job)] = self.world.sched.now
                self._held(actor, job)
                self.fenced.add((id(actor), job))
            else:
                self.fence_losses.add((id(actor), job))
        if "terminal_at" in sets:
            self.terminal_writes[(id(actor), job)] = won
            if not won:
                self.note(job, "lost the terminal write")

    def _sent(self, queue: str, body: str) -> None:
        try:
            data = json.loads(body)
        except ValueError:
            return
        if "job_id" in data:
            self.note(data["job_id"], f"sent {queue} {data.get('phase', 'status')} seq {data.get('seq')}"
                      f" due {data.get('due_at', 0) - self.world.sched.now:+.0f}s")

    def _created(self, key: str, status: int, body: bytes, actor: Any) -> None:
        from sume_poller.sume.created import extract_job_ids

        try:
            ids = list(extract_job_ids(json.loads(body)))
        except ValueError:
            ids = []
        self.note(f"sub {key}", f"create answered {status}" + (f": {ids}" if ids else ""))
        for job in ids:
            self.created_by.setdefault(job, key)
            self.note(job, f"created (idempotency key {key}, answer {status})")

    def _delivery_failed(self, body: str) -> None:
        job = _job_of(body)
        if job:
            self.failed_deliveries[job] += 1
            self.note(job, "delivery failed: the message comes back after the visibility timeout")

    def _read(self, phase: str, route: str, job: str, actor: Any) -> None:
        now = self.world.sched.now
        if phase == "end":
            self.in_flight[job].pop(id(actor), None)
            return
        mine = self.holds.get((id(actor), job))
        held, ended = self.hold_order.get((id(actor), job)), self.ended.get(job)
        if held is not None and ended is not None and held > ended and not any(j == job for _, j in self.fenced):
            self.fail("read-after-end", job, f"{route} read by {actor.name if actor else '?'}, whose hold was taken "
                      f"at {_t(mine)} after the job's record was terminal")
        for other, other_route, _ in self.in_flight[job].values():
            if other is actor:
                continue
            theirs = self.holds.get((id(other), job))
            one_fenced = ((id(actor), job) in self.fenced) != ((id(other), job) in self.fenced)
            if not self._loss_between(mine, theirs) and not one_fenced:
                self.fail("one-read", job, f"{route} read by {actor.name if actor else '?'} while {other.name}'s "
                          f"{other_route} read is in flight (holds taken at {_t(theirs)} and {_t(mine)}; "
                          f"Redis lost its data at {[round(t, 1) for t in self.world.redis.losses]})")
        self.in_flight[job][id(actor)] = (actor, route, now)
        self.note(job, f"read {route}")

    def _dequeued(self, table: str, key: str, item: dict[str, Any]) -> None:
        """A queue item removed: by a drain invocation that must count it if its record is settled naming it."""
        actor = self.world.sched.current
        invocation = getattr(actor, "invocation", None)
        if invocation is None:
            return
        record = self.world.ddb.table(table, "check").items.get(
            submission_id(str(_s(item, "key")), str(_s(item, "idempotency_key"))))
        if _s(record, "queue_item") == key and _s(record, "status") not in (None, "queued"):
            owner, removed = self.drain_removed.setdefault(id(invocation), (invocation, []))
            if owner is not invocation:  # an id reused by a later invocation (one that died left its entry)
                owner, removed = self.drain_removed[id(invocation)] = (invocation, [])
            removed.append(key)

    def _drain_report(self, report: Any) -> None:
        invocation = getattr(self.world.sched.current, "invocation", None)
        owner, removed = self.drain_removed.pop(id(invocation), (invocation, []))
        if owner is not invocation:
            removed = []
        counted = report.created + report.rejected + report.expired
        if counted != len(removed):
            self.fail("counted-once", None, f"a drain invocation counted {counted} settled submissions; its deletes "
                      f"removed {len(removed)} queue items of settled submissions: {removed}")

    def _loss_between(self, a: float | None, b: float | None) -> bool:
        if a is None or b is None:
            return False
        low, high = min(a, b), max(a, b)
        return any(low < t <= high for t in self.world.redis.losses)

    def _write(self, table: str, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if key.startswith("#sub:"):
            self.note(f"sub {key.split(':', 2)[2]}", f"submission record {_s(old, 'status')} -> {_s(new, 'status')}")
            return
        if key.startswith("#q:"):
            idem = _s(new or old, "idempotency_key")
            self.note(f"sub {idem}", "queued" if new is not None else "left the queue")
            if new is None and old is not None:
                self._dequeued(table, key, old)
            return
        if key.startswith("#"):
            return
        before, after = _s(old, "status"), _s(new, "status")
        if new is None:
            self.fail("one-record", key, "the job record was deleted")
            return
        if before is not None and before != "pending":
            kept = ("status", "terminal_at", "result_json", "result_s3_key", "error", "sume_status")
            changed = [k for k in kept if (old or {}).get(k) != new.get(k)]
            if changed:
                self.fail("one-record", key, f"the terminal record changed: {changed} "
                          f"({before} -> {after})")
            if _s(new, "pending_shard") and not _s(old, "pending_shard"):
                self.fail("one-record", key, "a finished record went back into the pending index")
        if after != before:
            self.note(key, f"record {before} -> {after}")
        if _s(old, "pending_shard") != _s(new, "pending_shard") and after == before:
            self.note(key, f"index {_s(old, 'pending_shard')} -> {_s(new, 'pending_shard')}")
        if before in (None, "pending") and after not in (None, "pending"):
            self.order += 1
            self.ended[key] = self.order
            self._terminal(key, new)

    def _terminal(self, job: str, record: dict[str, Any]) -> None:
        status = _s(record, "status") or ""
        now = self.world.sched.now
        info = self.world.model.job_info(job)
        deadline = _n(record, "deadline_at") or math.inf
        if status == "timed_out":
            if now < deadline:
                self.fail("sume-said", job, f"recorded timed_out {deadline - now:.0f} s before its deadline")
            return
        if info is None:
            self.fail("sume-said", job, f"recorded {status} for a job Sume does not know")
            return
        truth = canonical(info["terminal_status"])
        forbidden = bool(info["spec"].get("forbidden"))
        if forbidden and status == "failed":
            return
        if not info["terminal"]:
            self.fail("sume-said", job, f"recorded {status} while Sume's job is {info['status']} (not terminal)")
        elif status != truth:
            self.fail("sume-said", job, f"recorded {status}; Sume's outcome is {info['terminal_status']}")
        if status == "completed" and not (record.get("result_json") or record.get("result_s3_key")):
            error = (record.get("error") or {}).get("M", {})
            code = error.get("code", {}).get("S")
            evidence = _s(record, "evidence")
            # The Guarantees' outcome paths without the result: one too large to keep, and a job the status
            # route called completed whose result route (or status route) then refused it over the window.
            if code != "result_too_large" and not (evidence == "status_read" and truth == "completed"):
                self.fail("result", job, f"recorded completed without its result (error {code}, evidence {evidence})")

    # -- at the end ---------------------------------------------------------------------------------------
    def finish(self, ended: str) -> None:
        world = self.world
        complete = ended == "done"
        table = world.ddb.tables["jobs"]
        records = {k: v for k, v in table.items.items() if not k.startswith("#")}
        jobs = world.model.stats()["jobs"]
        for job_id, info in jobs.items():
            if info.get("min_reads") is None:  # an id read but never created (a foreign list item)
                continue
            record = records.get(job_id)
            if record is None:
                if complete:
                    key = self.created_by.get(job_id)
                    if key and self._replays_unanswered(table.items, key):
                        continue  # the Guarantees' stated exception: a replay window without any answer
                    self.fail("deadline", job_id, "Sume created this job (billed) and it was never recorded"
                              + (f" (the create with idempotency key {key})" if key else ""))
                    for entry in self.history.get(f"sub {key}", []):
                        self.history[job_id].append(entry)
                continue
            self._finished(job_id, record, complete)
        for job_id in records:
            if job_id not in jobs:
                self.fail("sume-said", job_id, "a record of a job Sume never created")
        self._events(records)
        self._budget()
        for queue in (world.poll_dlq, world.create_dlq):
            for message in queue.dead:
                job = _job_of(message.body)
                self.fail("dlq", job, f"{queue.name} holds a message received {message.receive_count} times: "
                          f"{message.body[:160]}")
        if complete:
            for key, item in table.items.items():
                if key.startswith("#sub:") and _s(item, "status") == "queued":
                    self.fail("submissions", None, f"submission {key} still queued at the end")
                if key.startswith("#q:"):
                    self.fail("submissions", None, f"queue item {key} left at the end")
        for crash in world.crashes:
            self.fail("crash", None, crash)
        for call in world.sched.foreign:
            self.fail("threads", None, f"a service call from a thread the scheduler does not run ({call}): "
                      "a pool or thread the layer starts needs its shim in tests/sim/world.py")

    def _finished(self, job: str, record: dict[str, Any], complete: bool) -> None:
        status = _s(record, "status")
        deadline = _n(record, "deadline_at") or math.inf
        if status == "pending":
            if complete or self.world.sched.now > deadline + self._lag(job):
                self.fail("deadline", job, f"still pending {self.world.sched.now - deadline:+.0f} s from its deadline")
            return
        terminal_at = _n(record, "terminal_at") or 0.0
        if terminal_at > deadline + self._lag(job):
            self.fail("deadline", job, f"recorded {terminal_at - deadline:.0f} s after its deadline (allowed "
                      f"{self._lag(job):.0f} s: {self.failed_deliveries[job]} failed deliveries, "
                      f"{self.kills[job]} invocations killed on it)")
        if complete and record.get("event_pending"):
            self.fail("one-event", job, "the outbox is not finished (event_pending) at the end")
        key = _s(record, "result_s3_key")
        if status == "completed" and key and not record.get("event_pending"):
            stored = self.world.s3.objects.get(("results", key))
            if stored is None:
                self.fail("result", job, f"the result object {key} does not exist")
            elif stored.tags:
                self.fail("result", job, f"the result object {key} was never claimed (tags {stored.tags})")

    @staticmethod
    def _replays_unanswered(items: dict[str, dict[str, Any]], key: str) -> bool:
        """The submission of idempotency key ``key`` was rejected at its deadline with creates of unknown
        outcome only after its create had been replayed for the whole replay window without an answer."""
        for item_id, item in items.items():
            if item_id.startswith("#sub:") and item_id.endswith(f":{key}") and _s(item, "status") == "rejected":
                settled, deadline = _n(item, "settled_at") or 0.0, _n(item, "deadline_at") or math.inf
                return bool(_n(item, "unknown_attempts")) and settled >= deadline + REPLAY_WINDOW
        return False

    def _lag(self, job: str) -> float:
        """How late past its deadline a job may be recorded: its last read's wait for a read slot (at most
        ``LAST_READ_WAIT``), its step due then delivered one visibility timeout late, one more per
        delivery of its messages that failed, and - per invocation killed on it, which may have left it
        without a chain (a submit that died between taking the chain's lease and sending its first
        message) - the start lease's life plus a fan-out period, after which fan-out starts a chain
        again."""
        settings = self.world.fanout_settings
        restart = float(settings.lease.start_ttl) + float(settings.period)
        return LAST_READ_WAIT + VISIBILITY * (1 + self.failed_deliveries[job]) + restart * self.kills[job]

    def _events(self, records: dict[str, dict[str, Any]]) -> None:
        world = self.world
        by_job: dict[str, list[Any]] = defaultdict(list)
        for event in world.events.accepted:
            by_job[event.job_id].append(event)
        excused: dict[str, int] = defaultdict(int)
        for call in world.events.calls:
            end = world.step_ends.get(call.actor)
            if call.outcome != "ok" or end in ("killed", "error", "failed") or end is None:
                excused[call.job_id] += call.accepted
        for job, record in records.items():
            status = _s(record, "status")
            events = by_job.get(job, [])
            if status == "pending":
                if events:
                    self.fail("one-event", job, "a terminal event for a job still pending")
                continue
            if not events and not record.get("event_pending"):
                self.fail("one-event", job, "the outbox is done but no event was published")
            if len(events) > 1 + excused[job]:
                calls = [c for c in world.events.calls if c.job_id == job]
                kinds = sorted({self._interleaving(c, job) for c in calls if c.accepted} - {""})
                self.fail("one-event", job, f"{len(events)} events, {excused[job]} of unknown outcome "
                          f"[{'; '.join(kinds) or 'unclassified'}]; calls: " +
                          "; ".join(f"{c.actor.name if c.actor else '?'} attempts {c.attempts} accepted {c.accepted} "
                                    f"-> {c.outcome}, step {world.step_ends.get(c.actor)}" for c in calls))
            for event in events:
                if event.detail.get("status") != status:
                    self.fail("one-event", job, f"an event says {event.detail.get('status')}, the record {status}")

    def _interleaving(self, call: Any, job: str) -> str:
        """Which of the issue's three raw-duplicate interleavings a publishing call belongs to."""
        if call.accepted >= 2 and call.outcome == "ok":
            return "1b: the SDK's retry re-sent an accepted PutEvents"
        actor = call.actor
        task = getattr(actor, "task", None) or ()
        body = task[0].get("body") if task and isinstance(task[0], dict) else None
        if body and '"phase":"outbox"' in body:
            return "1a: fan-out's outbox message settled beside the chain that won"
        if not self.terminal_writes.get((id(actor), job)):
            how = ("lost the terminal write" if (id(actor), job) in self.terminal_writes else
                   "lost the fence" if (id(actor), job) in self.fence_losses else "found the job recorded")
            return f"1c: a step that {how} settled the outbox and published too"
        return ""

    def _budget(self) -> None:
        world = self.world
        limit = int(world.poll_settings.budget.reads_per_minute)
        if limit <= 0:
            return
        share = max(1, world.poll_settings.budget.max_concurrency)
        per_container = granted_per_window(limit) // share + 1
        containers = world.numbers.get("poll", 0)
        for window in world.model.budget_stats()["reads"]["60"]:
            start, attempts = float(window["start"]), int(window["attempts"])
            if attempts <= limit:
                continue
            overlaps = any(a < start + 60 and b > start for a, b in world.redis.outages)
            bound = limit + per_container * containers if overlaps else limit
            if attempts > bound:
                self.fail("budget", None, f"Sume's minute at {start:.0f} saw {attempts} reads (limit {limit}"
                          + (f", {bound} with the outage pacers" if overlaps else "") + ")")


def _job_of(body: str) -> str | None:
    try:
        return str(json.loads(body).get("job_id")) or None
    except (ValueError, AttributeError):
        return None


def _t(value: float | None) -> str:
    return "none" if value is None else f"{value:.1f}"

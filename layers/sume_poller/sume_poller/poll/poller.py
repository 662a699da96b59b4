"""The poll step: one SQS message of a job's chain, at most one Sume read (two: a status read, then the result).

For each message (step ``n`` of chain ``T``)::

    plan (pure, step.py): due now or a hop; the read slot's mode; the lease TTL
    gate: claim the lease and take a read slot      (one Redis round trip, gate.py)
      held by another chain / a duplicate       -> drop quietly
      an older step of its chain holds a claim  -> the same message again in BUSY_RETRY (no read)
      lease was free                            -> a new chain: the record says whether a read is
                                                   still needed (else finish its outbox); then the slot
      a chain's first step (submit's, fan-out's, a hand-over's of a free lease) -> the record first too
      Redis cannot be asked                     -> the record's fence instead of the lease, this
                                                   container's outage pacer instead of the budget
    not due yet (SQS waits at most 900 s)       -> hop: re-queue toward the due time, no read
    no read slot now                            -> re-queue for the reserved slot (keeping the lease)
    at or past the deadline                     -> the last read: what would re-queue records timed_out
    status phase: GET /jobs/{id} (a late chain of a webhook kind probes /result instead: deliveries.py)
      running / transient fault / 404 in its grace window -> re-queue at the next read time (cadence.py)
      failed, canceled, expired                 -> record it                          (evidence status_read)
      completed, result_ready false             -> result phase: wait, reading the status (Sume's gate)
      completed (result ready, or no gate)      -> GET /jobs/{id}/result at once
      401, or 403 that the key check blames on the key -> pause every read key-wide
      403 on this job only; 404 past its grace  -> record failed                      (evidence status_read)
      another 4xx (400, 402, 410, 413, 422...)  -> re-queue on the error backoff (SumeReadRefused);
                                                   repeated over the refusal window: record failed
      its key removed                           -> record failed (wiring/poll.py's RemovedKey)  (key_removed)
    result phase: GET /jobs/{id}/result         -> record it with the result          (evidence result_read)
      not there (404/409/425)                   -> a job only a list or webhook called finished: its status
                                                   read; else wait (result-phase backoff) until the deadline
      refused (403 with the key fine, 400, 410, 422...) -> only a list or webhook said finished: its
                                                   status read; the status said completed: retried on the
                                                   error backoff over the refusal window, then recorded
                                                   completed, error result_refused     (evidence status_read)
    a failure a verified webhook stated         -> record it, no read                 (evidence webhook)
    recording (outbox.py): the conditional write, once, with the publish claim; its outbox; the lease released

Only the job's own routes (or a verified webhook's signed word) make it terminal, besides its
deadline and a removed key; every record names its evidence (:class:`~sume_poller.core.jobs.Evidence`).
Each step works on a :class:`~sume_poller.poll.step.Run` (the chain so far, what holds the job, its reads)
and returns an :class:`~sume_poller.poll.step.Outcome` whose next message (``send``) the batch adapter
sends with the batch's.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any, ClassVar

from ..config.settings import (
    RESULT_MAX_MEGABYTES_MAX,
    DiscoverySettings,
    Env,
    ScheduleSettings,
    SumeReaderSettings,
    setting,
)
from ..core.aws import AwsError
from ..core.clock import Clock
from ..core.jobs import PENDING, Evidence, error_delay, result_wait_delay
from ..core.messages import OUTBOX_PHASE, RESULT_PHASE, STATUS_PHASE, Finding, PollMessage, Source
from ..core.observability import logger
from ..core.values import value
from ..limits.budget import Mode
from ..limits.gate import ReadGate
from ..limits.lease import BUSY_RETRY, ChainStep, Claim, new_nonce, new_token
from ..store.events import EventBus
from ..store.queue import Outgoing, PollQueue
from ..store.records import INLINE_RESULT_BYTES, Ending, JobStore
from ..sume.client import JobReader, Refused, Retryable
from ..sume.status import Oversized, Pending, Result, ResultStream, StreamTimeout
from .cadence import Cadence
from .holds import FenceHold, LeaseHold, NoHold
from .keycheck import KEY_PAUSE, PAUSE_SPREAD, KeyCheck
from .outbox import Finished, Finisher, StepHook
from .results import keep_result
from .step import LAST_READ_WAIT, PACED_HOP, Deadline, Outcome, Run, plan

#: Re-queues that wait for a read slot (or for invocation time): a last read at the deadline still
#: makes them; any other re-queue of a last read records the job timed_out instead.
_SLOT_WAITS = frozenset({"budget_wait", "out_of_time"})


@value(kw_only=True)
class PollSettings(SumeReaderSettings):
    """The poll function's settings, read and validated once per container
    (:mod:`sume_poller.config.settings`)."""

    what: ClassVar[str] = "poll function"
    event_bus_name: str = setting("EVENT_BUS_NAME", "default")
    result_bucket: str = setting("RESULT_BUCKET")
    #: A result larger than this is recorded completed with ``result_too_large``, never stored.
    result_max_megabytes: int = setting("RESULT_MAX_MEGABYTES", 50, 1, RESULT_MAX_MEGABYTES_MAX)
    schedule: ScheduleSettings
    discovery: DiscoverySettings = field(default_factory=DiscoverySettings)

    def check(self, env: Env) -> None:
        SumeReaderSettings.check(self, env)  # slots dataclasses: no zero-argument super()
        timeout = self.sume.connect_timeout_real + self.sume.read_timeout_real
        env.check(self.lease.claim_ttl > timeout,
                  f"CLAIM_TTL_SECONDS must outlast one Sume request ({timeout:g} s of connect + read timeout)")


class Poller:
    def __init__(self, settings: PollSettings, *, gate: ReadGate, sume: JobReader, store: JobStore,
                 bus: EventBus, queue: PollQueue, cadence: Cadence) -> None:
        self.s = settings
        self.clock: Clock = settings.common.clock
        self.gate, self.sume, self.store, self.queue, self.cadence = gate, sume, store, queue, cadence
        #: Test seam: called after each named step; the fault suite raises from it to crash there.
        self.step_hook: StepHook | None = None
        self.finisher = Finisher(store, bus, self.clock, lambda: self.step_hook,
                                 claim_ttl_real=settings.lease.claim_ttl)
        self.keys = KeyCheck(sume, self.clock, gate)

    def _step(self, name: str, job_id: str) -> None:
        if self.step_hook is not None:
            self.step_hook(name, job_id)

    # -- entry ----------------------------------------------------------------------------------
    def process(self, msg: PollMessage, deadline: Deadline) -> Outcome:
        if not deadline.fits_a_read():
            # Not enough of the invocation left to finish a step: the same message goes back.
            return Outcome("out_of_time", send=Outgoing(msg.job_id, msg.to_json(), 0.0))
        if msg.phase == OUTBOX_PHASE:  # fan-out's: take the outbox's publish claim; no lease, no read
            done = self.finisher.settle_outbox(msg.job_id, NoHold())
            return Outcome(done.name, signals=done.signals)
        now = self.clock.now()
        msg = self.cadence.adjust(msg, now)
        p = plan(msg, now, clock=self.clock, max_delay=self.queue.max_delay, margin_real=self.s.lease.margin,
                 claim_ttl_real=self.s.lease.claim_ttl, patience=self.cadence.patience)
        nonce = new_nonce()
        step, fresh = (ChainStep(msg.token, msg.seq, nonce) if msg.token else None), ChainStep(new_token(), 0, nonce)
        passage = self.gate.enter(msg.job_id, step or fresh, fresh, p.ttl_ms, mode=p.mode, max_wait=p.patience,
                                  slot=msg.slot_at or 0.0)
        if passage.claim is None:
            return self._unleased(msg, p.hop, deadline, passage.failure or "")
        self.cadence.pending = self.gate.pending
        if passage.claim is Claim.HELD:
            logger.info("another chain or delivery holds the job; message dropped", extra={"seq": msg.seq})
            return Outcome("contention")
        if passage.claim is Claim.BUSY:  # that delivery may be mid-read: no second read beside it
            logger.info("an older step of this chain is mid-step; message comes back", extra={"seq": msg.seq})
            return Outcome("contention", send=Outgoing(msg.job_id, msg.to_json(), self.clock.from_real(BUSY_RETRY)))
        held = step if passage.claim is Claim.OWN and step else fresh
        run = Run(msg.next(token=held.token, seq=held.seq, paced_at=None), LeaseHold(self.gate.lease, msg.job_id, held),
                  deadline)
        self._step("claimed", msg.job_id)
        grant = passage.grant
        if held.seq == 0:  # a chain's first step: does the job still need a read?
            # The lease was free for it: this step found it free (a new chain), or whoever started the
            # chain did (submit, fan-out, a sweep's or webhook's hand-over) after reading the record -
            # and a chain of the job may have finished and released it in between.
            record = self.store.get(msg.job_id)
            if record is None or record.get("status") != PENDING:
                return self._ended(run, self.finisher.settle(msg.job_id, record, run.hold))
            run.refresh(record)
            if passage.claim is Claim.FRESH and p.mode is not Mode.NONE:
                grant = self.gate.take(p.mode, p.patience, msg.slot_at or 0.0)
        return self._advance(run, p.hop, grant)

    def _unleased(self, msg: PollMessage, hop: float | None, deadline: Deadline, failure: str) -> Outcome:
        """Redis cannot be asked: the record's fence (first: a duplicate stops before any slot), then
        the outage pacer's slot, carried in the message (``paced_at``) while the step waits for it."""
        run = Run(msg if msg.token else msg.next(token=new_token(), seq=0),
                  FenceHold(self.store, msg.job_id, self.clock.from_real(self.s.lease.margin)), deadline)
        run.signal(failure)
        now = self.clock.now()
        if hop is None:
            fence = self.store.fence(msg.job_id, run.chain.token or "", run.chain.seq, now=now,
                                     hold=self.clock.from_real(self.s.lease.claim_ttl))
            if not fence.won:
                return self._ended(run, self.finisher.settle(msg.job_id, fence.record, run.hold, duplicate=True))
            wait = run.chain.paced_at - now if run.chain.paced_at is not None else self.gate.pace()
            if wait > self.gate.budget.early:
                if now >= run.chain.deadline_at and now + wait > run.chain.deadline_at + LAST_READ_WAIT:
                    return self._timed_out(run, "no read slot at the deadline")
                return self._requeue(run, due=now, name="budget_wait", paced_at=round(now + wait, 3))
            run.chain = run.chain.next(paced_at=None)
        return self._advance(run, hop, None)

    # -- the state machine ------------------------------------------------------------------------
    def _advance(self, run: Run, hop: float | None, grant: Any) -> Outcome:
        now, chain = self.clock.now(), run.chain
        run.final = now >= chain.deadline_at  # the last read: whatever would re-queue records timed_out
        if hop is not None:
            return self._requeue(run, due=chain.due_at, name="hopped", slot_at=chain.slot_at)
        if grant is not None and not grant.now:
            return self._wait_for_slot(run, grant)
        if not run.deadline.fits_a_read():
            return self._requeue(run, due=now, name="out_of_time")
        finding = chain.outcome
        if chain.phase == RESULT_PHASE and finding is not None:
            need = finding.next_read()
            if need is None:  # Sume's signed word: no read
                return self._finish(run, finding.status, finding.error, evidence=Evidence.WEBHOOK)
            if need == STATUS_PHASE:
                run.said = finding
                run.chain = chain.next(phase=STATUS_PHASE, outcome=None)
                return self._read_status(run)
            return self._fetch_result(run)
        # A late chain probes the result route; its last read at the deadline reads the status.
        probe = chain.phase == STATUS_PHASE and not run.final and self.cadence.probes(chain, now)
        return self._fetch_result(run) if probe else self._read_status(run)

    def _wait_for_slot(self, run: Run, grant: Any) -> Outcome:
        now = self.clock.now()
        if run.final and not (grant.granted and now + grant.wait <= run.chain.deadline_at + LAST_READ_WAIT):
            return self._timed_out(run, "no read slot at the deadline")
        if grant.granted:
            at = now + grant.wait
            return self._requeue(run, due=at, name="budget_wait", slot_at=at,
                                 signal="KeyPaused" if grant.key_paused else "BudgetExhausted")
        if grant.key_paused:
            return self._requeue(run, due=now + grant.wait + self._spread(), name="key_paused",
                                 signal="KeyPaused")
        return self._requeue(run, due=now + self.cadence.defer(run.chain, now, grant.wait), name="deferred")

    def _read_status(self, run: Run) -> Outcome:
        reply = self.sume.get_status(run.chain.job_id, timeout=run.deadline.call_timeout())
        now = self.clock.now()
        self._step("read", run.chain.job_id)
        self.gate.tell(reply.rate, now)
        run.read_status()
        if isinstance(reply, Retryable):
            return self._transient(run, reply)
        if isinstance(reply, Refused):
            return self._refused(run, reply)
        self.keys.read_fine(run.chain.job_id)
        run.last_status = reply.sume_status if not isinstance(reply, Pending) else reply.status
        if isinstance(reply, Pending):
            if reply.unknown_status:
                logger.error("unknown Sume status; not terminal: the job is read on (its deadline caps it)",
                             extra={"sume_status": reply.status, "request_id": reply.request_id})
                run.signal("UnknownStatus")
            due, normal = self.cadence.next_read(run.chain, now, reply.next_poll_after)
            return self._requeue(run, due=due, name="stretched" if normal else "requeued", errors=0,
                                 seen_running_at=now, normal_due=normal, found_by=None, refused_since=None)
        if run.chain.phase != RESULT_PHASE and (failure := self.cadence.found(run.chain, now, reply.status)):
            run.signal(failure)  # the find that proves (or disproves) sweeps' coverage was not kept
        finding = Finding(reply.status, Source.STATUS, reply.sume_status, reply.error,
                          reply.result_ready if reply.gated else None)
        run.chain = run.chain.next(seen_terminal_at=run.chain.seen_terminal_at or now, errors=0, outcome=finding,
                                   refused_since=None)
        if reply.status != "completed":
            return self._finish(run, reply.status, reply.error, evidence=Evidence.STATUS)
        run.chain = run.chain.next(phase=RESULT_PHASE)
        if not reply.result_ready:  # Sume's gate: the wait reads the status until it opens
            wait = max(reply.next_poll_after or 0.0, result_wait_delay(run.chain.result_waits, self.cadence.rng))
            return self._requeue(run, due=now + wait, name="result_not_ready", signal="ResultNotReady",
                                 result_waits=run.chain.result_waits + 1)
        if not run.deadline.fits_a_read():  # the result at once, if the invocation has the time
            return self._requeue(run, due=now, name="out_of_time")
        grant = self.gate.take(Mode.AHEAD)
        return self._wait_for_slot(run, grant) if grant is not None and not grant.now else self._fetch_result(run)

    def _fetch_result(self, run: Run) -> Outcome:
        deadline = run.deadline
        reply = self.sume.get_result(run.chain.job_id, timeout=deadline.call_timeout(),
                                     inline_limit=INLINE_RESULT_BYTES, time_left=deadline.call_left)
        now = self.clock.now()
        self._step("result", run.chain.job_id)
        self.gate.tell(reply.rate, now)
        run.read_result()
        if isinstance(reply, Result | ResultStream | Oversized):
            if run.chain.phase == STATUS_PHASE:  # a late chain's probe found the result: the chain's own find
                run.chain = run.chain.next(seen_terminal_at=now)
                run.signals.extend(filter(None, [self.cadence.found(run.chain, now, "completed")]))
            try:
                stored = keep_result(self.store, run.chain.job_id, reply, self.sume.result_max_bytes)
            except (StreamTimeout, *AwsError) as exc:
                logger.warning("result not stored; fetching it again", extra={"error": type(exc).__name__})
                return self._transient(run, Retryable("result_not_stored"))
            return self._finish(run, "completed", stored.pop("error", None), result=stored, evidence=Evidence.RESULT)
        if isinstance(reply, Refused) and reply.why == "removed":
            return self._key_removed(run, reply)
        if isinstance(reply, Refused) and reply.why in ("key", "forbidden") and (
                verdict := self._key_verdict(run, reply)) is not None:
            return verdict
        if reply.http_status in (404, 409, 425):  # not there (yet): Sume may say it with any of them
            return self._result_not_there(run, reply, now)
        if isinstance(reply, Refused):
            return self._result_refused(run, reply, now)
        return self._transient(run, reply)

    def _result_not_there(self, run: Run, reply: Retryable | Refused, now: float) -> Outcome:
        """A job only a list or webhook called completed goes back to a status read (once); else the
        result is late: the result route again, on the result-phase backoff, until the deadline."""
        if run.chain.phase == STATUS_PHASE:  # a probe: not completed yet (or failed): the next late read
            return self._requeue(run, name="probed", **self.cadence.late_read(run.chain, now))
        log = {"http_status": reply.http_status, "request_id": reply.request_id, "waits": run.chain.result_waits}
        if run.chain.outcome is None or not run.chain.outcome.confirmed:
            logger.info("no result for a job reported finished; its status decides", extra=log)
            return self._requeue(run, due=now, name="unconfirmed", phase=STATUS_PHASE, outcome=None)
        since = now - (run.chain.seen_terminal_at or now)
        (logger.info if since < self.s.jobs.not_found_grace else logger.warning)(
            "result not there yet; waiting for it", extra={**log, "seconds_since_terminal": round(since)})
        retry_after = reply.retry_after if isinstance(reply, Retryable) else None
        wait = retry_after if retry_after is not None else result_wait_delay(run.chain.result_waits, self.cadence.rng)
        return self._requeue(run, due=now + wait, name="result_not_ready", signal="ResultNotReady",
                             result_waits=run.chain.result_waits + 1, refused_since=None)

    def _result_refused(self, run: Run, reply: Refused, now: float) -> Outcome:
        """The result route refused the result (a 403 with the key fine, a 400, 402, 410, 422...): never
        an outcome by itself. A probe's: its status read next. Where only a list or a webhook said the job
        finished: its status read now. Where its status route said completed: retried on the error
        backoff over the refusal window, then recorded completed without the result, saying so."""
        if run.chain.phase == STATUS_PHASE:
            return self._transient(run, Retryable("probe_refused", http_status=reply.http_status,
                                                  request_id=reply.request_id))
        log = {"http_status": reply.http_status, "code": reply.code, "request_id": reply.request_id}
        if run.chain.outcome is None or not run.chain.outcome.confirmed:
            logger.info("the result route refused a job reported finished; its status decides", extra=log)
            return self._requeue(run, due=now, name="unconfirmed", phase=STATUS_PHASE, outcome=None)
        said = f"HTTP {reply.http_status}" + (f" {reply.code}" if reply.code else "")
        return self._refusal(run, reply, now, "completed", {
            "code": "result_refused", "message": f"Sume's status route said completed; its result route refused the "
                                                 f"result ({said}) for {self.s.jobs.refusal_window} s"})

    def _refusal(self, run: Run, reply: Refused, now: float, status: str, error: dict[str, str]) -> Outcome:
        """A per-job read refused with a status the contract does not name for it: counted
        (``SumeReadRefused``, alarmed), re-queued on the error backoff, and recorded - ``status`` with
        ``error`` - only once the refusals repeated over the refusal window."""
        run.signal("SumeReadRefused")
        since = run.chain.refused_since if run.chain.refused_since is not None else now
        log = {"http_status": reply.http_status, "code": reply.code, "request_id": reply.request_id,
               "refused_for": round(now - since)}
        if now - since < self.s.jobs.refusal_window:
            logger.warning("Sume refused a read with a status its contract does not name for it; retried", extra=log)
            errors = run.chain.errors + 1
            return self._requeue(run, due=now + error_delay(errors, None, self.cadence.rng), name="refused",
                                 errors=errors, refused_since=round(since, 3))
        logger.error("Sume refused this job's reads over the refusal window; recording it", extra={**log,
                     "status": status})
        return self._finish(run, status, error, evidence=Evidence.STATUS)

    def _transient(self, run: Run, reply: Retryable) -> Outcome:
        errors = run.chain.errors + 1
        delay = error_delay(errors, reply.retry_after, self.cadence.rng)
        logger.warning("transient Sume fault; re-queued", extra={"reason": reply.reason, "errors": errors,
                       "http_status": reply.http_status, "request_id": reply.request_id, "delay": round(delay, 1)})
        return self._requeue(run, due=self.clock.now() + delay, name="transient", errors=errors,
                             signal="SumeThrottled" if reply.http_status == 429 else None)

    def _key_verdict(self, run: Run, reply: Refused) -> Outcome | None:
        """A 401, or a 403 that may be the key's: pause every read key-wide when the key is refused, ask
        again later when the key check has no evidence, None when only this job is refused."""
        key_refused = reply.why == "key" or self.keys.refused(run.deadline)
        if key_refused is None:  # no evidence either way (no read slot soon enough, no answer): ask again later
            return self._transient(run, Retryable("key_check_waits", http_status=reply.http_status))
        if not key_refused:
            return None
        logger.error("Sume refused the API key: every read paused", extra={
            "http_status": reply.http_status, "code": reply.code, "request_id": reply.request_id,
            "pause_seconds": KEY_PAUSE})
        self.gate.pause_key(KEY_PAUSE)
        return self._requeue(run, due=self.clock.now() + KEY_PAUSE + self._spread(),
                             name="key_rejected", signal="SumeAuthFailed")

    def _refused(self, run: Run, reply: Refused) -> Outcome:
        """The job's status route refused it: 401/403 the key's or the job's, 404 lag or gone, else a
        status its contract does not name for a job read."""
        now, chain = self.clock.now(), run.chain
        log = {"http_status": reply.http_status, "code": reply.code, "request_id": reply.request_id}
        if reply.why == "removed":
            return self._key_removed(run, reply)
        if reply.why == "not_found":
            submitted = chain.submitted_at or chain.deadline_at - self.s.jobs.max_age
            if now - submitted < self.s.jobs.not_found_grace:
                logger.info("404 soon after submission (read-after-create lag); retrying", extra=log)
                run.signal("NotFoundGrace")
                return self._transient(run, Retryable("not_found_yet", http_status=404))
        if reply.why in ("key", "forbidden") and (verdict := self._key_verdict(run, reply)) is not None:
            return verdict
        error = {"code": reply.code or reply.why, "message": reply.message or f"Sume answered {reply.http_status}"}
        # Where this route said completed before (the wait on Sume's gate reads it), a refusal now does
        # not turn that into a failure: recorded completed without the result, the refusal named.
        status = "completed" if run.said is not None and run.said.confirmed and run.said.status == "completed" \
            else "failed"
        if reply.why not in ("forbidden", "not_found"):  # 400, 402, 410, 413, 422, 431...: a proxy's, a gateway's
            return self._refusal(run, reply, now, status, {**error, "message": (
                f"Sume's job route refused the job (HTTP {reply.http_status}) for {self.s.jobs.refusal_window} s: "
                f"{error['message']}")[:300]})
        logger.error("Sume forbids this job (another workspace); recording it" if reply.why == "forbidden"
                     else "Sume does not know this job (404 past the read-after-create grace); recording it",
                     extra={**log, "status": status})
        return self._finish(run, status, error, evidence=Evidence.STATUS)

    def _key_removed(self, run: Run, reply: Refused) -> Outcome:
        """The job's key left the key configuration: no read is made. Recorded completed (without its
        result) where Sume's own word already said so, else failed; error ``key_removed``."""
        run.signal("KeyRemoved")
        logger.error("the job's key is no longer configured; recording it", extra={"code": reply.code})
        finding = run.chain.outcome
        said = finding is not None and finding.evidence is not None
        status = finding.status if said and finding is not None else "failed"
        return self._finish(run, status, {"code": reply.code or "key_removed", "message": reply.message or ""},
                            evidence=Evidence.KEY_REMOVED)

    # -- ending -----------------------------------------------------------------------------------
    def _timed_out(self, run: Run, why: str | None = None) -> Outcome:
        said_done = run.chain.phase == RESULT_PHASE or any(
            f is not None and f.status == "completed" for f in (run.chain.outcome, run.said))
        return self._finish(run, "timed_out", {
            "code": "result_not_ready" if said_done else "deadline_exceeded",
            "message": "watched until the job's deadline" + (f" ({why})" if why else "")}, evidence=Evidence.DEADLINE)

    def _finish(self, run: Run, status: str, error: dict[str, str] | None, *, evidence: Evidence,
                result: dict[str, Any] | None = None) -> Outcome:
        chain = run.chain
        said = chain.outcome or run.said
        sume_status = run.last_status if said is None or run.last_status is not None else said.sume_status
        ending = Ending(status, sume_status, error, result or {}, chain.reads, chain.result_reads,
                        chain.seen_running_at, chain.seen_terminal_at, chain.found_by or "chain", evidence)
        done = self.finisher.record(chain.job_id, ending, run.hold)
        return self._ended(run, done, status=status if done.name == "terminal" else None)

    @staticmethod
    def _ended(run: Run, done: Finished, **fields: Any) -> Outcome:
        run.signals.extend(done.signals)
        return run.outcome(done.name, **fields)

    def _spread(self) -> float:
        """Clock seconds added to a wait for a paused key: its chains wake over half a minute, not at once."""
        return self.cadence.rng.uniform(0, PAUSE_SPREAD)

    def _requeue(self, run: Run, *, due: float, name: str, signal: str | None = None, **changes: Any) -> Outcome:
        """Rest the hold until the next step is due (never past the deadline, but for a read slot at most
        ``LAST_READ_WAIT`` past it); hand that step back. The last read at the deadline is not handed
        back but recorded timed_out (unless it waits for its read slot or for invocation time)."""
        if run.final and name not in _SLOT_WAITS:
            if signal:
                run.signal(signal)
            return self._timed_out(run)
        now = self.clock.now()
        limit = float(run.chain.deadline_at)
        if changes.get("slot_at") is not None:
            limit = max(limit, min(float(changes["slot_at"]), limit + LAST_READ_WAIT))
        due = min(max(due, now), limit)
        nxt = run.chain.next(seq=run.chain.seq + 1, due_at=round(due, 3), **changes)
        delay = max(0.0, min(max(due, nxt.paced_at or 0.0) - now, self.queue.max_delay))
        if nxt.normal_due is not None:  # a stretched chain hops to check that sweeps still cover it
            delay = min(delay, self.s.discovery.check)
        if nxt.paced_at is not None:  # waiting for the outage pacer: back soon, in case Redis is
            delay = min(delay, PACED_HOP)
        if signal:
            run.signal(signal)
        # The lease outlasts the delay SQS applies (whole real seconds, rounded up), not the clock's
        # delay: a sub-second delay is sent as one second, and the margin is for queueing lag alone.
        if not run.hold.rest(nxt, due, self.queue.real_delay(delay) + self.s.lease.margin):
            logger.warning("lease lost before re-queue; another chain owns the job")
            return run.outcome("lease_lost")
        self._step("rested", run.chain.job_id)
        return run.outcome(name, send=Outgoing(run.chain.job_id, nxt.to_json(), delay), undo=run.hold.undo_rest)

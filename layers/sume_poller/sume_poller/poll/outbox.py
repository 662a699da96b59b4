"""Finishing a job: the exactly-once terminal write and everything it owes (its outbox), published once.

:meth:`Finisher.record` writes the outcome with the store's conditional write
(:meth:`sume_poller.store.records.JobStore.record_terminal`), which wins only while the job is pending and
takes, in the same write, the job's *publish claim*: the one right to publish its terminal event,
until an expiry. The claim's holder then finishes the outbox - each part safe to repeat:

1. the observation of the job's completion time (for the learned schedule, per profile);
2. the claim of its result object, if the result went to S3 (it no longer expires);
3. the terminal event on EventBridge: one PutEvents, never retried under the claim (the claim's
   expiry is the retry), sent only while the claim has one call's time left;
4. the record leaves the pending index.

Anyone else who finds the outbox open - a loser of the terminal write (it also removes the result
object it wrote), a redelivery, fan-out's outbox message - takes the claim first
(:meth:`sume_poller.store.records.JobStore.claim_outbox`) and, while another holds it, leaves the outbox
to the holder. A holder that knows it did not publish (EventBridge refused, or it stopped before
the call) releases the claim; one whose PutEvents got no answer keeps it until it expires, and the
next holder counts ``EventOutcomeUnknown``: its event may go out twice (the only raw duplicates).

The claim lasts the lease's claim TTL (``ClaimTtlSeconds``: longer than the poll function's
timeout, so a live holder's whole invocation fits in it), at least ``PUBLISH_CLAIM_MIN_REAL``;
a holder sends PutEvents only with ``CALL_MAX_REAL`` (the events client's connect and read
timeouts, one attempt) plus ``CLAIM_SKEW_REAL`` of its claim left, so its call ends before
anyone else may take the claim.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from ..core.aws import AwsError
from ..core.clock import Clock
from ..core.jobs import PENDING
from ..core.observability import logger
from ..core.values import value
from ..limits.lease import new_token
from ..store.events import CALL_MAX_REAL, EventBus, PublishRefused, PublishUnknown
from ..store.records import Ending, JobStore, PublishClaim
from .holds import Hold

#: The fault suite's seam: called with (step name, job id) after "written", "published", "released".
StepHook = Callable[[str, str], None]
#: How far apart two containers' clocks may be when one compares a claim's expiry the other wrote
#: (real seconds; Lambda hosts keep NTP time to milliseconds).
CLAIM_SKEW_REAL = 1.0
#: The shortest publish claim (real seconds): a PutEvents call and the skew with room for the
#: outbox's writes before it (the observation, the result object's tag: under a second each).
PUBLISH_CLAIM_MIN_REAL = 10.0


@value
class Finished:
    """What finishing did (the step's outcome name) and the signals to count."""

    name: str
    signals: tuple[str, ...] = ()


def completion_interval(record: dict[str, Any]) -> tuple[float, float | None] | None:
    """(lower, upper) ages in seconds between which the job finished, from its record: after
    the last read that saw it running, at or before the first that saw it terminal (upper None:
    never seen terminal, e.g. timed out). None when the record says nothing useful."""
    submitted = record.get("submitted_at")
    if not isinstance(submitted, int | float):
        return None
    running, terminal = record.get("seen_running_at"), record.get("seen_terminal_at")
    lower = max(0.0, float(running) - submitted) if isinstance(running, int | float) else 0.0
    if isinstance(terminal, int | float):
        return lower, max(lower, float(terminal) - submitted)
    if record.get("status") == "timed_out" and isinstance(running, int | float):
        return lower, None
    return None


class Finisher:
    def __init__(self, store: JobStore, bus: EventBus, clock: Clock, step_hook: Callable[[], StepHook | None],
                 claim_ttl_real: float = PUBLISH_CLAIM_MIN_REAL) -> None:
        self.store = store
        self.bus = bus
        self.clock = clock
        self._hook = step_hook
        #: How long a publish claim lasts (real seconds).
        self.claim_ttl_real = max(float(claim_ttl_real), PUBLISH_CLAIM_MIN_REAL)

    def _step(self, name: str, job_id: str) -> None:
        hook = self._hook()
        if hook is not None:
            hook(name, job_id)

    def _claim(self) -> PublishClaim:
        return PublishClaim(new_token(), round(self.clock.now() + self.clock.from_real(self.claim_ttl_real), 3))

    def record(self, job_id: str, ending: Ending, hold: Hold) -> Finished:
        """Write the outcome once, holding the publish claim; "terminal" when this write won, else
        what :meth:`settle` did."""
        claim = self._claim()
        write = self.store.record_terminal(job_id, ending, now=self.clock.now(), claim=claim)
        self._step("written", job_id)
        if not write.won:
            self._discard(ending)
            return self.settle(job_id, write.record, hold)
        assert write.record is not None
        self.finish_outbox(job_id, write.record, claim)
        (logger.warning if ending.status == "timed_out" else logger.info)(
            "job terminal", extra={"status": ending.status, "sume_status": ending.sume_status,
                                   "evidence": ending.evidence, "reads": ending.status_reads + ending.result_reads})
        hold.release()
        self._step("released", job_id)
        return Finished("terminal")

    def settle(self, job_id: str, record: dict[str, Any] | None, hold: Hold, duplicate: bool = False) -> Finished:
        """The job is not (or no longer) pending (``record``, as read): finish an earlier attempt's
        outbox if no one holds its claim, or drop."""
        if record is not None and record.get("event_pending"):
            return self.settle_outbox(job_id, hold)
        hold.release()
        return Finished(self._dropped(record, duplicate))

    def settle_outbox(self, job_id: str, hold: Hold) -> Finished:
        """Take the outbox's publish claim and finish it (fan-out's outbox message: one conditional
        write, no read before it); drop when another holds the claim or the job needs nothing."""
        claim = self._claim()
        taken = self.store.claim_outbox(job_id, claim, now=self.clock.now())
        if not taken.won:
            hold.release()
            if taken.record is not None and taken.record.get("event_pending"):
                logger.info("another attempt holds the outbox's publish claim; left to it")
                return Finished("outbox_held")
            return Finished(self._dropped(taken.record, False))
        assert taken.record is not None
        logger.info("finishing the outbox of an earlier attempt")
        signals: tuple[str, ...] = ()
        if taken.took_over:
            logger.warning("took over a publish claim its holder neither finished nor released: its PutEvents "
                           "got no answer or it stopped; the event may go out twice (same event_id)")
            signals = ("EventOutcomeUnknown",)
        self.finish_outbox(job_id, taken.record, claim)
        hold.release()
        return Finished("outbox", signals)

    @staticmethod
    def _dropped(record: dict[str, Any] | None, duplicate: bool) -> str:
        if record is None:
            logger.error("poll message for a job that is not recorded; dropped")
            return "unknown_job"
        if record.get("status") == PENDING:
            logger.info("a duplicate of this step already read Sume (Redis down); dropped" if duplicate else
                        "an outbox message for a pending job; dropped (fan-out starts its chain)")
        else:
            logger.info("job already terminal; message dropped", extra={"status": record.get("status")})
        return "duplicate"

    def finish_outbox(self, job_id: str, record: dict[str, Any], claim: PublishClaim) -> None:
        """Everything a terminal transition owes, in order, each step safe to repeat, under ``claim``."""
        try:
            observation = completion_interval(record)
            if observation is not None:
                kind = str(record.get("kind"))
                for profile in dict.fromkeys((str(record.get("profile") or kind), kind)):
                    self.store.put_observation(profile, job_id, *observation,
                                               at=float(record.get("terminal_at") or self.clock.now()))
            if record.get("result_s3_key") and self.store.results is not None:
                self.store.results.claim(str(record["result_s3_key"]))
        except AwsError:
            self._release(job_id, claim)
            raise
        left = self.clock.to_real(claim.until - self.clock.now())
        if left < CALL_MAX_REAL + CLAIM_SKEW_REAL:  # the call could outlast the claim: the next holder publishes
            logger.warning("publish claim too short for a PutEvents call; released", extra={"left": round(left, 1)})
            self._release(job_id, claim)
            return
        try:
            self.bus.put_terminal(job_id, record)
        except PublishRefused:
            self._release(job_id, claim)
            raise
        except PublishUnknown:
            logger.warning("PutEvents got no answer: the claim stands until it expires (the event may be on the bus)")
            raise
        self._step("published", job_id)
        self.store.clear_outbox(job_id, now=self.clock.now())

    def _release(self, job_id: str, claim: PublishClaim) -> None:
        """This holder did not publish: the claim is free for the next at once (best effort: else it expires)."""
        with contextlib.suppress(*AwsError):
            self.store.release_claim(job_id, claim.token)

    def _discard(self, ending: Ending) -> None:
        """An attempt that lost the terminal write removes the result object it wrote (the bucket's
        lifecycle rule expires it should this fail)."""
        key = ending.result.get("result_s3_key")
        if key and self.store.results is not None:
            try:
                self.store.results.discard(key)
            except AwsError as exc:
                logger.warning("result object of a losing attempt left to expire", extra={"error": type(exc).__name__})

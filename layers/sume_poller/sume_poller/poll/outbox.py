"""Finishing a job: the exactly-once terminal write and everything it owes (its outbox).

:meth:`Finisher.record` writes the outcome with the store's conditional write
(:meth:`sume_poller.store.records.JobStore.record_terminal`), which wins only while the job is pending.
The winner then finishes the outbox - each part safe to repeat:

1. the observation of the job's completion time (for the learned schedule, per profile);
2. the claim of its result object, if the result went to S3 (it no longer expires);
3. the terminal event on EventBridge;
4. the record leaves the pending index.

A loser (another attempt won) removes the result object it wrote and finishes the winner's outbox
if that is still open (:meth:`Finisher.settle`) - as does a redelivery, or fan-out's outbox
message, after a crash in between.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.aws import AwsError
from ..core.clock import Clock
from ..core.jobs import PENDING
from ..core.observability import logger
from ..store.events import EventBus
from ..store.records import Ending, JobStore
from .holds import Hold

#: The fault suite's seam: called with (step name, job id) after "written", "published", "released".
StepHook = Callable[[str, str], None]


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
    def __init__(self, store: JobStore, bus: EventBus, clock: Clock, step_hook: Callable[[], StepHook | None]) -> None:
        self.store = store
        self.bus = bus
        self.clock = clock
        self._hook = step_hook

    def _step(self, name: str, job_id: str) -> None:
        hook = self._hook()
        if hook is not None:
            hook(name, job_id)

    def record(self, job_id: str, ending: Ending, hold: Hold) -> str:
        """Write the outcome once; "terminal" when this write won, else what :meth:`settle` did."""
        write = self.store.record_terminal(job_id, ending, now=self.clock.now())
        self._step("written", job_id)
        if not write.won:
            self._discard(ending)
            return self.settle(job_id, write.record, hold)
        assert write.record is not None
        self.finish_outbox(job_id, write.record)
        (logger.warning if ending.status == "timed_out" else logger.info)(
            "job terminal", extra={"status": ending.status, "sume_status": ending.sume_status,
                                   "reads": ending.status_reads + ending.result_reads})
        hold.release()
        self._step("released", job_id)
        return "terminal"

    def settle(self, job_id: str, record: dict[str, Any] | None, hold: Hold, duplicate: bool = False) -> str:
        """The job is not (or no longer) pending: finish an earlier attempt's outbox, or drop."""
        if record is None:
            logger.error("poll message for a job that is not recorded; dropped")
            outcome = "unknown_job"
        elif record.get("event_pending"):
            logger.info("finishing the outbox of an earlier attempt")
            self.finish_outbox(job_id, record)
            outcome = "outbox"
        elif record.get("status") == PENDING:
            logger.info("a duplicate of this step already read Sume (Redis down); dropped" if duplicate else
                        "an outbox message for a pending job; dropped (fan-out starts its chain)")
            outcome = "duplicate"
        else:
            logger.info("job already terminal; message dropped", extra={"status": record.get("status")})
            outcome = "duplicate"
        hold.release()
        return outcome

    def finish_outbox(self, job_id: str, record: dict[str, Any]) -> None:
        """Everything a terminal transition owes, in order, each step safe to repeat."""
        observation = completion_interval(record)
        if observation is not None:
            kind = str(record.get("kind"))
            for profile in dict.fromkeys((str(record.get("profile") or kind), kind)):
                self.store.put_observation(profile, job_id, *observation,
                                           at=float(record.get("terminal_at") or self.clock.now()))
        if record.get("result_s3_key") and self.store.results is not None:
            self.store.results.claim(str(record["result_s3_key"]))
        self.bus.put_terminal(job_id, record)
        self._step("published", job_id)
        self.store.clear_outbox(job_id, now=self.clock.now())

    def _discard(self, ending: Ending) -> None:
        """An attempt that lost the terminal write removes the result object it wrote (the bucket's
        lifecycle rule expires it should this fail)."""
        key = ending.result.get("result_s3_key")
        if key and self.store.results is not None:
            try:
                self.store.results.discard(key)
            except AwsError as exc:
                logger.warning("result object of a losing attempt left to expire", extra={"error": type(exc).__name__})

"""The SQS batch adapter of the poll function: a batch's records, concurrently, in one invocation.

Each record is parsed (a malformed body fails alone and reaches the dead-letter queue as
poison) and handed to :meth:`Poller.process` on a worker thread, all under one deadline (the
invocation's remaining time less a safety margin). The handler waits for every record - every
call a record makes is bounded by that deadline or by its client's timeouts - so nothing runs
after it returns. The chains' next messages are then sent together in ``SendMessageBatch``
calls of ten; a message SQS does not take frees its lease and fails its record, so SQS delivers
the record again. The result is a partial batch response plus a :class:`BatchReport`; metrics
are emitted from it here, on the handler's thread (Powertools' Metrics is not thread-safe).

Why not Powertools' batch utilities: ``BatchProcessor`` handles records one at a time (a batch
of ten takes ten Sume round trips; the bench measures 9-10x one read against this adapter's
~1.1x), and ``AsyncBatchProcessor`` needs async I/O where redis-py and urllib3 here are
synchronous (wrapping them in threads gives this adapter back, without the shared deadline, the
grouped re-queues or the per-record outcomes). Records are read as the plain dicts Lambda
delivers, not through Powertools' SQS event data classes: importing one loads the whole
``data_classes`` package (about 40 event modules), ~35 ms of every poll cold start (bench
figure 4) for the two fields read here (``messageId``, ``body``).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import field, replace
from typing import Any

from ..core.messages import MessageError, parse_message
from ..core.observability import MetricUnit, count_by_key, logger, metrics
from ..core.values import value
from ..store.queue import Outgoing, PollQueue
from .poller import Poller
from .step import Deadline, Outcome

WORKERS = 10
#: The metrics counted per Sume key (dimension ``key``): its reads, its 429s, its steps that
#: waited for the budget or for a paused key, its refusals, its jobs failed for a removed key.
KEY_METRICS = ("SumeReads", "SumeThrottled", "BudgetExhausted", "KeyPaused", "SumeAuthFailed", "KeyRemoved")


@value(frozen=False, slots=False)
class BatchReport:
    """What one batch did: the records SQS must deliver again, and every record's outcome."""

    failures: list[str] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)

    def response(self) -> dict[str, Any]:
        return {"batchItemFailures": [{"itemIdentifier": mid} for mid in self.failures]}

    def counts(self) -> Counter[str]:
        return Counter(o.name for o in self.outcomes)

    def by_key(self) -> dict[str, dict[str, float]]:
        """Per Sume key: its reads and what its budget did to its steps (the per-key metrics)."""
        keyed: dict[str, dict[str, float]] = {}
        for o in self.outcomes:
            if o.key is None:
                continue
            counts = keyed.setdefault(o.key, dict.fromkeys(KEY_METRICS, 0.0))
            counts["SumeReads"] += o.reads
            for signal in o.signals:
                if signal in counts:
                    counts[signal] += 1
        return keyed


class BatchRunner:
    """``pollers``: the poll state machine of a message's Sume key (its budget, client, key check;
    :class:`~sume_poller.config.keys.PerKey`), or one :class:`Poller` for every message."""

    def __init__(self, pollers: Poller | Callable[[str | None], Poller], queue: PollQueue, *, safety_margin_ms: int,
                 workers: int = WORKERS, default_key: str = "default") -> None:
        self.pollers: Callable[[str | None], Poller] = pollers if callable(pollers) else (lambda key: pollers)
        self.default_key = default_key
        #: Test seam: called after each named step of every poller (see :attr:`Poller.step_hook`).
        self.step_hook: Callable[[str, str], None] | None = None
        self.queue = queue
        self.safety_margin_ms = safety_margin_ms
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:  # created on the first batch, not at import (cold start)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="poll")
            return self._pool

    def run(self, event: dict[str, Any], remaining_ms: Callable[[], int]) -> BatchReport:
        if not isinstance(event, dict) or not isinstance(event.get("Records"), list):
            raise ValueError("not an SQS event: no Records list")
        deadline = Deadline((remaining_ms() - self.safety_margin_ms) / 1000)
        report = BatchReport()
        futures = {}
        for record in event["Records"]:
            message_id = record.get("messageId") if isinstance(record, dict) else None
            if not isinstance(message_id, str) or not message_id:
                logger.error("SQS record without a messageId ignored")
                continue
            futures[message_id] = self._executor().submit(self._one, record, deadline)
        outcomes = {mid: future.result() for mid, future in futures.items()}
        self._send(outcomes)
        for mid, outcome in outcomes.items():
            report.outcomes.append(outcome)
            if outcome.failed:
                report.failures.append(mid)
        return report

    def _one(self, record: dict[str, Any], deadline: Deadline) -> Outcome:
        try:
            msg = parse_message(record.get("body"))
        except MessageError as exc:
            logger.error("malformed poll message", extra={"message_id": record["messageId"], "reason": str(exc)})
            return Outcome("malformed", failed=True)
        logger.thread_safe_append_keys(job_id=msg.job_id, correlation_id=msg.job_id, key=msg.key or self.default_key)
        key = msg.key or self.default_key
        try:
            poller = self.pollers(msg.key)
            poller.step_hook = self.step_hook
            return replace(poller.process(msg, deadline), key=key)
        except Exception as exc:
            logger.exception("poll failed; SQS will deliver the message again",
                             extra={"message_id": record["messageId"], "error": type(exc).__name__})
            return Outcome("error", failed=True, key=key)
        finally:
            logger.thread_safe_clear_keys()

    def _send(self, outcomes: dict[str, Outcome]) -> None:
        """Send every chain's next message together; a message not sent fails its record."""
        outgoing = {mid: o.send for mid, o in outcomes.items() if o.send is not None}
        unsent = self.queue.send(Outgoing(mid, m.body, m.delay) for mid, m in outgoing.items())
        for mid, message in outgoing.items():
            outcome = outcomes[mid]
            if mid not in unsent:
                if self.step_hook is not None:
                    self.step_hook("sent", message.key)
                continue
            logger.error("next poll message not sent; SQS will deliver this one again",
                         extra={"message_id": mid, "job_id": message.key})
            if outcome.undo is not None:
                outcome.undo()
            outcomes[mid] = replace(outcome, send=None, failed=True, signals=(*outcome.signals, "RequeueFailed"))


def emit_metrics(report: BatchReport) -> None:
    """One batch's metrics (on the handler's thread)."""
    for name, count in report.counts().items():
        metrics.add_metric(name=f"Outcome_{name}", unit=MetricUnit.Count, value=count)
    signals = Counter(s for o in report.outcomes for s in o.signals)
    for name, count in signals.items():
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=count)
    terminal = Counter(o.status for o in report.outcomes if o.name == "terminal" and o.status)
    for status, count in terminal.items():
        metrics.add_metric(name=f"Terminal_{status}", unit=MetricUnit.Count, value=count)
    for name, reads in (("SumeStatusReads", sum(o.status_reads for o in report.outcomes)),
                        ("SumeResultReads", sum(o.result_reads for o in report.outcomes))):
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=reads)
    metrics.add_metric(name="LeaseContention", unit=MetricUnit.Count, value=report.counts()["contention"])
    if report.failures:
        metrics.add_metric(name="BatchItemFailures", unit=MetricUnit.Count, value=len(report.failures))
    count_by_key(report.by_key())

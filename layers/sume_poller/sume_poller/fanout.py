"""Fan-out: every pending job without a live lease goes to the poll queue.

Reads the sparse ``pending`` index shard by shard, page by page; per page one pipelined Redis
round trip says which jobs hold a live lease (and whether Sume auth is paused); the rest are
sent in full batches of 10 per ``SendMessageBatch`` (across pages and shards), on a few sender
threads so sends overlap the next page's reads; failed entries are retried. It stops cleanly
before its own timeout, and sends nothing when Redis cannot be reached (a live chain might exist).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from .aws import JobStore, PollQueue
from .config import Settings
from .jobs import KINDS, InvalidJobId, all_shards, validate_job_id
from .lease import LeaseStore
from .messages import PollMessage
from .observability import logger

PAGE_SIZE = 100
BATCH_RETRIES = 3
SENDERS = 4


@dataclass
class FanoutReport:
    pages: int = 0
    pending_seen: int = 0
    leased: int = 0
    sent: int = 0
    send_failed: int = 0
    batches: int = 0
    skipped_invalid: int = 0
    stopped_early: bool = False
    redis_unavailable: bool = False
    auth_paused: bool = False
    shards_done: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count_send(self, sent: int, failed: int, batches: int) -> None:
        with self._lock:
            self.sent += sent
            self.send_failed += failed
            self.batches += batches

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


def run_fanout(settings: Settings, store: JobStore, queue: PollQueue, lease: LeaseStore,
               remaining_ms: Callable[[], int], *, page_size: int = PAGE_SIZE,
               sleep: Callable[[float], None] = time.sleep) -> FanoutReport:
    report = FanoutReport()
    with ThreadPoolExecutor(max_workers=SENDERS, thread_name_prefix="fanout-send") as senders:
        _scan(settings, store, queue, lease, remaining_ms, page_size, sleep, report, senders)
    return report  # the pool's exit waited for every send


def _scan(settings: Settings, store: JobStore, queue: PollQueue, lease: LeaseStore,
          remaining_ms: Callable[[], int], page_size: int, sleep: Callable[[float], None],
          report: FanoutReport, senders: ThreadPoolExecutor) -> None:
    now = time.time()
    ready: list[dict[str, Any]] = []  # unleased jobs not sent yet: sent in full batches of 10

    def flush(all_of_it: bool) -> None:
        while len(ready) >= 10 or (all_of_it and ready):
            group, ready[:] = ready[:10], ready[10:]
            senders.submit(_send, queue, group, now, report, remaining_ms, settings, sleep)

    for shard in all_shards(settings.pending_shards):
        start_key: dict[str, Any] | None = None
        while True:
            if remaining_ms() < settings.safety_margin_ms:
                report.stopped_early = True
                flush(all_of_it=True)
                logger.warning("fan-out stopping before its timeout", extra=report.as_dict())
                return
            items, start_key = store.pending_page(shard, start_key, page_size)
            report.pages += 1
            jobs = _valid(items, report)
            report.pending_seen += len(jobs)
            if jobs:
                try:
                    paused, live = lease.live([j["job_id"] for j in jobs])
                except RedisError as exc:
                    report.redis_unavailable = True
                    logger.error("Redis unavailable: fan-out sends nothing more this run",
                                 extra={"error": type(exc).__name__})
                    return
                if paused:
                    report.auth_paused = True
                    logger.error("Sume rejected the API key recently: fan-out paused")
                    return
                free = [j for j, held in zip(jobs, live, strict=True) if not held]
                report.leased += len(jobs) - len(free)
                ready.extend(free)
                flush(all_of_it=False)
            if not start_key:
                break
        report.shards_done.append(shard)
    flush(all_of_it=True)


def _valid(items: list[dict[str, Any]], report: FanoutReport) -> list[dict[str, Any]]:
    jobs = []
    for item in items:
        try:
            validate_job_id(item.get("job_id"))
        except InvalidJobId as exc:
            report.skipped_invalid += 1
            logger.error("pending record with an invalid job id skipped", extra={"reason": str(exc)})
            continue
        if item.get("kind") not in KINDS or not isinstance(item.get("deadline_at"), int):
            report.skipped_invalid += 1
            logger.error("pending record without kind/deadline skipped",
                         extra={"job_id": item.get("job_id")})
            continue
        jobs.append(item)
    return jobs


def _send(queue: PollQueue, group: list[dict[str, Any]], now: float, report: FanoutReport,
          remaining_ms: Callable[[], int], settings: Settings, sleep: Callable[[float], None]) -> None:
    """Send one batch (<= 10), retrying the entries SQS did not accept."""
    entries = {
        str(i): PollMessage(job_id=j["job_id"], kind=j["kind"], deadline_at=j["deadline_at"],
                            due_at=round(now, 3)).to_json()
        for i, j in enumerate(group)
    }
    sent = batches = 0
    for attempt in range(BATCH_RETRIES + 1):
        if attempt:
            sleep(0.1 * 2**attempt)
        batches += 1
        try:
            failed = queue.send_batch([(i, body, 0) for i, body in entries.items()])
        except Exception as exc:  # the whole call failed: retry all of it
            logger.warning("SendMessageBatch failed", extra={"error": type(exc).__name__})
            failed = list(entries)
        sent += len(entries) - len(failed)
        entries = {i: entries[i] for i in failed}
        if not entries or remaining_ms() < settings.safety_margin_ms:
            break
    report.count_send(sent, len(entries), batches)
    if entries:
        logger.error("poll messages not sent; the next fan-out run retries them",
                     extra={"count": len(entries)})

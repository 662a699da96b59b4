"""Figure 3: one 10-message batch / one Sume read (Sume answering in 200 ms), three batch processors.

The same kind of batch - ten chain messages of jobs that are not terminal, the common poll:
claim + read slot, Sume read, lease rest, re-queue to the poll queue on moto - through:

* the poll function's handler as deployed (``functions/poll/app.py``: Powertools Logger and
  Metrics, :class:`sume_poller.poll.batch.BatchRunner` - records on worker threads under one
  deadline, the re-queues of the whole batch sent together in one ``SendMessageBatch``);
* Powertools' ``BatchProcessor`` (records one after another), each record's next message sent
  as the record finishes;
* Powertools' ``AsyncBatchProcessor`` with each record's (synchronous) poll and send wrapped in
  ``asyncio.to_thread``.

All three use the same parts (``runtime.poll_runner()``'s Poller and PollQueue). Wall time of
the batch / one Sume status read's latency measured in the same run (direct reads), median of
the trials, the processors alternating; each processor gets fresh jobs and a fresh queue.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from statistics import median
from typing import Any

from bench.report import Row
from bench.services import Services

LATENCY_MS = 200
TARGET = 1.2
BATCH = 10


def _records(svc: Services, tag: str) -> list[dict[str, Any]]:
    """Ten jobs running in Sume, recorded and their chains started as submit does; their first
    messages, due now, as Lambda's SQS event source delivers them."""
    from sume_poller.core.messages import PollMessage
    from sume_poller.limits.lease import LeaseStore, new_token
    from sume_poller.store.records import JobStore

    settings = svc.settings()
    now = settings.common.clock.now()
    store = JobStore(settings.common.jobs_table, settings.jobs.pending_shards)
    lease = LeaseStore(svc.redis(), settings.redis.key_prefix)
    records = []
    for i in range(BATCH):
        job_id = svc.stack.sim.seed_job("image", {"duration": 3600, "steps": 2}, job_id=f"job_batch_{tag}_{i}")
        store.put_pending(job_id, "image", now=now, deadline_at=int(now) + 86_400)
        token = new_token()
        lease.start(job_id, token, 600_000)
        body = PollMessage(job_id=job_id, kind="image", deadline_at=int(now) + 86_400, due_at=round(now, 3),
                           token=token, seq=0, submitted_at=int(now)).to_json()
        records.append({"messageId": str(uuid.uuid4()), "receiptHandle": f"r-{job_id}", "body": body,
                        "attributes": {}, "messageAttributes": {}, "md5OfBody": "", "eventSource": "aws:sqs",
                        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:poll", "awsRegion": "us-east-1"})
    return records


def _processors(svc: Services) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
    from aws_lambda_powertools.utilities.batch import (
        AsyncBatchProcessor,
        BatchProcessor,
        EventType,
        async_process_partial_response,
        process_partial_response,
    )

    from sume_poller import runtime
    from sume_poller.core.messages import parse_message
    from sume_poller.poll.step import Deadline

    runner = runtime.poll_runner()
    poller, queue = runner.pollers(None), runner.queue  # the default key's

    def poll(record: Any, deadline: Any) -> None:
        outcome = poller.process(parse_message(record.body), deadline)
        if outcome.failed or outcome.name != "requeued":
            raise RuntimeError(f"record failed: {outcome.name}")
        if outcome.send is not None and queue.send([outcome.send]):
            raise RuntimeError("next message not sent")

    def adapter(event: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = svc.stack.invoke("PollFunction", event)
        return reply

    def sequential(event: dict[str, Any]) -> dict[str, Any]:
        deadline = Deadline(27.0)

        def handle(record: Any) -> None:
            poll(record, deadline)

        return dict(process_partial_response(event=event, record_handler=handle,
                                             processor=BatchProcessor(event_type=EventType.SQS)))

    def concurrent(event: dict[str, Any]) -> dict[str, Any]:
        deadline = Deadline(27.0)

        async def handle(record: Any) -> None:
            await asyncio.to_thread(poll, record, deadline)

        return dict(async_process_partial_response(event=event, record_handler=handle,
                                                   processor=AsyncBatchProcessor(event_type=EventType.SQS)))

    return {"adapter": adapter, "BatchProcessor": sequential, "AsyncBatchProcessor": concurrent}


def measure(svc: Services, trials: int = 5) -> list[Row]:
    from sume_poller import runtime

    stack = svc.fresh()
    sqs = stack.client("sqs")
    stack.sim.configure(latency_ms=LATENCY_MS)
    try:
        processors = _processors(svc)
        queue = runtime.poll_runner().queue
        sume = svc.sume()
        times: dict[str, list[float]] = {name: [] for name in processors}
        latencies: list[float] = []
        calls = {"n": 0}
        queue._sqs.meta.events.register("before-call.sqs.SendMessageBatch", lambda **_: calls.update(n=calls["n"] + 1))
        sends: dict[str, list[int]] = {name: [] for name in processors}
        for t in range(trials + 1):  # the first round warms every path up (connections, scripts)
            order = list(processors) if t % 2 == 0 else list(reversed(processors))
            for name in order:
                event = {"Records": _records(svc, f"{t}{name[:3]}")}
                some_job = event["Records"][0]["body"]
                queue.url = sqs.create_queue(QueueName=f"sume-bench-batch-{uuid.uuid4().hex[:8]}")["QueueUrl"]
                calls["n"] = 0
                started = time.perf_counter()
                reply = processors[name](event)
                elapsed = time.perf_counter() - started
                if reply.get("batchItemFailures"):
                    raise RuntimeError(f"{name}: batch failed: {reply}")
                sqs.delete_queue(QueueUrl=queue.url)
                if t:
                    times[name].append(elapsed)
                    sends[name].append(calls["n"])
            job_id = json.loads(some_job)["job_id"]
            latencies += [_timed(sume.get_status, job_id) for _ in range(3)]
        queue.url = stack.queue_url
    finally:
        stack.sim.configure(latency_ms=0)
    read = median(latencies)
    ratio = {name: median(ts) / read for name, ts in times.items()}
    row = Row(f"3 one {BATCH}-message batch / one Sume read ({LATENCY_MS} ms)",
              f"batch adapter {ratio['adapter']:.2f} x ({median(times['adapter']) * 1000:.0f} ms)",
              f"Powertools BatchProcessor {ratio['BatchProcessor']:.2f} x, AsyncBatchProcessor + asyncio.to_thread "
              f"{ratio['AsyncBatchProcessor']:.2f} x", ratio["adapter"], f"<= {TARGET}", ratio["adapter"] <= TARGET)
    row.notes.append(
        f"one Sume read {read * 1000:.0f} ms (median in this run); medians of {trials} trials per processor, "
        "alternating; batch times (ms): " + "; ".join(
            f"{name} {', '.join(f'{x * 1000:.0f}' for x in ts)}" for name, ts in times.items())
        + "; SendMessageBatch calls per batch: " + ", ".join(f"{name} {median(n):g}" for name, n in sends.items())
        + "; every poll: 1 round trip claim + read slot, 1 Sume read, 1 round trip lease rest, the re-queue")
    return [row]


def _timed(fn: Callable[..., Any], *args: Any) -> float:
    """Seconds ``fn(*args)`` took."""
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started

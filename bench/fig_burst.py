"""Figure 11: bursts - submissions that queue (issue 23's "Bursts"; target lines ``keys burst ...``).

300 submissions at once on one key whose create limits are Sume's documented ones (10 a minute,
300 a day), the simulator enforcing the same on its own fixed windows. Figure 8's method: a
discrete-event run on a virtual clock (the burst takes about 40 clock minutes). The driver plays
SQS and Lambda only: it invokes the real :class:`sume_poller.creates.submit.Submitter` for each submission
and keeps the create queue's messages (the drains' steps, sent through the real
:class:`~sume_poller.store.queue.PollQueue`, delays rounded up to SQS's whole seconds) in a heap by due
time, sets the clock to each one's time and hands it to the real :class:`sume_poller.creates.drain.Drainer`
- the create budget (:class:`sume_poller.limits.budget.Budget`'s Lua script on a real redis-server, clock
times passed as ``now``), the drain lease (:mod:`sume_poller.limits.lease` on the same server) and the real
Sume client over HTTP to the simulator, whose budget windows run on the same virtual clock. The
job table is an in-memory stand-in keeping :class:`sume_poller.store.records.JobStore`'s conditions (put
if absent, settle while queued by that item, the queue in arrival order): DynamoDB's part is
covered by the integration tier (tests/integration/test_create_queue.py). The queue deadline is
three hours (long enough for the burst). The chains the created jobs start are not run (their
first poll messages are counted, not delivered).

Measured: submissions refused (``CreateBudgetExhausted`` or ``rejected``); creates billed more than
once per submission (the simulator's billed creates less the submissions created); arrival order
(inversions between the order of arrival and the order the simulator created the jobs in); creates
per clock minute while the queue is non-empty (from the burst's arrival to its last create), over
10; the simulator's 429s on creates. Also: how far the replies' ``estimated_create_at`` was from
the create (informational).
"""

from __future__ import annotations

import heapq
import itertools
import json
import statistics
import time
import uuid
from dataclasses import replace
from typing import Any

from bench import SCRATCH
from bench.harness import layer_logs_to
from bench.report import Row
from sume_poller.core.clock import Clock
from sume_poller.store.queue import Outgoing, PollQueue

DAY = 86_400
START = 20_900 * DAY + 60  # a minute into a UTC day: the whole burst falls in one day window
PER_MINUTE, PER_DAY = 10, 300
DEADLINE = 3 * 3_600
PREFIX = "keys burst"


class VirtualClock(Clock):
    def __init__(self, start: float) -> None:
        super().__init__(1.0, wall=lambda: self.t)
        self.t = start


class HeapQueue(PollQueue):
    """The create queue: PollQueue's sending (SQS's whole-second delays) into a heap by due time."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__("memory://create", clock, sqs=object())
        self.heap: list[tuple[float, int, str]] = []
        self._ids = itertools.count()

    def _send_batch(self, chunk: list[Outgoing]) -> set[str]:
        for message in chunk:
            due = self.clock.now() + self.real_delay(message.delay)
            heapq.heappush(self.heap, (due, next(self._ids), message.body))
        return set()


class CountingQueue(PollQueue):
    """The poll queue: the created jobs' first messages, counted (their chains are not run here)."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__("memory://poll", clock, sqs=object())
        self.sent = 0

    def _send_batch(self, chunk: list[Outgoing]) -> set[str]:
        self.sent += len(chunk)
        return set()


class MemStore:
    """The job table in memory, with :class:`sume_poller.store.records.JobStore`'s conditions."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}

    def put_pending(self, job_id: str, kind: str, *, now: float, deadline_at: int, profile: str | None = None,
                    chain_due_at: float | None = None, extra: dict[str, Any] | None = None, key: str | None = None,
                    own_partition: bool = False) -> bool:
        if job_id in self.items:
            return False
        self.items[job_id] = {"job_id": job_id, "kind": kind, "status": "pending", "key": key, "submitted_at": now,
                              **(extra or {})}
        return True

    def note_key(self, key_id: str) -> None:
        pass

    def get(self, job_id: str) -> dict[str, Any] | None:
        item = self.items.get(job_id)
        return dict(item) if item else None

    def submission(self, key_id: str, idempotency_key: str) -> dict[str, Any] | None:
        from sume_poller.store.submissions import submission_id

        return self.get(submission_id(key_id, idempotency_key))

    def enqueue(self, item: dict[str, Any], submission: dict[str, Any]) -> bool:
        if item["job_id"] in self.items or submission["job_id"] in self.items:
            return False
        self.items[item["job_id"]], self.items[submission["job_id"]] = dict(item), dict(submission)
        return True

    def put_submission(self, record: dict[str, Any]) -> bool:
        old = self.items.get(record["job_id"])
        if old is not None and old.get("status") != "queued":
            return False
        self.items[record["job_id"]] = dict(record)
        return True

    def settle_submission(self, key_id: str, idempotency_key: str, queue_item: str, values: dict[str, Any]) -> bool:
        record = self.submission(key_id, idempotency_key)
        if record is None or record.get("status") != "queued" or record.get("queue_item") != queue_item:
            return False
        self.items[record["job_id"]].update(values)
        return True

    def _queue(self, key_id: str) -> list[str]:
        return sorted(j for j, r in self.items.items() if r.get("pending_shard") == f"q:{key_id}")

    def queue_head(self, key_id: str, limit: int = 1, after: str | None = None) -> list[str]:
        return [j for j in self._queue(key_id) if after is None or j > after][:limit]

    def queue_ahead(self, key_id: str, item_id: str) -> int:
        return sum(1 for j in self._queue(key_id) if j < item_id)

    def dequeue(self, item_id: str) -> None:
        self.items.pop(item_id, None)


def burst_run(redis_url: str, n: int) -> dict[str, Any]:
    """One burst of ``n`` submissions at once; what happened to each, the simulator's counts."""
    import redis as redis_lib

    from sume_poller.config.keys import Limits, SumeKey
    from sume_poller.creates.createqueue import DrainMessage
    from sume_poller.creates.drain import Drainer
    from sume_poller.creates.submit import CreateBudgetExhausted, SubmitKey, SubmitSettings, Submitter
    from sume_poller.limits.budget import NO_DAY_RESERVE, Budget
    from sume_poller.limits.lease import LeaseStore
    from sume_poller.limits.pacer import LocalPacer
    from sume_poller.sume.client import SumeClient
    from tools.sume_sim import SumeSimulator

    clock = VirtualClock(START)
    api_key, prefix = "sume_bench_" + uuid.uuid4().hex, f"bench:burst:{uuid.uuid4().hex[:6]}:"
    with SumeSimulator(api_key=api_key, hints=False, clock=clock,
                       create_budget={"per_minute": PER_MINUTE, "per_day": PER_DAY}) as sim:
        env = {"JOBS_TABLE": "memory", "POLL_QUEUE_URL": "memory://poll", "CREATE_QUEUE_URL": "memory://create",
               "SUME_BASE_URL": sim.base_url, "SUME_API_KEY_NAME": "/bench", "REDIS_URL": redis_url,
               "LOCAL_ENDPOINTS": "true", "LEASE_KEY_PREFIX": prefix, "SUBMIT_QUEUE_DEADLINE_SECONDS": str(DEADLINE)}
        settings = SubmitSettings.from_env(env)
        settings = replace(settings, common=replace(settings.common, clock=clock))
        client = redis_lib.Redis.from_url(redis_url)
        key = SumeKey("default", Limits(creates_per_minute=PER_MINUTE, creates_per_day=PER_DAY), lambda: api_key,
                      default=True)
        creates = Budget(client, key.budget_name(prefix, "creates"), PER_MINUTE, PER_DAY, clock.now,
                         early=0.5, reserve_every=NO_DAY_RESERVE)
        parts = SubmitKey(key, SumeClient(sim.base_url, lambda: api_key), creates,
                          LocalPacer(PER_MINUTE, PER_DAY, 1, clock.now))

        def keys(wanted: str | None) -> SubmitKey:
            return parts

        store, create_queue, poll_queue = MemStore(), HeapQueue(clock), CountingQueue(clock)
        lease = LeaseStore(client, prefix)
        submitter = Submitter(settings, keys=keys, store=store, queue=poll_queue, lease=lease,  # type: ignore[arg-type]
                              create_queue=create_queue)
        drainer = Drainer(settings, submitter, keys, store, create_queue, lease, "default")  # type: ignore[arg-type]

        arrived = clock.now()
        replies, refused = [], 0
        for i in range(n):
            event = {"kind": "image", "idempotency_key": f"burst-{i:05d}", "params": {"prompt": f"burst {i}",
                                                                                       "sim": {"duration": 60}}}
            try:
                reply = submitter.handle(event, lambda: 25_000)
            except CreateBudgetExhausted:
                refused += 1
                continue
            refused += reply["status"] == "rejected"
            replies.append(reply)
            clock.t += 0.001  # "at once": a millisecond apart, so arrival order is well defined

        steps, wall = 0, time.monotonic()
        while create_queue.heap:
            due, _, body = heapq.heappop(create_queue.heap)
            clock.t = max(clock.t, due)
            DrainMessage.parse(body)  # what the event source would deliver: a drain step
            report = drainer.run({"Records": [{"messageId": f"m{steps}", "body": body}]}, lambda: 25_000)
            if report.failures:
                raise RuntimeError(f"a drain step failed at clock {clock.t - START:.1f} s (see bench-burst.log)")
            steps += 1
            if steps > 50 * n:
                raise RuntimeError("the drain did not finish")
        wall = time.monotonic() - wall
        stats = sim.stats()
        client.close()

    records = [store.submission("default", f"burst-{i:05d}") for i in range(n)]
    created = [r for r in records if r and r.get("status") == "created"]
    created_at = {r["job_ids"][0]: float(r.get("settled_at") or arrived) for r in created}
    order_of = {job: i for i, job in enumerate(j for j in stats["jobs"] if j in created_at)}
    arrival = [order_of[r["job_ids"][0]] for r in created]
    inversions = sum(1 for a, b in itertools.combinations(arrival, 2) if a > b)
    estimate_error = [abs(float(q["estimated_create_at"]) - created_at[store.submission(
        "default", q["idempotency_key"])["job_ids"][0]]) for q in replies if q["status"] == "queued"]  # type: ignore[index]
    last = max(created_at.values(), default=arrived)
    return {"n": n, "refused": refused, "created": len(created), "billed": stats["creates"],
            "replays": stats["replays"], "inversions": inversions,
            "create_429s": sum(w["creates"]["rate_limited"] for w in stats["keys"].values()),
            "minutes": (last - arrived) / 60, "steps": steps, "wall": wall, "first_polls": poll_queue.sent,
            "queued": sum(1 for r in replies if r["status"] == "queued"),
            "statuses": sorted({str(r.get("status")) for r in records if r}),
            "estimate_error_p50": statistics.median(estimate_error) if estimate_error else 0.0,
            "estimate_error_max": max(estimate_error, default=0.0)}


def rows(result: dict[str, Any]) -> list[Row]:
    n, minutes = result["n"], result["minutes"]
    per_minute = result["created"] / minutes if minutes > 0 else float("inf")
    ratio = per_minute / PER_MINUTE
    twice = result["billed"] - result["created"]
    in_order = result["inversions"] == 0
    order = "yes" if in_order else f"no ({result['inversions']} inversions)"
    complete = result["created"] == n - result["refused"]
    measured = (f"{n} submissions at once on one key (creates {PER_MINUTE}/min, {PER_DAY}/day, the simulator "
                f"enforcing the same): {result['queued']} queued, {result['created']} created in "
                f"{minutes:.1f} clock minutes ({result['steps']} drain steps, {result['wall']:.1f} s wall)")
    lines = [f"{PREFIX} refused: {result['refused']} (target 0)",
             f"{PREFIX} created twice: {twice} (target 0)",
             f"{PREFIX} arrival order: {order} (target in order)",
             f"{PREFIX} creates per minute / {PER_MINUTE}: {ratio:.3f} (target >= 0.8)",
             f"{PREFIX} create 429s: {result['create_429s']} (target 0)"]
    notes = [f"estimated_create_at vs the create: median {result['estimate_error_p50']:.1f} s, "
             f"max {result['estimate_error_max']:.1f} s; the limiter grants 9.64 of 10 a minute at this limit "
             "(granted_per_window: 10 over 62.25 s, the read log's span and a margin), its ceiling over a long burst"]
    passed = complete and result["refused"] == 0 and twice == 0 and in_order and ratio >= 0.8 \
        and result["create_429s"] == 0
    return [Row("11 bursts", measured, "targets of issue 23 (Bursts)", ratio, ">= 0.8 (and 0, 0, in order, 0)",
                passed, notes=notes, lines=lines)]


def measure(quick: bool = False) -> list[Row]:
    from tools.services import RedisServer

    with layer_logs_to(SCRATCH / "bench-burst.log"), RedisServer() as server:
        result = burst_run(server.url, 300)
    (SCRATCH / "bench-burst.json").write_text(json.dumps(result, indent=2))
    return rows(result)

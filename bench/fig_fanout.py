"""Figure 5: fan-out over N pending jobs of which K hold a live lease.

The real :class:`sume_poller.poll.fanout.FanOut` (the template's pending index on DynamoDB, the
real LeaseStore and read budget on Redis, the real PollQueue) against a fresh queue per trial;
between trials the chains it started are removed again (the K leases stay):

* 5a ``SendMessageBatch`` calls (a botocore ``before-call`` hook) / ceil((N - K) / 10);
* 5b Redis round trips (requests written, counted client-side; the server's read events beside
  them) / pages of the index read (the outbox partitions, then the pending ones);
* 5c throughput (messages sent per second) / a raw boto3 ``send_message_batch`` loop sending the
  same N - K bodies, 10 per call, to a fresh queue on the same endpoint - alternating, median; beside
  it, where the rest goes: the same tick on a table whose index pages are answered from memory
  (:class:`MemoPages`) against the same raw loop.

* 5d the pending jobs one tick covers within its period (the fan-out function's timeout less its
  safety margin): a tick over N jobs whose chains are all alive, timed on moto and modelled on AWS
  from the same calls; and chains started per tick, from 5c's rate.

Where 5c's time goes: with its index pages from memory a tick keeps up with the raw loop (1.04 on
moto, 0.86 on ministack, 2026-12-06), so the rest is the index reads - 16 queries a tick (the 8
outbox partitions, then the 8 pending ones). On moto they are moto's CPU, which its SQS shares:
timed alone, about 0.06 s for the 8 empty outbox queries (each sorts the whole table) and 0.36 s for
the 8 pending pages' 500 records (about 0.6 ms a record: moto deep-copies and projects every record
twice, once per projected attribute, then serializes it), against about 2.1 s for the 40
SendMessageBatch calls both sides make; overlapping them gains nothing there (two sender threads
raised moto's CPU a tick, 2.68 s against 2.49 s). A KEYS_ONLY index would halve the records' share
(0.2 s timed alone), but fan-out reads the kind, deadline and submission time from the index, and a
deployed index's projection changes only by building a second index. One outbox partition instead
of 8 (tried 2026-12-06: 9 queries a tick) gained less than the trials' spread, and left 5b's fixed
Redis round trips a tick (budget, cursor, counts) over one a page. Earlier steps: a tick used to count
each partition with a Select COUNT query (8 more, billed like the pages they read): the count now
comes from the pages a tick reads whole; start batches go out on a sender thread while the next page
is read; a page returns only the fields fan-out reads (``PAGE_FIELDS``: moto's CPU for a full page of
62 records fell from 55 to 49 ms).

5c runs on moto server and on ministack. moto's SQS scans every message a queue holds on every
call, so there SQS dominates both sides; ministack answers in a few ms, one request at a time.
The read budget is far from binding (figure 8 has it): fan-out's start allowance is not the limit.
"""

from __future__ import annotations

import math
import os
import random
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from statistics import median
from typing import Any

from bench.harness import CallCounter, RedisCounter, counting_client
from bench.report import Row, info_row, target_line, unavailable
from bench.services import Services

KINDS = ["image", "video", "face_swap"]


@dataclass
class Endpoint:
    name: str
    url: str
    table: str


def _clients(url: str) -> tuple[Any, Any]:
    """SQS and DynamoDB clients on ``url`` with the project's client config (timeouts, retries)."""
    import boto3

    from sume_poller.core.aws import CLIENT_CONFIG

    session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                    region_name="us-east-1")
    return (session.client("sqs", endpoint_url=url, config=CLIENT_CONFIG),
            session.client("dynamodb", endpoint_url=url, config=CLIENT_CONFIG))


class MemoPages:
    """The job table with its index pages answered from memory after their first read: a tick on it is
    fan-out's own work (Redis, messages, sends) without the index reads - where 5c's gap goes."""

    def __init__(self, store: Any) -> None:
        self._store, self._pages = store, {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def pending_page(self, shard: str, start: dict[str, Any] | None, limit: int = 100) -> Any:
        key = (shard, repr(start), limit)
        if key not in self._pages:
            self._pages[key] = self._store.pending_page(shard, start, limit)
        items, last = self._pages[key]
        return [dict(i) for i in items], last


def _run(endpoint: Endpoint, ids: list[str], leased: set[str], svc: Services, trials: int) -> dict[str, Any]:
    from sume_poller.core.messages import PollMessage
    from sume_poller.limits.lease import LeaseStore, new_token
    from sume_poller.poll.fanout import FanOut, FanOutSettings
    from sume_poller.store.queue import PollQueue
    from sume_poller.store.records import JobStore
    from sume_poller.wiring.shared import reads_budget

    settings = FanOutSettings.from_env(os.environ)
    clock, prefix = settings.common.clock, settings.redis.key_prefix
    sqs, ddb = _clients(endpoint.url)
    store = JobStore(endpoint.table, settings.jobs.pending_shards, ddb=ddb)
    now = clock.now()
    for i, job_id in enumerate(ids):
        store.put_pending(job_id, KINDS[i % 3], now=now, deadline_at=int(now) + 86_400)
    client_side = CallCounter()
    redis_url = svc.stack.redis_url
    lease = LeaseStore(counting_client(redis_url, client_side), prefix)
    admin = svc.redis()
    admin.delete(*[lease.key(j) for j in ids], f"{prefix}!fanout-cursor")
    for job_id in leased:
        lease.start(job_id, new_token(), 600_000)
    budget = reads_budget(lease.client, prefix, settings.budget, settings.common)
    server = RedisCounter([svc.stack.redis_server.port])
    calls: Counter[str] = Counter()
    for op in ("SendMessageBatch", "Query"):
        client = sqs if op == "SendMessageBatch" else ddb
        client.meta.events.register(f"before-call.{client.meta.service_model.service_name}.{op}",
                                    lambda op=op, **_kw: calls.update([op]))
    raw, _ = _clients(endpoint.url)
    bodies = [PollMessage(job_id=j, kind="image", deadline_at=int(now) + 86_400, due_at=round(now, 3),
                          token=new_token(), seq=0).to_json() for j in ids if j not in leased]

    def fresh_queue() -> str:
        url: str = raw.create_queue(QueueName=f"sume-bench-fanout-{uuid.uuid4().hex[:8]}")["QueueUrl"]
        return url

    memo = MemoPages(store)

    def fanout_trial(table: Any = store) -> dict[str, Any]:
        url = fresh_queue()
        calls.clear()
        c0, s0 = client_side.n, server.snapshot()
        started = time.perf_counter()
        report = FanOut(settings, table, PollQueue(url, clock, sqs=sqs), lease, budget, lambda: 60_000).run()
        seconds = time.perf_counter() - started
        server_rt, commands = server.delta(s0, server.snapshot())
        raw.delete_queue(QueueUrl=url)
        admin.delete(*[lease.key(j) for j in ids if j not in leased], f"{prefix}!fanout-cursor")
        if (report.started, report.leased, report.send_failed) != (len(bodies), len(leased), 0):
            raise RuntimeError(f"fan-out on {endpoint.name} did not start what it should: {report.as_dict()}")
        return {"report": report, "seconds": seconds, "calls": calls["SendMessageBatch"], "queries": calls["Query"],
                "client_rt": client_side.n - c0, "server_rt": server_rt, "commands": commands}

    def raw_trial() -> float:
        url = fresh_queue()
        started = time.perf_counter()
        for start in range(0, len(bodies), 10):
            raw.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": b, "DelaySeconds": 0}
                                                          for i, b in enumerate(bodies[start:start + 10])])
        seconds = time.perf_counter() - started
        raw.delete_queue(QueueUrl=url)
        return seconds

    raw_trial()  # warm-up: connections, botocore models, scripts
    fanout_trial(memo)  # and the index pages read once
    runs, raws, memos = [], [], []
    for t in range(trials):
        if t % 2:
            raws.append(raw_trial())
            runs.append(fanout_trial())
        else:
            runs.append(fanout_trial())
            raws.append(raw_trial())
        memos.append(fanout_trial(memo)["seconds"])
    return {"runs": runs, "raw": raws, "memo": memos, "free": len(bodies)}


def _throughput_rows(endpoint: Endpoint, result: dict[str, Any]) -> list[Row]:
    runs, raws, free = result["runs"], result["raw"], result["free"]
    fan, raw = median(r["seconds"] for r in runs), median(raws)
    ratio = raw / fan  # (free / fan) / (free / raw)
    row = Row(f"5c fan-out throughput / raw boto3 SendMessageBatch loop ({endpoint.name})",
              f"{free / fan:.0f} msg/s ({fan * 1000:.0f} ms incl. {runs[-1]['queries']} index queries)",
              f"raw loop {free / raw:.0f} msg/s ({raw * 1000:.0f} ms, {math.ceil(free / 10)} calls)", ratio, ">= 0.8",
              ratio >= 0.8)
    if endpoint.name == "moto":
        row.lines.append(target_line("fanout", "throughput / raw loop", ratio, ">=", 0.8))
    fan_ms = ", ".join(f"{r['seconds'] * 1000:.0f}" for r in runs)
    raw_ms = ", ".join(f"{s * 1000:.0f}" for s in raws)
    row.notes.append(f"{endpoint.name}: {len(runs)} alternating trials, a fresh queue each; fan-out {fan_ms} ms, "
                     f"raw {raw_ms} ms")
    memo = median(result["memo"])
    where = info_row(f"5c where the rest goes ({endpoint.name}): fan-out with its index pages from memory / raw loop",
                     f"{free / memo:.0f} msg/s ({memo * 1000:.0f} ms, no index query)",
                     f"the index reads: {(fan - memo) * 1000:.0f} ms of the tick's {fan * 1000:.0f}", raw / memo)
    return [row, where]


def _tick_capacity(svc: Services, n: int, trials: int, seed: int, starts_per_second: float) -> list[Row]:
    """5d: one tick over ``n`` pending jobs whose chains are all alive (the steady state: every page read,
    every job's lease tried, nothing sent), timed on moto; what one tick covers within its period, here and
    on AWS by the same calls at in-region latencies (figure cost's model: its CPU time x 1769/512 at 512 MB)."""
    from bench.fig_cost import CPU_FACTOR, LATENCY_MS, REDIS_MS
    from sume_poller.limits.lease import LeaseStore, new_token
    from sume_poller.poll.fanout import FanOut, FanOutSettings
    from sume_poller.store.queue import PollQueue
    from sume_poller.store.records import JobStore
    from sume_poller.wiring.shared import reads_budget

    stack = svc.fresh()
    settings = FanOutSettings.from_env(os.environ)
    clock, prefix = settings.common.clock, settings.redis.key_prefix
    sqs, ddb = _clients(stack.moto.endpoint_url)
    store = JobStore(stack.outputs["JobsTableName"], settings.jobs.pending_shards, ddb=ddb)
    rng = random.Random(seed + 1)
    ids = [f"job_{rng.getrandbits(96):024x}" for _ in range(n)]
    now = clock.now()
    for i, job_id in enumerate(ids):
        store.put_pending(job_id, KINDS[i % 3], now=now, deadline_at=int(now) + 86_400)
    lease = LeaseStore(svc.redis(), prefix)
    for start in range(0, n, 500):  # every chain alive
        lease.start_many([(j, new_token()) for j in ids[start:start + 500]], 3_600_000)
    budget = reads_budget(lease.client, prefix, settings.budget, settings.common)
    url = sqs.create_queue(QueueName=f"sume-bench-tick-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    seconds, cpu, pages = [], [], 0
    for t in range(trials + 1):  # the first warms the clients up
        cpu0, started = time.thread_time(), time.perf_counter()
        report = FanOut(settings, store, PollQueue(url, clock, sqs=sqs), lease, budget, lambda: 60_000).run()
        if t:
            seconds.append(time.perf_counter() - started)
            cpu.append(time.thread_time() - cpu0)
        if (report.leased, report.started, report.pending_counted) != (n, 0, n):
            raise RuntimeError(f"a tick over {n} live chains did not see them all: {report.as_dict()}")
        pages = report.pages
    sqs.delete_queue(QueueUrl=url)
    period = min(settings.period, float(stack.specs["FanOutFunction"].timeout)) - settings.safety_margin_ms / 1000
    tick = median(seconds)
    aws = pages * (LATENCY_MS["dynamodb"] + REDIS_MS["vpc"]) / 1000 + median(cpu) * CPU_FACTOR
    starts_aws = 1000 / LATENCY_MS["sqs"] * 10  # SendMessageBatch of 10, one at a time on the sender thread
    row = info_row(f"5d fan-out tick capacity: pending jobs one tick covers in {period:.0f} s, chains alive (moto)",
                   f"{n / tick * period:,.0f} jobs ({n} in {tick * 1000:.0f} ms, {pages} pages)",
                   f"on AWS (same calls, in-region latency): {n / aws * period:,.0f} jobs ({aws * 1000:.0f} ms)")
    row.notes.append(f"tick median of {trials} (ms {', '.join(f'{x * 1000:.0f}' for x in seconds)}), CPU "
                     f"{median(cpu) * 1000:.0f} ms; moto's Query scans the whole table, so its figure falls as the "
                     f"table grows; chains to start: {starts_per_second * period:,.0f} a tick on moto (5c's rate), "
                     f"about {starts_aws * period:,.0f} on AWS (one SendMessageBatch of 10 every "
                     f"{LATENCY_MS['sqs']:.0f} ms)")
    return [row]


def _ministack(stack: ExitStack) -> Endpoint:
    """A ministack server of our own with the template's jobs table created in it (its CloudFormation): only
    the table, as the template declares it (the whole translated template is refused there: its transform
    AWS::LanguageExtensions, which ``sam deploy`` applies, is left in it)."""
    import json

    from tools.stack.deployed import MinistackServer
    from tools.template import aws_clients, load, translate

    server = stack.enter_context(MinistackServer())
    translated = translate(load(), {"RedisUrl": "redis://127.0.0.1:6379/0"})
    table = translated["Resources"]["JobsTable"]
    document = {"AWSTemplateFormatVersion": "2010-09-09",
                "Parameters": {"KmsKeyArn": translated["Parameters"]["KmsKeyArn"]},
                "Conditions": {"HasKmsKey": translated["Conditions"]["HasKmsKey"]}, "Resources": {"JobsTable": table}}
    cfn = aws_clients(server.endpoint_url)("cloudformation")
    cfn.create_stack(StackName="sume-bench-fanout", TemplateBody=json.dumps(document))
    name = cfn.describe_stack_resource(StackName="sume-bench-fanout", LogicalResourceId="JobsTable")
    return Endpoint("ministack", server.endpoint_url, name["StackResourceDetail"]["PhysicalResourceId"])


def measure(svc: Services, n: int = 500, k: int = 100, trials: int = 3, seed: int = 7,
            tick_jobs: int = 2_000) -> list[Row]:
    stack = svc.fresh()
    rng = random.Random(seed)
    ids = [f"job_{rng.getrandbits(96):024x}" for _ in range(n)]  # Sume-shaped ids, spread over the shards
    leased = set(ids[:: max(1, n // k)][:k])
    result = _run(Endpoint("moto", stack.moto.endpoint_url, stack.outputs["JobsTableName"]), ids, leased, svc, trials)
    runs, free = result["runs"], result["free"]
    last, minimum = runs[-1], math.ceil(free / 10)
    pages = last["report"].pages
    row = Row(f"5a fan-out SendMessageBatch calls / ceil((N-K)/10), N={n} K={k}", f"{last['calls']} calls "
              f"({last['report'].started} chains started)", f"ceil({free}/10) = {minimum}", last["calls"] / minimum,
              "= 1", all(r["calls"] == minimum for r in runs))
    row.notes.append(f"{svc.settings().jobs.pending_shards} partitions, {pages} pages read (outbox and pending); calls "
                     f"per trial {', '.join(str(r['calls']) for r in runs)}")
    rows = [row]
    row = Row("5b fan-out Redis round trips / pages read", f"{last['client_rt']} round trips (requests written; "
              f"the server read {last['server_rt']} times)", f"{pages} pages", last["client_rt"] / pages, "<= 1",
              max(r["client_rt"] / r["report"].pages for r in runs) <= 1)
    row.notes.append("round trips counted client-side: a pipeline of many scripts reaches the server in several "
                     "reads, so its read count overstates them; commands: "
                     + " ".join(f"{c} {v}" for c, v in sorted(last["commands"].items())))
    rows += [row, *_throughput_rows(Endpoint("moto", "", ""), result)]
    fan = median(r["seconds"] for r in runs)
    rows += _tick_capacity(svc, tick_jobs, trials, seed, free / fan)
    with ExitStack() as exit_stack:
        try:
            endpoint = _ministack(exit_stack)
        except Exception as exc:  # optional: no ministack here
            rows.append(unavailable("5c fan-out throughput / raw loop (ministack)", ">= 0.8",
                                    f"{type(exc).__name__}: {exc}"[:160]))
            return rows
        rows += _throughput_rows(endpoint, _run(endpoint, ids, leased, svc, max(trials, 5)))
    return rows

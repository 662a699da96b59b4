"""The fault suite's reusable end-of-scenario checker, its driver loop and its figures.

:func:`check_invariants` proves the project's promise for a set of submitted jobs after a
scenario has run (see the module docstring of ``tests/test_faults.py`` for the scenarios):

1. every job is recorded terminal exactly once in DynamoDB: status in ``TERMINAL``, no
   ``pending_shard`` (out of the pending index), no ``event_pending`` left (outbox finished);
2. one terminal event per job id on the bus: counted by ``event_id`` (a deduping consumer sees
   one); raw duplicates (same ``event_id`` delivered twice) are counted separately, and the
   event's status is the recorded one;
3. nothing is left pending without a way back: every record still in the pending index is
   either expected (``pending_ok``) and well-formed enough for fan-out to resend it, or fails;
4. the dead-letter queue holds only genuinely poisonous messages (bodies ``parse_message``
   rejects), unless the caller says otherwise;
5. Sume status reads per job stay within ``min_reads + allowance[job] + slack`` where
   ``min_reads`` is the simulator's count for a client obeying every hint and ``allowance`` is
   what the scenario injected for that job (faults served, crashes after a read, ...).

Only modules that do not import ``sume_poller.observability`` are imported at module level:
the Powertools logger and metrics must be created after ``LocalSystem`` has set the
environment (service name, metrics namespace).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sume_poller.jobs import KINDS, TERMINAL_STATUSES, InvalidJobId, validate_job_id
from sume_poller.messages import MessageError, parse_message
from tools.localrun import LocalSystem

ROOT = Path(__file__).resolve().parent.parent
FIGURES_PATH = ROOT / ".scratch" / "fault-figures.md"


class Crash(BaseException):
    """Stands for the Lambda process dying at a step: nothing after it runs, no batch response."""


def is_poison(body: str) -> bool:
    """A message no number of retries can process: the schema rejects it."""
    try:
        parse_message(body)
    except MessageError:
        return True
    return False


# -- the driver -----------------------------------------------------------------------------------
@dataclass
class CrashedBatch:
    messages: list[dict[str, Any]]
    at: float
    redelivered: bool = False


@dataclass
class Driver:
    """Plays Lambda's SQS event source (and the fan-out schedule) around a :class:`LocalSystem`.

    Unlike ``LocalSystem.run_until`` it survives a :class:`Crash` escaping an invocation: the
    crashed batch is left in flight (nothing deleted, as when a Lambda process dies) and kept
    in :attr:`crashed` so a test can fast-forward its redelivery later.
    """

    system: LocalSystem
    poller: Any = None
    duplicate: bool = False
    #: Fan-out interval: 2 s against the tests' 2 s leases (production: 60 s against 30-60 s).
    fanout_every: float | None = 2.0
    fanout_reports: list[dict[str, Any]] = field(default_factory=list)
    crashed: list[CrashedBatch] = field(default_factory=list)
    #: Called with each received batch; returns the messages to deliver now (tests reorder,
    #: hold back or drop messages here). Messages it does not return stay in flight.
    shape: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None
    on_cycle: Callable[[], None] | None = None
    #: Invocations per cycle (the harness is one consumer; a deployment runs up to
    #: PollMaxConcurrency invocations at once: draining several batches per cycle keeps the
    #: backlog - and so lease expiries the harness itself would cause - small).
    batches: int = 5
    _next_fanout: float = 0.0

    def fanout(self) -> dict[str, Any]:
        report = self.system.fanout()
        self.fanout_reports.append(report)
        return report

    def cycle(self, wait_seconds: int = 1) -> int:
        """A fan-out tick when due, then up to ``batches`` invocations (like an event source
        mapping with that much concurrency, run one after the other), then ``on_cycle``."""
        now = time.monotonic()
        if self.fanout_every is not None and now >= self._next_fanout:
            self.fanout()
            self._next_fanout = now + self.fanout_every
        total = 0
        for i in range(self.batches):
            messages = self.system.receive(10, wait_seconds if i == 0 else 0)
            if not messages:
                break
            total += len(messages)
            if self.shape is not None:
                messages = self.shape(messages)
            if messages:
                try:
                    self.system.deliver(messages, duplicate=self.duplicate, poller=self.poller)
                except Crash:
                    self.crashed.append(CrashedBatch(messages, time.monotonic()))
        if self.on_cycle is not None:
            self.on_cycle()
        return total

    def run_until(self, done: Callable[[], bool], *, timeout: float, what: str = "condition") -> float:
        """Cycle until ``done()``; raise AssertionError with diagnostics at the deadline."""
        start = time.monotonic()
        if self._next_fanout == 0.0 and self.fanout_every is not None:
            self._next_fanout = start + self.fanout_every
        while not done():
            if time.monotonic() - start > timeout:
                raise AssertionError(
                    f"timed out after {timeout:.0f} s waiting for {what}: "
                    f"{self.system.pending_count()} pending, queue depth {self.system.queue_depth()}, "
                    f"{len(self.crashed)} crashed batches")
            self.cycle()
        return time.monotonic() - start

    def redeliver_crashed(self, older_than: float) -> int:
        """Fast-forward the visibility timeout of crashed batches older than ``older_than`` s
        (SQS would redeliver them after the queue's VisibilityTimeout, 180 s in the template)."""
        n = 0
        now = time.monotonic()
        for batch in self.crashed:
            if batch.redelivered or now - batch.at < older_than:
                continue
            for m in batch.messages:
                self.system.sqs.change_message_visibility(
                    QueueUrl=self.system.queue_url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
                n += 1
            batch.redelivered = True
        return n


# -- Sume call tracing --------------------------------------------------------------------------------
class SumeTrace:
    """Counts, per job, what the project's Sume client returned (installed on the instance the
    handlers use). Lets a scenario state exactly how many faults each job was served."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.calls: dict[str, Counter[str]] = defaultdict(Counter)
        self.log: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()
        self._orig_status = client.get_status
        self._orig_result = client.get_result

    def _note(self, job_id: str, what: str) -> None:
        with self._lock:
            self.calls[job_id][what] += 1
            self.log.append((time.monotonic(), job_id, what))

    def install(self) -> SumeTrace:
        from sume_poller.sume import Fatal, Pending, Retryable

        def get_status(job_id: str) -> Any:
            out = self._orig_status(job_id)
            if isinstance(out, Retryable):
                what = "status_retryable"
            elif isinstance(out, Fatal):
                what = f"status_fatal_{out.scope}"
            elif isinstance(out, Pending):
                what = "status_unknown" if out.unknown_status else "status_pending"
            else:
                what = "status_terminal"
            self._note(job_id, what)
            return out

        def get_result(job_id: str) -> Any:
            out = self._orig_result(job_id)
            self._note(job_id, "result_retryable" if isinstance(out, Retryable) else
                       "result_fatal" if isinstance(out, Fatal) else "result_ok")
            return out

        self.client.get_status = get_status
        self.client.get_result = get_result
        return self

    def uninstall(self) -> None:
        for name in ("get_status", "get_result"):
            self.client.__dict__.pop(name, None)

    def count(self, job_id: str, *whats: str) -> int:
        with self._lock:
            return sum(self.calls[job_id][w] for w in whats)

    def total(self, *whats: str) -> int:
        with self._lock:
            return sum(c[w] for c in self.calls.values() for w in whats)


# -- DLQ --------------------------------------------------------------------------------------------
def dlq_bodies(system: LocalSystem) -> list[str]:
    """Every body in the dead-letter queue (received with a long visibility so each is read once)."""
    bodies: list[str] = []
    expected = system.queue_depth(system.dlq_url)
    deadline = time.monotonic() + 10
    while len(bodies) < expected and time.monotonic() < deadline:
        reply = system.sqs.receive_message(QueueUrl=system.dlq_url, MaxNumberOfMessages=10,
                                           VisibilityTimeout=60, WaitTimeSeconds=0)
        bodies.extend(m["Body"] for m in reply.get("Messages", []))
    return bodies


# -- the checker ---------------------------------------------------------------------------------------
@dataclass
class Verdict:
    """What one scenario measured (the figures come from here)."""

    scenario: str
    jobs: int
    faults: int
    reads: dict[str, int]
    min_reads: dict[str, int]
    result_reads: dict[str, int]
    statuses: Counter[str]
    distinct_events: int
    raw_duplicate_events: int
    dlq: list[str]
    bound: str
    notes: str = ""

    @property
    def reads_mean(self) -> float:
        return statistics.fmean(self.reads.values()) if self.reads else 0.0

    @property
    def min_reads_mean(self) -> float:
        return statistics.fmean(self.min_reads.values()) if self.min_reads else 0.0

    def row(self) -> dict[str, Any]:
        over = [self.reads[j] - self.min_reads[j] for j in self.reads]
        return {
            "scenario": self.scenario,
            "jobs": self.jobs,
            "faults": self.faults,
            "reads_mean": round(self.reads_mean, 2),
            "reads_max": max(self.reads.values(), default=0),
            "min_reads_mean": round(self.min_reads_mean, 2),
            "over_min_max": max(over, default=0),
            "events": self.distinct_events,
            "raw_dup_events": self.raw_duplicate_events,
            "dlq": len(self.dlq),
            "statuses": dict(sorted(self.statuses.items())),
            "bound": self.bound,
            "notes": self.notes,
        }


def check_invariants(
    system: LocalSystem,
    job_ids: Iterable[str],
    *,
    scenario: str,
    faults: int = 0,
    allowance: Mapping[str, int] | None = None,
    result_allowance: Mapping[str, int] | None = None,
    slack: int = 1,
    expected_status: Mapping[str, str] | None = None,
    events: list[dict[str, Any]] | None = None,
    dlq_allowed: Callable[[str], bool] = is_poison,
    pending_ok: Iterable[str] = (),
    bound: str = "status_reads <= min_reads + allowance + 1",
    notes: str = "",
) -> Verdict:
    """Assert the invariants for ``job_ids``; return the figures. ``events``: terminal events
    already drained by the test (the rest are drained here)."""
    ids = list(dict.fromkeys(job_ids))
    allowance = allowance or {}
    result_allowance = result_allowance or {}
    problems: list[str] = []

    # 1. exactly one recorded terminal outcome per job
    records = system.jobs(ids)
    missing = [j for j in ids if j not in records]
    if missing:
        problems.append(f"{len(missing)} jobs not recorded at all, e.g. {missing[:3]}")
    statuses: Counter[str] = Counter()
    for job_id, rec in records.items():
        statuses[str(rec.get("status"))] += 1
        if rec.get("status") not in TERMINAL_STATUSES:
            problems.append(f"{job_id}: status {rec.get('status')!r} is not terminal")
        if "pending_shard" in rec:
            problems.append(f"{job_id}: still in the pending index")
        if rec.get("event_pending"):
            problems.append(f"{job_id}: terminal event never marked published (event_pending)")
        if expected_status and job_id in expected_status and rec.get("status") != expected_status[job_id]:
            problems.append(f"{job_id}: status {rec.get('status')!r}, expected {expected_status[job_id]!r}")

    # 2. one terminal event per job id (dedupe by event_id), raw duplicates counted
    all_events = list(events or []) + system.drain_events()
    by_id: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in all_events:
        by_id[str(e.get("event_id"))].append(e)
    wanted = {f"{j}:terminal" for j in ids}
    for event_id in wanted - set(by_id):
        problems.append(f"terminal event lost: {event_id}")
    strangers = set(by_id) - wanted
    if strangers:
        problems.append(f"events for jobs outside the scenario: {sorted(strangers)[:3]}")
    for event_id, copies in by_id.items():
        job_id = event_id.removesuffix(":terminal")
        if job_id in records and any(c.get("status") != records[job_id].get("status") for c in copies):
            problems.append(f"{event_id}: event status differs from the record")
        if len({json.dumps(c, sort_keys=True) for c in copies}) > 1:
            problems.append(f"{event_id}: duplicate deliveries differ in content")
    raw_dups = sum(len(c) - 1 for c in by_id.values())

    # 3. nothing pending without a way back (fan-out must be able to resend what is pending)
    ok_pending = set(pending_ok)
    for item in _pending_items(system):
        job_id = item.get("job_id")
        if job_id not in ok_pending:
            problems.append(f"unexpected pending record {job_id!r}")
            continue
        try:
            validate_job_id(job_id)
        except InvalidJobId:
            problems.append(f"pending record {job_id!r} has an id fan-out skips")
        if item.get("kind") not in KINDS or not isinstance(item.get("deadline_at"), int):
            problems.append(f"pending record {job_id!r} lacks kind/deadline: fan-out skips it")

    # 4. the DLQ holds only poison
    dlq = dlq_bodies(system)
    for body in dlq:
        if not dlq_allowed(body):
            problems.append(f"DLQ holds a processable message: {body[:160]}")

    # 5. bounded Sume reads
    stats = system.sim_stats()["jobs"]
    reads: dict[str, int] = {}
    mins: dict[str, int] = {}
    result_reads: dict[str, int] = {}
    for job_id in ids:
        info = stats.get(job_id)
        if info is None:  # never read (e.g. timed out without a read)
            reads[job_id], mins[job_id], result_reads[job_id] = 0, 0, 0
            continue
        reads[job_id] = int(info["status_reads"])
        mins[job_id] = int(info["min_reads"] or 0)
        result_reads[job_id] = int(info["result_reads"])
        limit = mins[job_id] + allowance.get(job_id, 0) + slack
        if reads[job_id] > limit:
            problems.append(f"{job_id}: {reads[job_id]} status reads > bound {limit} "
                            f"(min_reads {mins[job_id]} + allowance {allowance.get(job_id, 0)} + slack {slack})")
        rec = records.get(job_id, {})
        result_limit = (1 if rec.get("status") == "completed" else 0) + result_allowance.get(job_id, 0)
        if result_reads[job_id] > result_limit:
            problems.append(f"{job_id}: {result_reads[job_id]} result reads > {result_limit}")

    verdict = Verdict(scenario, len(ids), faults, reads, mins, result_reads, statuses, len(by_id),
                      raw_dups, dlq, bound, notes)
    record_figures(verdict)
    if problems:
        shown = "\n  ".join(problems[:25])
        raise AssertionError(f"[{scenario}] {len(problems)} invariant violations:\n  {shown}")
    return verdict


def _pending_items(system: LocalSystem) -> list[dict[str, Any]]:
    from sume_poller.aws import from_item
    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"TableName": system.table, "FilterExpression": "attribute_exists(pending_shard)"}
    while True:
        reply = system.ddb.scan(**kwargs)
        items.extend(from_item(i) for i in reply.get("Items", []))
        if not reply.get("LastEvaluatedKey"):
            return items
        kwargs["ExclusiveStartKey"] = reply["LastEvaluatedKey"]


# -- figures ---------------------------------------------------------------------------------------------
FIGURES: list[dict[str, Any]] = []


def record_figures(verdict: Verdict | None = None, **row: Any) -> None:
    """Keep one row per scenario (the last one wins) for the summary and the figures file."""
    entry = verdict.row() if verdict is not None else row
    FIGURES[:] = [r for r in FIGURES if r["scenario"] != entry["scenario"]]
    FIGURES.append(entry)


def summary_line(r: dict[str, Any]) -> str:
    if "reads_mean" not in r:
        return f"{r['scenario']}: " + ", ".join(f"{k}={v}" for k, v in r.items() if k != "scenario")
    return (f"{r['scenario']}: jobs={r['jobs']} faults={r['faults']} reads/job mean={r['reads_mean']} "
            f"max={r['reads_max']} (min_reads mean={r['min_reads_mean']}, max over min={r['over_min_max']:+d}) "
            f"events={r['events']} raw_dups={r['raw_dup_events']} dlq={r['dlq']}")


def write_figures(rows: list[dict[str, Any]], path: Path = FIGURES_PATH) -> None:
    """Merge ``rows`` into the Markdown figures file (rows of other runs/modules are kept)."""
    path.parent.mkdir(exist_ok=True)
    existing: dict[str, dict[str, Any]] = {}
    json_path = path.with_suffix(".json")
    if json_path.exists():
        try:
            existing = {r["scenario"]: r for r in json.loads(json_path.read_text())}
        except (ValueError, KeyError, TypeError):
            existing = {}
    for r in rows:
        existing[r["scenario"]] = r
    merged = sorted(existing.values(), key=lambda r: r["scenario"])
    json_path.write_text(json.dumps(merged, indent=1, default=str))
    lines = ["| scenario | jobs | faults injected | reads/job mean | max | min_reads mean | max over min "
             "| bound | distinct events | raw dup events | DLQ | outcomes | notes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in merged:
        if "reads_mean" in r:
            lines.append(f"| {r['scenario']} | {r['jobs']} | {r['faults']} | {r['reads_mean']} | {r['reads_max']} "
                         f"| {r['min_reads_mean']} | {r['over_min_max']:+d} | `{r['bound']}` | {r['events']} "
                         f"| {r['raw_dup_events']} | {r['dlq']} | "
                         + ", ".join(f"{k} {v}" for k, v in r["statuses"].items()) + f" | {r.get('notes', '')} |")
        else:
            rest = ", ".join(f"{k}={v}" for k, v in r.items() if k != "scenario")
            lines.append(f"| {r['scenario']} | | | | | | | | | | | | {rest} |")
    path.write_text("# Fault-suite figures\n\nGenerated by tests/test_faults.py and tests/test_fuzz.py "
                    f"({time.strftime('%Y-%m-%d %H:%M:%S')}).\n\n" + "\n".join(lines) + "\n")


# -- a tiny fake Sume ---------------------------------------------------------------------------------
Reply = tuple[int, dict[str, str], "bytes | Callable[[str], bytes]"]


class FakeSume:
    """A tiny HTTP server answering each request with the next queued ``(status, headers, body)``
    (``body`` may be a function of the request path), then with :attr:`default`. For replies the
    simulator cannot produce: absurd hints, huge numbers, deep nesting, odd headers."""

    def __init__(self) -> None:
        import http.server

        self.replies: list[Reply] = []
        self.default: Reply = (200, {}, b"{}")
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._lock = threading.Lock()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def _answer(self) -> None:
                with fake._lock:
                    fake.requests.append((self.command, self.path, dict(self.headers)))
                    status, headers, body = fake.replies.pop(0) if fake.replies else fake.default
                data = body(self.path) if callable(body) else body
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/api/v1"

    def __enter__(self) -> FakeSume:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

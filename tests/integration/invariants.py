"""What every fault scenario must leave true, checked on the local stack once it has settled.

* every job is recorded exactly once, terminal, out of the pending index, its outbox done;
* exactly one terminal event per job id (distinct ``event_id``);
* status reads stay within the simulator's minimum (a client obeying every hint) plus the
  faults the scenario injected for that job, plus one; no status read after Sume already
  answered with the job's terminal status (beyond those faults);
* the dead-letter queue holds only poison (bodies that fail to parse).

Each check records a figures row; the rows are written to ``.scratch/fault-figures.md`` at the
end of the session (see conftest.py) for the fault table in docs/design/guarantees.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sume_poller.core.messages import MessageError, parse_message

FIGURES: list[dict[str, Any]] = []
FIGURES_PATH = Path(__file__).resolve().parents[2] / ".scratch" / "fault-figures.md"


class Crash(BaseException):
    """What a crash hook raises: not an Exception, so nothing in the handler swallows it."""


@dataclass
class Verdict:
    scenario: str
    jobs: int
    by_status: dict[str, int]
    status_reads: int
    min_reads: int
    result_reads: int
    events: int
    dlq_poison: int
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def reads_per_minimum(self) -> float:
        return self.status_reads / self.min_reads if self.min_reads else float("nan")


def is_poison(body: str) -> bool:
    try:
        parse_message(body)
    except MessageError:
        return True
    return False


def dlq_bodies(stack: Any) -> list[str]:
    """The bodies of the visible messages of the stack's DLQ, left in it (visible again at once)."""
    sqs, seen = stack.client("sqs"), {}
    while fresh := [m for m in sqs.receive_message(QueueUrl=stack.dlq_url, MaxNumberOfMessages=10,
                                                   VisibilityTimeout=30, WaitTimeSeconds=0).get("Messages", [])
                    if m["MessageId"] not in seen]:
        seen.update((m["MessageId"], m) for m in fresh)
    messages = list(seen.values())
    for start in range(0, len(messages), 10):
        sqs.change_message_visibility_batch(QueueUrl=stack.dlq_url, Entries=[
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
            for i, m in enumerate(messages[start:start + 10])])
    return [m["Body"] for m in messages]


def check(stack: Any, job_ids: Iterable[str], *, scenario: str, allowance: int | Mapping[str, int] = 0,
          expected: Mapping[str, str] | str | None = None, notes: str = "", **extra: Any) -> Verdict:
    """Assert the invariants for ``job_ids`` on ``stack`` (settled) and record a figures row."""
    ids = list(dict.fromkeys(job_ids))
    records = stack.table.get_many(ids)
    problems: list[str] = []
    for job_id in ids:
        record = records.get(job_id)
        want = expected.get(job_id) if isinstance(expected, Mapping) else expected
        if record is None:
            problems.append(f"{job_id}: not recorded")
        elif record.get("status") == "pending" or "pending_shard" in record or record.get("event_pending"):
            problems.append(f"{job_id}: not finished: {record}")
        elif want is not None and record.get("status") != want:
            problems.append(f"{job_id}: {record.get('status')} instead of {want}")
    events = [e for e in stack.events() if e.get("job_id") in set(ids)]
    distinct = Counter(e["job_id"] for e in {e["event_id"]: e for e in events}.values())
    problems += [f"{j}: {distinct[j]} distinct terminal events" for j in ids if distinct[j] != 1]
    sim = stack.sim.stats()["jobs"]
    for job_id in ids:
        reads = sim.get(job_id)
        if reads is None or reads.get("min_reads") is None:
            continue
        allowed = allowance.get(job_id, 0) if isinstance(allowance, Mapping) else allowance
        if reads["status_reads"] > reads["min_reads"] + allowed + 1:
            problems.append(f"{job_id}: {reads['status_reads']} status reads > minimum {reads['min_reads']} "
                            f"+ {allowed} faults + 1")
        if reads.get("status_reads_after_terminal", 0) > allowed:
            problems.append(f"{job_id}: {reads['status_reads_after_terminal']} status reads after Sume said terminal")
    dlq = dlq_bodies(stack)
    problems += [f"not poison in the DLQ: {body[:120]}" for body in dlq if not is_poison(body)]
    assert not problems, f"{scenario}{f' ({notes})' if notes else ''}: " + "\n".join(problems[:25])
    ours = [sim[j] for j in ids if j in sim and sim[j].get("min_reads") is not None]
    verdict = Verdict(scenario, len(ids), dict(Counter(str(r.get("status")) for r in records.values())),
                      sum(r["status_reads"] for r in ours), sum(r["min_reads"] for r in ours),
                      sum(r["result_reads"] for r in ours), len(events), len(dlq), notes, extra)
    FIGURES.append({**asdict(verdict), "reads_per_minimum": round(verdict.reads_per_minimum, 3)})
    return verdict


def write_figures(path: Path = FIGURES_PATH) -> None:
    if not FIGURES:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["| scenario | jobs | outcomes | status reads / minimum | result reads | events | DLQ poison | notes |",
             "|---|---|---|---|---|---|---|---|"]
    for row in FIGURES:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(row["by_status"].items()))
        lines.append(f"| {row['scenario']} | {row['jobs']} | {outcomes} | {row['status_reads']} / "
                     f"{row['min_reads']} = {row['reads_per_minimum']} | {row['result_reads']} | {row['events']} "
                     f"| {row['dlq_poison']} | {row['notes']} |")
    path.write_text("\n".join(lines) + "\n")


class LeaseLapses:
    """Counts, per job, the times its chain's lease expired (Redis keyspace notifications of expired
    keys) while the block ran. A lapse is the documented way a job gets a second chain: fan-out
    restarts it from its record, whose first step reads the job's status even if Sume had finished
    it - one status read per lapse. Leases lapse when a message comes back later than its lease's
    margin (a busy machine's queueing lag), so a scenario that counts reads after Sume said terminal
    allows exactly the lapses that happened, measured, instead of a guess at how busy the machine is.
    (Redis deletes an expired key, and notifies, when someone touches it or its expiry sweep finds it:
    a lapse nobody acted on may go uncounted, and acted on it always is.)"""

    def __init__(self, stack: Any, prefix: str = "sume:poll:") -> None:
        import redis

        self.prefix, self._client = prefix, redis.Redis.from_url(stack.redis_url, decode_responses=True)
        self._before = self._client.config_get("notify-keyspace-events")["notify-keyspace-events"]
        self.counts: Counter[str] = Counter()

    def __enter__(self) -> LeaseLapses:
        self._client.config_set("notify-keyspace-events", "Ex")
        self._pubsub = self._client.pubsub()
        self._pubsub.psubscribe("__keyevent@*__:expired")
        confirmed = self._pubsub.get_message(timeout=5)
        assert confirmed is not None and confirmed["type"] == "psubscribe", confirmed
        return self

    def collect(self) -> Counter[str]:
        """The lapses so far, per job id (every notification already sent is read)."""
        while (message := self._pubsub.get_message(timeout=0.05)) is not None:
            key = str(message["data"]) if message["type"] == "pmessage" else ""
            if key.startswith(self.prefix) and not key[len(self.prefix):].startswith(("!", "@", "{")):
                self.counts[key[len(self.prefix):]] += 1
        return self.counts

    def __exit__(self, *exc: object) -> None:
        self._pubsub.close()
        self._client.config_set("notify-keyspace-events", self._before)
        self._client.close()

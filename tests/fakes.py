"""In-process fakes of the poller's ports, for the unit tier only (no network).

Each fake keeps the documented contract of the real part it stands for (the lease protocol of
lease.py, the conditional writes of store.py, ...), in a few lines; the integration tier checks
the real parts against the same contracts.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

from sume_poller.core.clock import Clock
from sume_poller.core.jobs import OUTBOX_PREFIX, PENDING, PENDING_PREFIX, keyed_shard, shard_of
from sume_poller.limits.budget import Grant, RateInfo
from sume_poller.limits.lease import ChainStep, Claim, HandOver, resting_value
from sume_poller.store.events import PublishRefused, PublishUnknown
from sume_poller.store.queue import Outgoing
from sume_poller.store.records import Ending, PublishClaim, TerminalWrite
from sume_poller.sume.client import Refused, Retryable
from sume_poller.sume.listing import Listing
from sume_poller.sume.status import Result


class FakeClock(Clock):
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        super().__init__(1.0, wall=lambda: self.t)
        self.t = start

    def advance(self, seconds: float) -> None:
        self.t += seconds


class FakeLease:
    """The lease protocol of lease.py over a dict; ``down`` makes every call fail like Redis."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.down = False
        self.client = self
        self.rested_ms: dict[str, int] = {}  # the TTL of each job's last rest

    def _check(self) -> None:
        if self.down:
            raise RedisConnectionError("fake Redis is down")

    def claim(self, job_id: str, step: ChainStep, fresh: ChainStep, ttl_ms: int = 0) -> Claim:
        self._check()
        value = self.values.get(job_id)
        if value is None or value == fresh.claimed:
            self.values[job_id] = fresh.claimed
            return Claim.FRESH
        token, _, rest = value.partition(":")
        seq = int(rest.split("!")[0].split("@")[0].rstrip("*"))
        if value in (step.resting, step.resting + "*", step.claimed) or value.startswith(step.resting + "@") or (
                token == step.token and seq < step.seq and "!" not in value):
            self.values[job_id] = step.claimed
            return Claim.OWN
        return Claim.BUSY if token == step.token and seq < step.seq else Claim.HELD

    def rest(self, job_id: str, step: ChainStep, ttl_ms: int, *, finishing: bool = False,
             slot: float | None = None) -> bool:
        self._check()
        resting = resting_value(step, finishing, slot)
        if self.values.get(job_id) in (step.claimed, resting):
            self.values[job_id] = resting
            self.rested_ms[job_id] = ttl_ms
            return True
        return False

    def release(self, job_id: str, value: str) -> bool:
        self._check()
        if self.values.get(job_id) in (value, None):
            self.values.pop(job_id, None)
            return True
        return False

    def hand_over(self, job_id: str, fresh_token: str, ttl_ms: int, **until_slot: Any) -> HandOver | None:
        self._check()
        self.hand_over_ttl = (ttl_ms, until_slot)
        value = self.values.get(job_id)
        if value is None:
            self.values[job_id] = f"{fresh_token}:0*"
            return HandOver(fresh_token, 0)
        if "!" in value or value.endswith("*"):
            return None
        value, _, slot = value.partition("@")
        token, seq = value.split(":")
        self.values[job_id] = f"{token}:{int(seq) + 1}*"
        return HandOver(token, int(seq) + 1, int(slot) / 1000 if slot else None)

    # the few plain Redis commands the webhook uses for event ids
    def exists(self, key: str) -> int:
        self._check()
        return int(key in self.values)

    def set(self, key: str, value: str, ex: int | None = None) -> bool:
        self._check()
        self.values[key] = value
        return True

    prefix = "t:"

    def held(self, job_ids: list[str]) -> list[bool]:
        self._check()
        return [j in self.values for j in job_ids]

    def start(self, job_id: str, token: str, ttl_ms: int) -> bool:
        self._check()
        if self.values.get(job_id) in (None, f"{token}:0"):
            self.values[job_id] = f"{token}:0"
            return True
        return False


class FakeBudget:
    """Grants every read now unless told otherwise (``grants``: the next answers, in order)."""

    def __init__(self) -> None:
        self.grants: list[Grant] = []
        self.feedback_seen: list[RateInfo] = []
        self.key_paused_for: float | None = None
        self.unlimited = False
        self.early = 0.5
        self.key = "t:budget"
        self.down = False
        self.per_minute = 120
        self.rate = 2.0
        self.takes = 0
        self.pending = 0
        self.patience: list[float] = []
        self.modes: list[str] = []
        self.slots: list[float] = []
        self.counts: list[int] = []
        self.lane: tuple[float, float] | None = None

    def clock_to_real(self, seconds: float) -> float:
        return seconds

    def now(self) -> float:
        return 1_000.0

    def take(self, mode: str = "take", max_wait: float = math.inf, slot: float = 0.0, count: int = 1) -> Grant:
        if self.down:
            raise RedisConnectionError("fake Redis is down")
        self.takes += 1
        self.patience.append(max_wait)
        self.modes.append(mode)
        self.slots.append(slot)
        self.counts.append(count)
        return self.grants.pop(0) if self.grants else Grant(True, 0.0)

    #: Status reads granted so far (the limiter's counter), and list reads a clock second the lane keeps.
    status_taken = 0
    lane_per_second = 0.2

    def state(self) -> dict[str, float]:
        return {"pending": float(self.pending), "status_taken": float(self.status_taken),
                **({"oldest_pending": self.oldest} if self.oldest else {})}

    def lane_rate(self, share: float) -> float:
        return self.lane_per_second

    #: Whether the line has reads to spare for a sweep (Budget.spare).
    spares = False

    def spare(self, count: int, share: float, state: dict[str, float] | None = None) -> bool:
        return self.spares

    oldest: float | None = None

    @property
    def mailbox(self) -> FakeBudget:  # the pending-count mailbox lives in the budget's hash
        return self

    def set_pending(self, count: int) -> None:
        self.pending = count

    def set_oldest_pending(self, submitted: float) -> None:
        self.oldest = submitted

    def feedback(self, info: RateInfo) -> None:
        self.feedback_seen.append(info)

    def pause_key(self, seconds: float) -> None:
        self.key_paused_for = seconds

    def open_lane(self, share: float, until: float) -> None:
        self.lane = (share, until)

    def lane_burst(self, share: float) -> int:
        return 9


class FakePacer:
    def __init__(self) -> None:
        self.waits: list[float] = []
        self.takes = 0
        self.day_left: int | None = None
        self.paused_until = 0.0

    def take(self) -> float:
        self.takes += 1
        return self.waits.pop(0) if self.waits else 0.0

    def learn(self, day_left: int | None) -> None:
        self.day_left = day_left

    def pause(self, until: float) -> None:
        self.paused_until = until


@dataclass
class FakeSume:
    """Scripted replies per job: ``status[job]`` and ``result[job]`` are lists consumed in order
    (the last one repeats); every call is recorded."""

    status: dict[str, list[Any]] = field(default_factory=lambda: defaultdict(list))
    result: dict[str, list[Any]] = field(default_factory=lambda: defaultdict(list))
    listing: list[Any] = field(default_factory=list)
    creates: list[Any] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)
    result_max_bytes: int = 50_000_000

    @staticmethod
    def _next(script: list[Any]) -> Any:
        return script.pop(0) if len(script) > 1 else script[0]

    def get_status(self, job_id: str, timeout: float | None = None) -> Any:
        self.calls.append(("status", job_id))
        return self._next(self.status[job_id])

    def get_result(self, job_id: str, timeout: float | None = None, **stream: Any) -> Any:
        self.calls.append(("result", job_id))
        return self._next(self.result[job_id]) if self.result[job_id] else Result({"url": "u"})

    def list_jobs(self, **kwargs: Any) -> Any:
        self.calls.append(("list", str(kwargs.get("status") or "")))
        return self._next(self.listing) if self.listing else Listing((), None, False)

    def create(self, kind: str, params: Any, idempotency_key: str, timeout: float | None = None) -> Any:
        self.calls.append(("create", idempotency_key))
        return self._next(self.creates)

    def reads(self, kind: str, job_id: str | None = None) -> int:
        return sum(1 for k, j in self.calls if k == kind and (job_id is None or j == job_id))


class FakeStore:
    """The job table's conditional semantics over a dict."""

    def __init__(self, shards: int = 8) -> None:
        self.shards = shards
        self.records: dict[str, dict[str, Any]] = {}
        self.observations: dict[str, dict[str, tuple[float, float | None, float]]] = defaultdict(dict)
        self.down = False
        self.results = None
        self.keys_noted: set[str] = set()

    def put_pending(self, job_id: str, kind: str, *, now: float, deadline_at: int, profile: str | None = None,
                    chain_due_at: float | None = None, extra: dict[str, Any] | None = None, key: str | None = None,
                    own_partition: bool = False) -> bool:
        if job_id in self.records:
            return False
        shard = keyed_shard(shard_of(job_id, self.shards), key if own_partition else None)
        self.records[job_id] = {"job_id": job_id, "kind": kind, "profile": profile or kind, "status": PENDING,
                                "key": key, "pending_shard": shard, "deadline_at": deadline_at,
                                "submitted_at": int(now), "chain_due_at": chain_due_at, **(extra or {})}
        return True

    def note_key(self, key_id: str) -> None:
        self.keys_noted.add(key_id)

    def known_keys(self) -> set[str]:
        return set(self.keys_noted)

    def get(self, job_id: str) -> dict[str, Any] | None:
        record = self.records.get(job_id)
        return dict(record) if record else None

    def get_many(self, job_ids: list[str], fields: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
        keep = None if fields is None else {"job_id", *fields}
        return {j: {k: v for k, v in self.records[j].items() if keep is None or k in keep}
                for j in job_ids if j in self.records}

    def _pending(self, job_id: str) -> bool:
        return str(self.records.get(job_id, {}).get("pending_shard", "")).startswith(PENDING_PREFIX)

    def record_terminal(self, job_id: str, outcome: Ending, *, now: float,
                        claim: PublishClaim | None = None) -> TerminalWrite:
        if not self._pending(job_id):
            return TerminalWrite(False, self.get(job_id))
        record = self.records[job_id]
        record.update(status=outcome.status, terminal_at=int(now), event_pending=True, sume_status=outcome.sume_status,
                      error=outcome.error, status_reads=outcome.status_reads, result_reads=outcome.result_reads,
                      reads=outcome.status_reads + outcome.result_reads, seen_running_at=outcome.seen_running_at,
                      seen_terminal_at=outcome.seen_terminal_at, found_by=outcome.found_by,
                      evidence=str(outcome.evidence), pending_shard=shard_of(job_id, self.shards, OUTBOX_PREFIX),
                      **outcome.result)
        if claim is not None:
            record.update(event_claim=claim.token, chain_due_at=claim.until)
        return TerminalWrite(True, dict(record))

    def claim_outbox(self, job_id: str, claim: PublishClaim, *, now: float) -> TerminalWrite:
        record = self.records.get(job_id)
        if record is None or not record.get("event_pending") or float(record.get("chain_due_at") or 0) > now:
            return TerminalWrite(False, self.get(job_id))
        took_over = "event_claim" in record
        record.update(event_claim=claim.token, chain_due_at=claim.until)
        return TerminalWrite(True, dict(record), took_over)

    def release_claim(self, job_id: str, token: str) -> bool:
        record = self.records.get(job_id, {})
        if record.get("event_claim") != token or not record.get("event_pending"):
            return False
        del record["event_claim"]
        record["chain_due_at"] = 0
        return True

    def result_fields(self, job_id: str, result: Any) -> dict[str, Any]:
        text = json.dumps(result, separators=(",", ":"))
        return {"result_json": text, "result_bytes": len(text)}

    def clear_outbox(self, job_id: str, *, now: float) -> bool:
        record = self.records.get(job_id, {})
        if not record.pop("event_pending", None):
            return False
        record.pop("pending_shard", None)
        record.pop("event_claim", None)
        return True

    def fence(self, job_id: str, token: str, seq: int, *, now: float, hold: float) -> TerminalWrite:
        record = self.records.get(job_id)
        if record is None or not self._pending(job_id):
            return TerminalWrite(False, self.get(job_id))
        if record.get("fence_token") == token and record.get("fence_seq", 0) > seq:
            return TerminalWrite(False, self.get(job_id))
        if record.get("fence_token") not in (None, token) and float(record.get("chain_due_at") or 0) > now:
            return TerminalWrite(False, self.get(job_id))  # another chain's fence, still held
        record.update(fence_token=token, fence_seq=seq + 1, chain_due_at=now + hold)
        return TerminalWrite(True)

    def set_chain_due(self, job_id: str, due_at: float) -> None:
        if self._pending(job_id):
            self.records[job_id]["chain_due_at"] = due_at

    def put_observation(self, profile: str, job_id: str, lower: float, upper: float | None, at: float) -> None:
        self.observations[profile][job_id] = (lower, upper, at)

    # the create queue, as JobStore's conditions write it
    def submission(self, key_id: str, idempotency_key: str) -> dict[str, Any] | None:
        from sume_poller.store.submissions import submission_id
        return self.get(submission_id(key_id, idempotency_key))

    def enqueue(self, item: dict[str, Any], submission: dict[str, Any], unknown_creates: int | None = None) -> bool:
        old = self.records.get(submission["job_id"])
        if item["job_id"] in self.records:
            return False
        if unknown_creates is None:
            if old is not None:
                return False
            record = dict(submission)
        else:
            if old is None or "status" in old or old.get("unknown_creates") != unknown_creates:
                return False
            record = {**submission, "unknown_creates": unknown_creates}
        self.records[item["job_id"]], self.records[submission["job_id"]] = dict(item), record
        return True

    def put_submission(self, record: dict[str, Any]) -> bool:
        old = self.records.get(record["job_id"])
        if old is not None and old.get("status") not in (None, "queued"):
            return False
        self.records[record["job_id"]] = {k: v for k, v in record.items() if v is not None}
        return True

    def note_create(self, key_id: str, idempotency_key: str, queue_item: str | None, *, now: float) -> bool:
        from sume_poller.store.submissions import submission_id
        sid = submission_id(key_id, idempotency_key)
        old = self.records.get(sid)
        if queue_item is None:
            if old is not None and old.get("status") not in (None, "queued"):
                return False
        elif old is None or old.get("status") != "queued" or old.get("queue_item") != queue_item:
            return False
        record = self.records.setdefault(sid, {"job_id": sid})
        record["unknown_creates"] = record.get("unknown_creates", 0) + 1
        record["create_attempts"] = record.get("create_attempts", 0) + 1
        record["last_create_at"] = round(now, 3)
        return True

    def create_answered(self, key_id: str, idempotency_key: str) -> None:
        from sume_poller.store.submissions import submission_id
        record = self.records.get(submission_id(key_id, idempotency_key))
        if record is not None and record.get("status") in (None, "queued") and record.get("unknown_creates", 0) > 0:
            record["unknown_creates"] -= 1

    def settle_submission(self, key_id: str, idempotency_key: str, queue_item: str, values: dict[str, Any]) -> bool:
        record = self.submission(key_id, idempotency_key)
        if record is None or record.get("status") != "queued" or record.get("queue_item") != queue_item:
            return False
        self.records[record["job_id"]].update({k: v for k, v in values.items() if v is not None})
        return True

    def queue_head(self, key_id: str, limit: int = 1, after: str | None = None) -> list[str]:
        ids = sorted(j for j, r in self.records.items() if r.get("pending_shard") == f"q:{key_id}"
                     and (after is None or j > after))
        return ids[:limit]

    def queue_ahead(self, key_id: str, item_id: str) -> int:
        return len([j for j in self.queue_head(key_id, 10**9) if j < item_id])

    def dequeue(self, item_id: str) -> bool:
        return self.records.pop(item_id, None) is not None


class FakeBus:
    """EventBus's contract: ``fail_next`` refusals (the event is not on the bus), ``lose_next`` calls
    taken but never answered (it is: :class:`PublishUnknown`); ``during`` runs inside the call, before
    EventBridge takes it (a test's interleaving)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.fail_next = 0
        self.lose_next = 0
        self.calls = 0
        self.during: Callable[[str], None] | None = None

    def put_terminal(self, job_id: str, record: dict[str, Any]) -> None:
        self.calls += 1
        if self.during is not None:
            during, self.during = self.during, None
            during(job_id)
        if self.fail_next:
            self.fail_next -= 1
            raise PublishRefused("PutEvents failed")
        self.events.append((job_id, record))
        if self.lose_next:
            self.lose_next -= 1
            raise PublishUnknown("PutEvents taken, the answer lost")


class FakeQueue:
    """PollQueue's sending side; ``refuse`` makes the next sends fail."""

    max_delay = 900.0

    def __init__(self) -> None:
        self.sent: list[Outgoing] = []
        self.refuse = 0

    def real_delay(self, delay: float) -> int:
        """As PollQueue's on a clock at real speed: whole seconds, rounded up, at most 900."""
        return max(0, min(900, math.ceil(max(0.0, delay) - 1e-9)))

    def send(self, messages: Any) -> set[str]:
        unsent = set()
        for m in messages:
            if self.refuse:
                self.refuse -= 1
                unsent.add(m.key)
            else:
                self.sent.append(m)
        return unsent


def status(name: str, hint: float | None = None, rate: RateInfo | None = None) -> Any:
    """A Pending reply (helper for scripts)."""
    from sume_poller.sume.status import Pending
    return Pending(name, hint, rate=rate or RateInfo())


def done(status_: str = "completed", ready: bool = True, error: dict[str, str] | None = None,
         gated: bool = True) -> Any:
    """A Terminal reply; ``gated``: it carried ``result_ready`` (Sume's gate for the result)."""
    from sume_poller.sume.status import Terminal
    return Terminal(status_, status_, ready, error, gated=gated)


def refused(why: str, http_status: int) -> Refused:
    return Refused(why, http_status, code=why)


def retry(http_status: int = 503, retry_after: float | None = None) -> Retryable:
    return Retryable(f"http_{http_status}", retry_after, http_status)


Hook = Callable[[str, str], None]


class FakeCoverage:
    """CoverageStore's contract over dicts (see coverage.py)."""

    def __init__(self) -> None:
        self.fields: dict[str, str] = {}
        self.found_at: dict[str, dict[str, float]] = defaultdict(dict)
        self.found_status: dict[str, str | None] = {}

    def found(self, kind: str, job_id: str, at: float, submitted: float | None = None,
              status: str | None = None) -> None:
        self.found_at[kind][job_id] = at
        self.found_status[job_id] = status

    def state(self) -> dict[str, str]:
        return dict(self.fields)

    def update(self, **fields: Any) -> None:
        self.fields.update({k: str(v) for k, v in fields.items()})

    def fail(self, route: str, retry_at: float) -> None:
        self.update(route=route, route_until=retry_at, healthy_until=0)

    def fail_status(self, status: str, retry_at: float) -> None:
        self.update(**{f"unfiltered:{status}": retry_at}, healthy_until=0)

    def judge(self, listed: dict[str, set[str]], swept_from: float, lag: float,
              created_after: float | None = None, statuses: frozenset[str] | None = None) -> dict[str, tuple[int, int]]:
        self.judged_created_after = created_after
        verdicts = {}
        for kind in {*listed, *self.found_at}:
            found = {j: at for j, at in self.found_at[kind].items()
                     if statuses is None or self.found_status.get(j) in statuses}
            hits = [j for j in found if j in listed.get(kind, set())]
            misses = [j for j, at in found.items() if j not in listed.get(kind, set()) and at < swept_from - lag]
            for j in hits + misses:
                del self.found_at[kind][j]
            covered = 0 if misses else int(self.fields.get(f"cov:{kind}", 0)) + len(hits)
            self.fields[f"cov:{kind}"] = str(covered)
            if misses:
                self.fields[f"miss:{kind}"] = str(int(self.fields.get(f"miss:{kind}", 0)) + len(misses))
            verdicts[kind] = (len(hits), len(misses))
        return verdicts

"""The batch adapter (batch.py): records concurrently, re-queues together, a failed send frees the
lease and fails its record, poison fails alone, metrics from the handler's thread."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from fakes import FakeQueue

from sume_poller.core.messages import PollMessage
from sume_poller.poll import batch as batch_module
from sume_poller.poll.batch import BatchRunner, emit_metrics
from sume_poller.poll.poller import Deadline, Outcome
from sume_poller.store.queue import Outgoing

TOKEN = "ab" * 16


class ScriptedPoller:
    """Stands in for Poller: returns an outcome per job id; records the threads it ran on. With
    ``meet``, the first two records wait for each other: they finish only if they run at once."""

    def __init__(self, outcomes: dict[str, Outcome], meet: bool = False) -> None:
        self.outcomes = outcomes
        self.threads: set[str] = set()
        self.step_hook = None
        self.meet = threading.Barrier(2, timeout=10) if meet else None
        self.arrived = 0
        self.lock = threading.Lock()

    def process(self, msg: PollMessage, deadline: Deadline) -> Outcome:
        self.threads.add(threading.current_thread().name)
        with self.lock:
            first_two = self.arrived < 2
            self.arrived += 1
        if self.meet is not None and first_two:
            self.meet.wait()  # BrokenBarrierError when the records ran one after the other
        return self.outcomes[msg.job_id]


def record(job_id: str, body: str | None = None) -> dict[str, Any]:
    body = body or PollMessage(job_id=job_id, kind="image", deadline_at=2_000_000_000, due_at=0, token=TOKEN).to_json()
    return {"messageId": f"m-{job_id}", "body": body, "attributes": {"ApproximateReceiveCount": "1"}}


def requeue(job_id: str, undone: list[str]) -> Outcome:
    return Outcome("requeued", 1, send=Outgoing(job_id, f"next-{job_id}", 5.0), undo=lambda: undone.append(job_id))


def test_re_queues_go_out_together_and_a_refused_one_fails_its_record_and_frees_the_lease() -> None:
    undone: list[str] = []
    jobs = [f"job_{i}" for i in range(12)]
    poller = ScriptedPoller({j: requeue(j, undone) for j in jobs}, meet=True)
    queue = FakeQueue()
    queue.refuse = 1
    report = BatchRunner(poller, queue, safety_margin_ms=0).run(  # type: ignore[arg-type]
        {"Records": [record(j) for j in jobs]}, lambda: 30_000)
    assert len(queue.sent) == 11 and undone == ["job_0"]
    assert report.response() == {"batchItemFailures": [{"itemIdentifier": "m-job_0"}]}
    assert len(poller.threads) > 1  # records ran concurrently (the first two met)


def test_poison_fails_alone_and_its_neighbours_go_on() -> None:
    poller = ScriptedPoller({"job_ok": Outcome("terminal", 1, status="completed")})
    report = BatchRunner(poller, FakeQueue(), safety_margin_ms=0).run(  # type: ignore[arg-type]
        {"Records": [record("job_ok"), record("bad", body="{not json")]}, lambda: 30_000)
    assert report.failures == ["m-bad"] and report.counts() == {"terminal": 1, "malformed": 1}


def test_not_an_sqs_event_is_a_clear_error() -> None:
    runner = BatchRunner(ScriptedPoller({}), FakeQueue(), safety_margin_ms=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not an SQS event"):
        runner.run({"detail": {}}, lambda: 30_000)


def test_metrics_are_emitted_on_the_handlers_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []
    keyed: list[tuple[dict[str, dict[str, float]], str]] = []
    monkeypatch.setattr(batch_module.metrics, "add_metric",
                        lambda name, unit, value: seen.append((name, threading.current_thread().name)))
    monkeypatch.setattr(batch_module, "count_by_key",
                        lambda counts: keyed.append((counts, threading.current_thread().name)))
    poller = ScriptedPoller({"job_1": Outcome("requeued", 1, signals=("UnknownStatus", "BudgetExhausted"))})
    report = BatchRunner(poller, FakeQueue(), safety_margin_ms=0, default_key="main").run(  # type: ignore[arg-type]
        {"Records": [record("job_1")]}, lambda: 30_000)
    emit_metrics(report)
    names = {n for n, _ in seen}
    assert {"Outcome_requeued", "UnknownStatus", "SumeStatusReads"} <= names
    assert {t for _, t in seen} == {threading.current_thread().name}
    # The per-key view: a message without a key counts for the default key.
    assert keyed == [({"main": {**dict.fromkeys(batch_module.KEY_METRICS, 0.0), "SumeReads": 1.0,
                                "BudgetExhausted": 1.0}}, threading.current_thread().name)]

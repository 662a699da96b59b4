"""Bad input (issue #5): fuzzed SQS messages and events, fuzzed Sume replies, hostile job ids.

Property-based (hypothesis, derandomized so CI is stable; ``max_examples`` moderate,
``deadline=None``): whatever arrives, each poll record ends as a clean batch item failure
(poison: SQS retries it, then the DLQ keeps it) or a clean drop, with a clear log line; no
exception escapes the handler; its neighbours in the batch are unaffected; and whatever Sume
answers, the poller ends the message cleanly and only sends poll messages that parse.

Sume replies the simulator cannot produce (absurd hints, huge numbers, deep nesting, odd
status codes and Retry-After headers) come from :class:`invariants.FakeSume`, a tiny local HTTP
server. Hostile job ids must be stopped before they reach a Redis key, a Sume URL or a DynamoDB
key: on the register path, in poll messages, in fan-out and in Sume's create replies.

Run: ``.venv/bin/python -m pytest tests/test_fuzz.py`` (more examples: ``SUME_FUZZ_EXAMPLES=1000``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from invariants import FIGURES, FakeSume, dlq_bodies, is_poison, record_figures, summary_line, write_figures

from sume_poller.jobs import JOB_ID_RE, TERMINAL_STATUSES, shard_of
from sume_poller.messages import MAX_BODY_BYTES, MessageError, PollMessage, parse_message
from sume_poller.sume import (
    MAX_RETRY_AFTER,
    Fatal,
    Pending,
    Retryable,
    SumeClient,
    Terminal,
    extract_job_ids,
    interpret_status,
    parse_retry_after,
)
from tools.localrun import LocalSystem

EXAMPLES = int(os.environ.get("SUME_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, print_blob=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large, HealthCheck.filter_too_much])
PURE = settings(max_examples=max(EXAMPLES, 500), deadline=None, derandomize=True)
FAR = 4_102_444_800


# -- strategies -------------------------------------------------------------------------------------------
huge_ints = st.integers(min_value=309, max_value=420).map(lambda n: int("9" * n))
numbers = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True), huge_ints,
                    st.sampled_from([0, 0.0, -0.0, 1e-9, 1e9, 1e13, 1e300, 2**40, 2**63]))
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=30))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=5)), max_leaves=15)
STATUSES = ["queued", "running", "processing", "pending", "completed", "Complete ", "succeeded", "success",
            "ready", "failed", "error", "errored", "canceled", "cancelled", "expired", "mystery", "", "  "]
status_values = st.one_of(st.sampled_from(STATUSES), st.text(max_size=80), json_values)
job_objects = st.fixed_dictionaries({"status": status_values}, optional={
    "id": st.text(max_size=20), "terminal": st.one_of(st.booleans(), json_values),
    "result_ready": st.one_of(st.booleans(), json_values), "next_poll_after_seconds": st.one_of(numbers, json_values),
    "error": st.one_of(json_values, st.fixed_dictionaries({}, optional={
        "code": st.one_of(st.text(max_size=400), st.integers(), st.booleans()), "message": st.text(max_size=400)})),
    "result_url": st.just("https://cdn.sume.example/signed/abc?sig=def"),
})
status_bodies = st.one_of(
    st.builds(lambda job, top: {"job": job, **top}, job_objects, st.dictionaries(
        st.sampled_from(["terminal", "result_ready", "next_poll_after_seconds", "request_id", "status"]),
        json_values, max_size=3)),
    job_objects,
    json_values,
)
HOSTILE_IDS = [
    "a" * 129, "a" * 5000, "jöb_1", "job 1", " job_1", "job_1 ", "../etc/passwd", "job/../../x", "..", ".",
    "job:1", "sume:poll:job_1", "{job_1}", "job_{1}", "job*", "*", "job?", "job\n1", "job_1\n", "job\r\n1",
    "job\x00", "\x00", "", "job\t1", "job%2F..", "job#1", "job\\1", "-job", "_job",
    "\uff4a\uff4f\uff42_1", "job_1\u200b", "job😀", "job\ud800", "job;rm -rf /",
    "job'1", 'job"1', "!auth-paused", "job!auth-paused", "JOB_\u0661",
]
hostile_ids = st.one_of(st.sampled_from(HOSTILE_IDS),
                        st.text(min_size=0, max_size=200).filter(lambda s: not JOB_ID_RE.fullmatch(s)))
FIELDS = ["v", "job_id", "kind", "deadline_at", "due_at", "token", "seq", "attempt", "errors"]


def valid_body(job_id: str = "job_fuzz_target", **changes: Any) -> dict[str, Any]:
    body = json.loads(PollMessage(job_id=job_id, kind="image", deadline_at=FAR, due_at=0).to_json())
    body.update(changes)
    return body


@st.composite
def mutated_messages(draw: st.DrawFn) -> str:
    body = valid_body()
    for name in draw(st.sets(st.sampled_from(FIELDS), max_size=3)):
        body.pop(name, None)
    replaced = draw(st.dictionaries(st.sampled_from([*FIELDS, "extra", "V", "job"]),
                                    st.one_of(json_values, hostile_ids), max_size=3))
    body.update(replaced)
    return json.dumps(body, ensure_ascii=draw(st.booleans()))


sqs_bodies = st.one_of(
    st.text(max_size=300),
    json_values.map(json.dumps),
    mutated_messages(),
    hostile_ids.map(lambda j: json.dumps(valid_body(j))),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.integers(1, 3000).map(lambda n: "[" * n + "]" * n),
    st.integers(MAX_BODY_BYTES - 200, MAX_BODY_BYTES + 200).map(lambda n: json.dumps(valid_body(pad="x" * n))),
    st.sampled_from(['{"v": 1}', "null", "[]", '""', "1e999", '{"v": true, "job_id": "job_1", "kind": "image", '
                     '"deadline_at": 1, "due_at": NaN}', json.dumps(valid_body(due_at=float("inf")))]),
)


# -- fixtures ---------------------------------------------------------------------------------------------------
class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._lock2 = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock2:
            self.records.append(record)

    def take(self) -> list[logging.LogRecord]:
        with self._lock2:
            out, self.records = self.records, []
        return out


@pytest.fixture
def logs(local_system: LocalSystem) -> Iterator[ListHandler]:
    """Every record of the project's logger (what Powertools writes as one JSON line each)."""
    from sume_poller.observability import logger
    handler = ListHandler()
    target = logging.getLogger(logger.name)
    target.addHandler(handler)
    yield handler
    target.removeHandler(handler)


@pytest.fixture(scope="module", autouse=True)
def figures(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    rows = [r for r in FIGURES if str(r["scenario"]).startswith(("5", "6"))]
    if not rows:
        return
    write_figures(rows)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("")
        reporter.write_line("fuzz-suite figures (.scratch/fault-figures.md):")
        for row in rows:
            reporter.write_line("  " + summary_line(row))


class RecordingQueue:
    """Stands in for the poll queue: keeps what the poller sends (and checks SQS's limits)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def send(self, body: str, delay_seconds: int) -> None:
        assert isinstance(delay_seconds, int) and 0 <= delay_seconds <= 900, delay_seconds
        with self._lock:
            self.sent.append((body, delay_seconds))

    def take(self) -> list[tuple[str, int]]:
        with self._lock:
            out, self.sent = self.sent, []
        return out


def record_extra(record: logging.LogRecord, name: str) -> Any:
    return record.__dict__.get(name)


# == 5a. SQS bodies ===============================================================================================
@pytest.mark.integration
@FUZZ
@given(body=sqs_bodies)
@example(body="not json")
@example(body=json.dumps(valid_body("job with spaces")))
@example(body=json.dumps(valid_body(seq=3)))  # seq without a token
@example(body=json.dumps(valid_body(token="A" * 32, seq=1)))  # token not lowercase hex
@example(body=json.dumps(valid_body(job_id="job_fuzz_unknown")))  # valid, but no such job: a clean drop
def test_fuzzed_sqs_bodies_fail_alone_with_a_clear_log_line(fsys: LocalSystem, logs: ListHandler, body: str) -> None:
    """One fuzzed record between two valid neighbours (one pending job that must be read and
    re-queued, one finished job whose duplicate must be dropped). Poison -> a batch item failure
    for that record only, with an ERROR "malformed poll message" naming its messageId; anything
    that parses -> a clean drop or a normal outcome, never an escaped exception."""
    from sume_poller import runtime
    from sume_poller.poller import handle_batch

    state = _fuzz_state(fsys)
    poller = state["poller"]
    job = "job_fz_" + uuid.uuid4().hex[:10]
    fsys.sim_seed("image", {"duration": 600}, job_id=job)
    assert runtime.job_store().put_pending(job, "image", FAR, runtime.settings().pending_shards)
    before, fuzzed, after = (f"n1-{uuid.uuid4().hex}", f"fz-{uuid.uuid4().hex}", f"n2-{uuid.uuid4().hex}")
    records = [
        {"messageId": before, "body": json.dumps(valid_body(job))},
        {"messageId": fuzzed, "body": body},
        {"messageId": after, "body": json.dumps(valid_body(state["done"]))},
    ]
    logs.take()
    state["outcomes"].clear()
    reply = handle_batch({"Records": records}, lambda: 30_000, poller)
    failures = {f["itemIdentifier"] for f in reply["batchItemFailures"]}
    seen = logs.take()
    outcomes = dict(state["outcomes"])
    sent = poller.queue.take()
    # neighbours: exactly as if alone
    assert before not in failures and after not in failures
    assert outcomes.get(job) == "requeued", outcomes
    assert outcomes.get(state["done"]) in ("duplicate", "contention"), outcomes
    assert [json.loads(b)["job_id"] for b, _ in sent].count(job) == 1
    assert all(parse_message(b) for b, _ in sent)
    poison = is_poison(body)
    state["counts"]["poison" if poison else "parsed"] += 1
    if poison:
        assert failures == {fuzzed}
        lines = [r for r in seen if r.getMessage() == "malformed poll message"]
        assert len(lines) == 1 and lines[0].levelname == "ERROR"
        assert record_extra(lines[0], "message_id") == fuzzed and record_extra(lines[0], "reason")
    else:
        msg = parse_message(body)
        assert fuzzed not in failures, "a parseable message failed its record"
        assert outcomes.get(msg.job_id) not in (None, "error"), outcomes
        assert not [r for r in seen if r.levelname == "ERROR" and "poll failed" in r.getMessage()]
    for r in seen:  # one JSON line per record, whatever the input contained
        assert "\n" not in _formatted(r)
    _release(job)
    counts = state["counts"]
    record_figures(scenario="5a fuzz: SQS bodies", examples=counts["poison"] + counts["parsed"],
                   poison_failed_alone=counts["poison"], parsed_and_dropped_or_processed=counts["parsed"],
                   escaped_exceptions=0, neighbours_affected=0)


_STATE: dict[str, Any] = {}


def _fuzz_state(system: LocalSystem) -> dict[str, Any]:
    """Per-test state shared by the examples: a poller with a recording queue, one finished job."""
    from sume_poller import runtime
    from sume_poller.poller import Poller

    key = (id(system), system.table)
    if _STATE.get("key") != key:
        _STATE.clear()
        _STATE["key"] = key
        done = "job_fz_done_" + uuid.uuid4().hex[:8]
        store = runtime.job_store()
        assert store.put_pending(done, "image", FAR, runtime.settings().pending_shards)
        assert store.record_terminal(done, "completed", sume_status="completed", error=None, result=None,
                                     attempts=1, shards=runtime.settings().pending_shards).won
        store.clear_outbox(done)
        outcomes: dict[str, str] = {}
        base = system.poller()
        poller = Poller(base.s, base.lease, base.sume, base.store, RecordingQueue(), base.bus)  # type: ignore[arg-type]
        original = poller.process

        def process(msg: PollMessage) -> Any:
            out = original(msg)
            outcomes[msg.job_id] = out.name
            return out

        poller.process = process  # type: ignore[method-assign]
        _STATE.update(done=done, poller=poller, outcomes=outcomes, counts={"poison": 0, "parsed": 0})
    return _STATE


def _release(job_id: str) -> None:
    from sume_poller import runtime
    runtime.redis_client().delete(runtime.lease_store().key(job_id))


def _formatted(record: logging.LogRecord) -> str:
    from sume_poller.observability import logger
    formatter = next(h.formatter for h in logger.handlers if h.formatter is not None)
    return formatter.format(record)


@pytest.mark.integration
@FUZZ
@given(records=st.lists(st.one_of(
    json_values,
    st.fixed_dictionaries({"messageId": st.one_of(st.text(max_size=20), json_values)},
                          optional={"body": st.one_of(sqs_bodies, json_values)}),
), max_size=6))
def test_fuzzed_sqs_events_never_raise(fsys: LocalSystem, records: list[Any]) -> None:
    """Whole events with odd records (not objects, no or odd messageId, non-string bodies): the
    handler returns a partial batch response naming only records it can name."""
    from sume_poller.poller import handle_batch

    poller = _fuzz_state(fsys)["poller"]
    reply = handle_batch({"Records": records}, lambda: 30_000, poller)
    named = {r["messageId"] for r in records if isinstance(r, dict) and isinstance(r.get("messageId"), str)
             and r["messageId"]}
    assert {f["itemIdentifier"] for f in reply["batchItemFailures"]} <= named
    poller.queue.take()


# == 5b. Sume replies ============================================================================================
def _check_status_outcome(out: object) -> None:
    assert isinstance(out, Pending | Terminal | Retryable | Fatal), out
    if isinstance(out, Pending | Terminal) and out.next_poll_after is not None:
        assert math.isfinite(out.next_poll_after) and out.next_poll_after >= 0
    if isinstance(out, Terminal):
        assert out.status in TERMINAL_STATUSES - {"timed_out"}
        assert out.error is None or all(isinstance(v, str) and len(v) <= 300 for v in out.error.values())
    if isinstance(out, Pending):
        assert isinstance(out.status, str) and len(out.status) <= 64


@PURE
@given(body=status_bodies)
@example(body={"job": {"status": "running", "next_poll_after_seconds": 1e13}})
def test_interpret_status_is_total(body: Any) -> None:
    """Any JSON Sume could send as a 200 status reply becomes an outcome (no exception), with a
    finite non-negative hint and a canonical terminal status."""
    parsed = json.loads(json.dumps(body))  # exactly what json.loads would give the client
    _check_status_outcome(interpret_status(parsed, "req_x"))


def test_bug_a_huge_integer_hint_escapes_interpret_status() -> None:
    """BUG: ``next_poll_after_seconds`` given as a JSON integer too large for a float (e.g. 400
    digits: valid JSON, json.loads accepts it) makes ``sume._number`` raise OverflowError, which
    escapes SumeClient.get_status and the poll: the message fails, is retried 5 times and lands in
    the DLQ although nothing is wrong with it. Patch: catch OverflowError in ``_number``."""
    body = json.loads('{"job": {"status": "running", "next_poll_after_seconds": 1' + "0" * 400 + "}}")
    _check_status_outcome(interpret_status(body))


@PURE
@given(value=st.one_of(st.none(), st.text(max_size=60), st.integers().map(str), st.floats().map(str),
                       st.datetimes().map(lambda d: d.strftime("%a, %d %b %Y %H:%M:%S GMT"))))
def test_parse_retry_after_is_total_and_capped(value: str | None) -> None:
    seconds = parse_retry_after(value, now=1_800_000_000)
    assert seconds is None or 0 <= seconds <= MAX_RETRY_AFTER


@PURE
@given(body=json_values)
def test_extract_job_ids_is_total(body: Any) -> None:
    ids = extract_job_ids(body)
    assert isinstance(ids, tuple) and all(isinstance(i, str) and i for i in ids)


STATUS_CODES = [200] * 8 + [201, 202, 204, 301, 302, 304, 400, 401, 402, 403, 404, 408, 409, 410, 418, 422, 425,
                            429, 500, 502, 503, 504, 599]
retry_after_values = st.one_of(st.integers(-5, 10**6).map(str), st.sampled_from(
    ["1", "0", "-1", "1.5", "nan", "inf", "1e999", "Wed, 21 Oct 2015 07:28:00 GMT",
     "Fri, 31 Dec 9999 23:59:59 GMT", "soon", ""]), st.text(alphabet=st.characters(
        min_codepoint=32, max_codepoint=126), max_size=30))
reply_bodies = st.one_of(
    status_bodies.map(lambda b: json.dumps(b).encode()),
    st.binary(max_size=300),
    st.integers(1, 50_000).map(lambda n: b"[" * n),
    st.sampled_from([b"", b"{", b"<html>502</html>", b"null", b'{"error": {"code": "x"}}', b"\xff\xfe\x00"]),
)
replies = st.tuples(st.sampled_from(STATUS_CODES), st.fixed_dictionaries({}, optional={
    "Retry-After": retry_after_values, "Content-Type": st.sampled_from(["application/json", "text/html"]),
    "Location": st.just("/api/v1/elsewhere"), "X-Request-Id": st.text(alphabet=st.characters(
        min_codepoint=33, max_codepoint=126), max_size=20)}), reply_bodies)


@pytest.fixture
def fake_sume() -> Iterator[FakeSume]:
    with FakeSume() as fake:
        yield fake


@pytest.mark.integration
@FUZZ
@given(reply=replies)
@example(reply=(200, {}, b'{"job": {"status": "running", "next_poll_after_seconds": 1e13}}'))
def test_poller_survives_any_sume_reply(fsys: LocalSystem, fake_sume: FakeSume, reply: tuple[int, dict[str, str],
                                                                                              bytes]) -> None:
    """Whatever Sume answers to a status read (any code, headers, body): the client returns an
    outcome without raising; the poll ends with a clean outcome (never "error", so never the
    DLQ); a transient reply is never failed; every message it sends parses; a terminal outcome is
    recorded once."""
    from sume_poller import runtime
    from sume_poller.poller import Poller

    status, headers, body = reply
    client = SumeClient(fake_sume.url, lambda: "k", connect_timeout=1, read_timeout=2)
    job = "job_fr_" + uuid.uuid4().hex[:10]
    fake_sume.replies = [(status, headers, body)]
    out = client.get_status(job)
    _check_status_outcome(out)
    if isinstance(out, Retryable) and out.retry_after is not None:
        assert 0 <= out.retry_after <= MAX_RETRY_AFTER

    store = runtime.job_store()
    assert store.put_pending(job, "image", FAR, runtime.settings().pending_shards)
    queue = RecordingQueue()
    poller = Poller(runtime.settings(), runtime.lease_store(), client, store, queue, runtime.event_bus())  # type: ignore[arg-type]
    result = (200, {}, json.dumps({"result": {"url": "https://cdn.sume.example/signed/x?sig=y"}}).encode())
    fake_sume.replies = [(status, headers, body), result]
    outcome = poller.process(parse_message(json.dumps(valid_body(job))))
    assert outcome.name != "error" and not outcome.failed
    if isinstance(out, Retryable):
        assert outcome.name == "transient"
    for sent_body, delay in queue.take():
        msg = parse_message(sent_body)  # never poison
        assert msg.job_id == job and 0 <= delay <= 900
    rec = store.get(job)
    assert rec is not None
    if outcome.name == "terminal":
        assert rec["status"] in TERMINAL_STATUSES and "pending_shard" not in rec
    else:
        assert rec["status"] == "pending"
    redis_client = runtime.redis_client()
    redis_client.delete(runtime.lease_store().key(job), runtime.lease_store().auth_pause_key)
    _REPLY_OUTCOMES[outcome.name] += 1
    record_figures(scenario="5b fuzz: Sume replies", examples=sum(_REPLY_OUTCOMES.values()),
                   outcomes=dict(sorted(_REPLY_OUTCOMES.items())), escaped_exceptions=0, poison_sent=0)


_REPLY_OUTCOMES: Counter[str] = Counter()


@pytest.mark.integration
def test_bug_deeply_nested_sume_reply_escapes_the_client(fsys: LocalSystem, fake_sume: FakeSume) -> None:
    """BUG: a status reply nested deeper than the interpreter's recursion limit (b"[" * 50000,
    under the 1 MB cap) makes ``json.loads`` raise RecursionError, which ``SumeClient._request``
    does not catch (only ValueError): get_status raises, the poll fails and the message goes to
    the DLQ after 5 receives although it is a transient garbage body. Patch: catch
    (ValueError, RecursionError)."""
    client = SumeClient(fake_sume.url, lambda: "k", connect_timeout=1, read_timeout=2)
    fake_sume.replies = [(200, {}, b"[" * 50_000)]
    out = client.get_status("job_deep")
    assert isinstance(out, Retryable) and out.reason == "malformed_body"


@pytest.mark.integration
def test_a_huge_sume_hint_never_makes_the_next_poll_message_poison(fsys: LocalSystem, fake_sume: FakeSume) -> None:
    """Regression (found by this suite, fixed in df14ae9): Sume's ``next_poll_after_seconds`` of
    1e13 s used to give the re-queued message a ``due_at`` >= 2**40, which ``parse_message``
    rejects: the chain's own next message was poison (DLQ after 5 receives). The wait is now
    capped at the job's deadline, so the next message always parses."""
    from sume_poller import runtime
    from sume_poller.poller import Poller

    client = SumeClient(fake_sume.url, lambda: "k", connect_timeout=1, read_timeout=2)
    fake_sume.default = (200, {}, b'{"job": {"status": "running", "next_poll_after_seconds": 1e13}}')
    job = "job_hint_" + uuid.uuid4().hex[:8]
    assert runtime.job_store().put_pending(job, "image", FAR, runtime.settings().pending_shards)
    queue = RecordingQueue()
    poller = Poller(runtime.settings(), runtime.lease_store(), client, runtime.job_store(), queue,  # type: ignore[arg-type]
                    runtime.event_bus())
    assert poller.process(parse_message(json.dumps(valid_body(job)))).name == "requeued"
    (body, delay), = queue.take()
    assert delay == 900
    assert parse_message(body).due_at <= FAR + 1  # capped at the deadline (rounded up)


# == 6. hostile job ids =============================================================================================
@pytest.mark.integration
def test_hostile_job_ids_never_reach_redis_sume_or_dynamodb(fsys: LocalSystem, logs: ListHandler,
                                                            rdb: redis.Redis, fake_sume: FakeSume) -> None:
    """Hostile ids (too long, unicode, spaces, ``../``, ':' '{' '}' '*', newlines, NUL, ...) are
    rejected on the register path, fail as poison in poll messages (and end in the DLQ), are
    skipped by fan-out when a record carrying one is put straight into the table, and are
    dropped (loudly) when Sume's create reply contains one. None reaches a Redis key, a Sume URL
    (the simulator saw no read at all) or a DynamoDB key we wrote."""
    from botocore.exceptions import ClientError

    from sume_poller import runtime
    from sume_poller.submit import handle_submit

    ids = list(dict.fromkeys(HOSTILE_IDS))
    # register path
    for job_id in ids:
        reply = fsys.invoke("SubmitFunction", {"kind": "image", "job_id": job_id})
        assert reply["status"] == "rejected", (job_id, reply)
    for bad in (None, 7, ["job_1"], {"id": "job_1"}, True):
        assert fsys.invoke("SubmitFunction", {"kind": "image", "job_id": bad})["status"] == "rejected"
    assert fsys.queue_depth() == 0 and fsys.pending_count() == 0
    # Sume's create reply carries a hostile id: dropped loudly, nothing recorded
    store = runtime.job_store()
    client = SumeClient(fake_sume.url, lambda: "k", connect_timeout=1, read_timeout=2)
    settings_ = runtime.settings()
    dropped_creates = 0
    for job_id in [i for i in ids if i]:  # ("" is no id at all: a create reply without one is retried)
        fake_sume.replies = [(201, {}, json.dumps({"job": {"id": job_id}}).encode())]
        reply = handle_submit({"kind": "image", "params": {"p": job_id[:10]}}, settings_, client, store,
                              runtime.poll_queue(), lambda: 30_000, sleep=lambda _s: None)
        assert reply["status"] == "rejected" and reply["job_ids"] == [], reply
        dropped_creates += 1
    assert len([r for r in logs.records if "cannot store" in r.getMessage() and r.levelname == "ERROR"]) \
        == dropped_creates
    # fan-out: records with hostile ids put straight into the table
    inserted = []
    for job_id in ids:
        try:
            fsys.ddb.put_item(TableName=fsys.table, Item={
                "job_id": {"S": job_id}, "kind": {"S": "image"}, "status": {"S": "pending"},
                "pending_shard": {"S": shard_of(job_id, settings_.pending_shards)},
                "deadline_at": {"N": str(FAR)}})
            inserted.append(job_id)
        except (ClientError, UnicodeEncodeError, ValueError):
            continue  # DynamoDB itself refuses it (empty, > 2048 bytes, not UTF-8)
    report = fsys.fanout()
    assert report["skipped_invalid"] == len(inserted) and report["sent"] == 0, report
    # poll messages: poison, each fails alone, then the DLQ
    for job_id in ids:
        fsys.send(json.dumps(valid_body(job_id)))
    fsys.run_until(lambda: fsys.queue_depth(fsys.dlq_url) >= len(ids), timeout=120)
    bodies = dlq_bodies(fsys)
    assert len(bodies) == len(ids) and all(is_poison(b) for b in bodies)
    # nothing reached Redis, Sume or our keys
    prefix = runtime.settings().lease_key_prefix
    for key in rdb.keys("*"):
        assert key == runtime.lease_store().auth_pause_key or (
            key.startswith(prefix) and JOB_ID_RE.fullmatch(key[len(prefix):])), key
    stats = fsys.sim_stats()
    assert stats["status_reads"] == 0 and stats["result_reads"] == 0 and stats["jobs"] == {}
    items = fsys.ddb.scan(TableName=fsys.table)["Items"]
    assert sorted(i["job_id"]["S"] for i in items) == sorted(inserted)
    assert fake_sume.requests and not [p for _m, p, _h in fake_sume.requests if "/jobs" in p]
    for r in logs.records:
        assert "\n" not in _formatted(r) and "\x00" not in _formatted(r)
    record_figures(scenario="6 hostile job ids", ids=len(ids), register_rejected=len(ids),
                   create_replies_dropped=dropped_creates, fanout_skipped=len(inserted),
                   poll_messages_to_dlq=len(bodies), redis_keys_with_bad_id=0, sume_reads=0)


@pytest.mark.integration
@FUZZ
@given(job_id=hostile_ids)
def test_fuzzed_hostile_ids_are_rejected_everywhere(fsys: LocalSystem, rdb: redis.Redis, job_id: str) -> None:
    """Generated ids outside ``[A-Za-z0-9][A-Za-z0-9_-]{0,127}``: rejected by submit, poison as a
    poll message (its record fails alone), never a Redis key or a Sume read."""
    from sume_poller.poller import handle_batch

    assert fsys.invoke("SubmitFunction", {"kind": "image", "job_id": job_id})["status"] == "rejected"
    with pytest.raises(MessageError):
        parse_message(json.dumps(valid_body(job_id)))
    poller = _fuzz_state(fsys)["poller"]
    reply = handle_batch({"Records": [{"messageId": "m1", "body": json.dumps(valid_body(job_id))}]},
                         lambda: 30_000, poller)
    assert reply["batchItemFailures"] == [{"itemIdentifier": "m1"}]
    assert not [k for k in rdb.keys("*") if job_id and job_id in k[len("sume:poll:"):]]
    assert fsys.sim_stats()["status_reads"] == 0


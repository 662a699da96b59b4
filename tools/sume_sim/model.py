"""The simulator's model: Sume's behaviour without sockets or an HTTP server.

:class:`Model` holds the jobs, the per-key budgets, idempotency records, counters and webhook
plans behind one lock (jobs, idempotency keys and counters per workspace: the workspace of the API
key that called), and answers each public call with a :class:`Reply` (status, JSON body,
headers, an optional delay); :mod:`tools.sume_sim.http` only routes and renders. All time is the
injected clock's (clock seconds), so unit tests drive it with a fake wall clock.
"""

from __future__ import annotations

import dataclasses
import heapq
import hmac
import json
import random
import secrets
import threading
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from hashlib import sha256
from typing import Any, Protocol

from tools.sume_sim import listing
from tools.sume_sim.budget import Admission, BudgetBook, RateView
from tools.sume_sim.config import (
    LIST_FAULT_OK,
    MAX_WORKSPACE_CHARS,
    Account,
    Budget,
    Config,
    updated,
    with_key_added,
    with_key_removed,
    with_key_rotated,
)
from tools.sume_sim.spec import DEFAULT_DURATION, DEFAULT_WORKSPACE, JobSpec, SpecError, parse_spec
from tools.sume_sim.timeline import Job, iso

READS, CREATES = "reads", "creates"
#: The truncated body of a ``malformed`` list fault.
MALFORMED_LIST = b'{"jobs": [{"id": "job_'

ERROR_CODES: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    402: "insufficient_credits",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    429: "rate_limit_exceeded",
}
MAX_IDEMPOTENCY_KEYS = 20_000
MAX_UNKNOWN_IDS = 1_000
RECENT_DELIVERIES = 200


class ClockLike(Protocol):
    scale: float

    def now(self) -> float: ...


def new_request_id() -> str:
    return "req_" + secrets.token_hex(8)


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """``X-Sume-Signature``: ``v1=`` + hex HMAC-SHA256 of ``"{timestamp}.{raw body}"``."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, sha256).hexdigest()
    return f"v1={digest}"


@dataclass(frozen=True)
class Request:
    """Who calls: the API keys the request presented (bearer and/or ``X-Api-Key``)."""

    api_keys: tuple[str, ...] = ()
    request_id: str = field(default_factory=new_request_id)
    idempotency_key: str | None = None


@dataclass(frozen=True)
class Reply:
    """One public API answer. ``body`` is a JSON value unless ``raw`` (a deliberately broken body)."""

    status: int
    body: Any
    request_id: str
    headers: tuple[tuple[str, str], ...] = ()
    raw: bytes | None = None
    content_type: str = "application/json"
    delay: float = 0.0  # real seconds to wait before answering

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


class _Answer:
    """Builds the replies of one request: its request id and rate-limit headers on every one."""

    def __init__(self, request_id: str, rate: RateView | None) -> None:
        self.request_id = request_id
        self.headers = tuple(rate.headers()) if rate is not None else ()

    def value(self, status: int, body: Any, *, delay: float = 0.0) -> Reply:
        """A reply whose body is ``body`` as is (a list or string carries no request id)."""
        return Reply(status, body, self.request_id, self.headers, delay=delay)

    def json(self, status: int, payload: dict[str, Any], *, delay: float = 0.0) -> Reply:
        return self.value(status, {**payload, "request_id": self.request_id}, delay=delay)

    def error(self, status: int, code: str, message: str, details: dict[str, Any] | None = None,
              retry_after: int | str | None = None) -> Reply:
        body = {"error": {"code": code, "message": message, "details": details or {}}, "request_id": self.request_id}
        extra = (("Retry-After", str(retry_after)),) if retry_after is not None else ()
        return Reply(status, body, self.request_id, self.headers + extra)

    def fault(self, fault: str, job_id: str, *, malformed: bytes | None = None) -> Reply:
        """An injected fault (anything but ``slow:``); ``malformed`` replaces the truncated job body."""
        if fault == "malformed":
            return self._raw(malformed or ('{"job": {"id": "' + job_id + '", "status": "runn').encode())
        if fault == "html":
            page = b"<!DOCTYPE html><html><head><title>Bad Gateway</title></head><body>502</body></html>"
            return self._raw(page, "text/html; charset=utf-8")
        if fault == "empty":
            return self._raw(b"")
        if fault.startswith("proxy:"):  # a gateway or proxy in front of Sume answers: its page, none of Sume's
            status = int(fault.partition(":")[2])
            page = f"<html><head><title>{status}</title></head><body><center><h1>{status}</h1></center></body></html>"
            return Reply(status, None, self.request_id, (), raw=page.encode(), content_type="text/html")
        code_text, _, retry = fault.partition(":")
        status = int(code_text)
        code = ERROR_CODES.get(status, "internal_error" if status >= 500 else "error")
        retry_after = retry or (1 if status == 429 else None)
        return self.error(status, code, f"simulated {status} fault", retry_after=retry_after)

    def _raw(self, body: bytes, content_type: str = "application/json") -> Reply:
        return Reply(200, None, self.request_id, self.headers, raw=body, content_type=content_type)


@dataclass(frozen=True)
class WebhookPlan:
    """One planned event delivery, fixed (with its random fates) when the job is created."""

    due: float  # clock time
    event_id: str
    job_id: str
    url: str
    body: bytes
    lost: bool
    duplicate: bool
    bad_signature: bool
    workspace: str = DEFAULT_WORKSPACE  # signed with this workspace's key's webhook secret


@dataclass(frozen=True)
class Delivery:
    """A due delivery, ready to POST: ``copies`` times the same body and headers."""

    plan: WebhookPlan
    headers: dict[str, str]
    copies: int
    generation: int


def _slow_ms(fault: str | None) -> float:
    return int(fault.partition(":")[2]) / 1000.0 if fault is not None and fault.startswith("slow:") else 0.0


@dataclass
class _Read:
    """A job read past its gates (or stopped by one: ``refusal``)."""

    answer: _Answer
    now: float
    job: Job | None = None
    refusal: Reply | None = None


def _workspace_counters() -> dict[str, Any]:
    """One workspace's share of the counters (``stats()["keys"]``)."""
    return {"reads": {"attempts": 0, "served": 0, "rate_limited": 0},
            "creates": {"attempts": 0, "served": 0, "rate_limited": 0},
            "jobs_created": 0, "replays": 0, "forbidden": 0}


class Model:
    """Sume's behaviour behind one lock; every public method is thread-safe."""

    def __init__(self, clock: ClockLike, config: Config | None = None, *, max_jobs: int = 20_000) -> None:
        base = config or Config(time_scale=clock.scale)
        if abs(base.time_scale - clock.scale) > 1e-12:
            raise ValueError(f"config time_scale {base.time_scale} differs from the clock's {clock.scale}")
        self.clock = clock
        self.max_jobs = max_jobs
        self._initial = base
        self._lock = threading.RLock()
        self._generation = 0
        self._reset_locked()

    # ------------------------------------------------------------------ control

    def reset(self) -> None:
        """Clear jobs, counters, budgets, idempotency keys and webhooks; restore the start config."""
        with self._lock:
            self._reset_locked()

    def _reset_locked(self) -> None:
        self._set_config(self._initial)
        self._rng = random.Random(self._config.seed)
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._unknown_reads: OrderedDict[str, dict[str, int]] = OrderedDict()
        self._idempotency: OrderedDict[tuple[str, str], Reply] = OrderedDict()  # (workspace, key) -> reply
        self._create_attempts: dict[tuple[str, str], int] = {}
        self._workspaces: dict[str, dict[str, Any]] = {}  # workspace -> its counters
        self._list_fault_cursor = 0  # list faults consumed under the current list mode
        self._books: dict[tuple[str, str], BudgetBook] = {}
        self._plans: list[tuple[float, int, WebhookPlan]] = []
        self._plan_seq = 0
        self._generation += 1
        self._deliveries: deque[dict[str, Any]] = deque(maxlen=RECENT_DELIVERIES)
        self._hooks: dict[str, Any] = {"planned": 0, "sent": 0, "lost": 0, "duplicated": 0, "bad_signature": 0,
                                       "statuses": {}}
        self._counters = dict.fromkeys(
            ("status_reads", "result_reads", "list_reads", "creates", "jobs_created", "create_requests", "replays",
             "insufficient_credits", "unauthorized", "forbidden", "rate_limited"), 0)

    def _set_config(self, config: Config) -> None:
        self._config = config
        accounts = config.accounts()
        self._accounts = {account.key: account for account in accounts}
        self._by_workspace = {account.workspace: account for account in accounts}

    @property
    def config(self) -> Config:
        with self._lock:
            return self._config

    def configure(self, **changes: Any) -> dict[str, Any]:
        """Apply validated config changes; return the whole config."""
        with self._lock:
            self._set_config(updated(self._config, changes))
            if "list" in changes:
                self._list_fault_cursor = 0  # a new list mode's faults start from the first
            if "seed" in changes:
                self._rng = random.Random(self._config.seed)
            return self._config.to_dict()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            now = self.clock.now()
            jobs: dict[str, Any] = {
                job.id: {"status_reads": job.status_reads, "result_reads": job.result_reads,
                         "min_reads": job.min_reads(self._readiness_shown(job)), "status": job.state(now).status,
                         "status_reads_after_terminal": job.status_reads_after_terminal,
                         "first_read_age": None if job.first_read is None else job.first_read - job.created,
                         "first_any_read_age": None if job.first_any_read is None else job.first_any_read - job.created}
                for job in self._jobs.values()
            }
            for job_id, reads in self._unknown_reads.items():
                jobs.setdefault(job_id, {**reads, "min_reads": None, "status": None})
            faults = self._config.listing.faults
            return {**self._counters, "list_faults_remaining": list(faults[self._list_fault_cursor:]), "jobs": jobs,
                    "webhooks": self._webhook_summary(), "keys": self._key_stats()}

    def _key_stats(self) -> dict[str, Any]:
        """Per workspace (every one with a key now or with counts): its key's label, limits, counters."""
        names = [*self._by_workspace, *(w for w in self._workspaces if w not in self._by_workspace)]
        stats: dict[str, Any] = {}
        for workspace in names:
            account = self._by_workspace.get(workspace)
            counters = self._workspaces.get(workspace) or _workspace_counters()
            stats[workspace] = {
                "key": None if account is None else account.label,
                "read_budget": None if account is None else account.read_budget.to_dict(),
                "create_budget": None if account is None else account.create_budget.to_dict(),
                **{name: dict(value) if isinstance(value, dict) else value for name, value in counters.items()},
            }
        return stats

    def job_info(self, job_id: str) -> dict[str, Any] | None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return None
            state = job.state(self.clock.now())
            return {
                "id": job.id, "kind": job.kind, "type": job.sume_type, "workspace": job.workspace,
                "created_clock": job.created, "status": state.status,
                "terminal": state.terminal, "result_ready": state.result_ready,
                "status_reads": job.status_reads, "result_reads": job.result_reads,
                "min_reads": job.min_reads(self._readiness_shown(job)),
                "status_reads_after_terminal": job.status_reads_after_terminal,
                "terminal_status": job.spec.outcome,
                "faults_remaining": list(job.spec.faults[job.fault_cursor:]),
                "result_faults_remaining": list(job.spec.result_faults[job.result_fault_cursor:]),
                "created_at": iso(job.created), "terminal_at": iso(job.terminal_at),
                "not_found_for": job.not_found_for, "webhook_url": job.webhook_url, "spec": job.spec.to_dict(),
            }

    def unknown_reads(self, job_id: str) -> dict[str, int]:
        """Reads of an id that was never created."""
        with self._lock:
            return dict(self._unknown_reads.get(job_id, {"status_reads": 0, "result_reads": 0}))

    def seed_job(self, kind: str = "image", sim: dict[str, Any] | None = None, job_id: str | None = None,
                 age: float = 0.0, webhook_url: str | None = None, *, key: str | None = None,
                 workspace: str | None = None) -> str:
        """Create a job directly (no billing, no budget), as if created ``age`` clock seconds ago, in
        the workspace of API key ``key``, or in ``workspace``, or else in the default workspace."""
        if kind not in DEFAULT_DURATION:
            raise SpecError(f"kind must be one of {', '.join(DEFAULT_DURATION)}", "kind")
        if job_id is not None and (not isinstance(job_id, str) or not job_id or "/" in job_id):
            raise SpecError("id must be a non-empty string without '/'", "id")
        if isinstance(age, bool) or not isinstance(age, int | float) or age < 0:
            raise SpecError("age must be a number >= 0", "age")
        if workspace is not None and (not isinstance(workspace, str) or not workspace.strip()
                                      or len(workspace) > MAX_WORKSPACE_CHARS):
            raise SpecError(f"workspace must be a non-empty string of at most {MAX_WORKSPACE_CHARS} characters",
                            "workspace")
        if key is not None and workspace is not None:
            raise SpecError("give key or workspace, not both", "workspace")
        spec = parse_spec(kind, sim)
        with self._lock:
            if key is not None:
                account = self._accounts.get(key) if isinstance(key, str) else None
                if account is None:
                    raise SpecError("key is not a configured API key", "key")
                workspace = account.workspace
            url = self._webhook_url(kind, webhook_url)
            if job_id is not None and job_id in self._jobs:
                raise SpecError(f"job {job_id} already exists", "id")
            created = self.clock.now() - float(age)
            return self._new_job(kind, spec, job_id, created, url, workspace or DEFAULT_WORKSPACE).id

    def budget_stats(self) -> dict[str, Any]:
        """Per class and window size, the kept windows of the top-level ``api_key`` (see :mod:`.budget`);
        under ``keys``, the same per workspace for every configured key."""
        with self._lock:
            now = self.clock.now()
            default = self._config.api_key
            stats: dict[str, Any] = {cls: self._history(default, cls, now) for cls in (READS, CREATES)}
            stats["keys"] = {account.workspace: {cls: self._history(account.key, cls, now) for cls in (READS, CREATES)}
                             for account in self._accounts.values()}
            return stats

    def _history(self, key: str | None, cls: str, now: float) -> dict[str, list[dict[str, Any]]]:
        share = self._config.other_consumer_share if cls == READS else 0.0
        book = BudgetBook() if key is None else self._book(key, cls)
        return book.history(now, share)

    # ------------------------------------------------------------------ API keys

    def add_key(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        """Add a key: ``entry`` is a ``keys`` entry plus ``key``. Returns its workspace and label."""
        with self._lock:
            config = with_key_added(self._config, dict(entry) if isinstance(entry, Mapping) else entry)
            self._set_config(config)
            return self._key_answer(config.keys[-1][0])

    def rotate_key(self, old: str, new: str) -> dict[str, Any]:
        """Key ``new`` takes over ``old``'s workspace, limits and budget windows; ``old`` answers 401."""
        with self._lock:
            self._set_config(with_key_rotated(self._config, old, new))
            for cls in (READS, CREATES):
                book = self._books.pop((old, cls), None)
                if book is not None:
                    self._books[(new, cls)] = book
            return self._key_answer(new)

    def remove_key(self, key: str) -> dict[str, Any]:
        """Remove a key: it answers 401 from now on; its workspace's jobs and counters stay."""
        with self._lock:
            config = with_key_removed(self._config, key)
            answer = self._key_answer(key)
            self._set_config(config)
            for cls in (READS, CREATES):
                self._books.pop((key, cls), None)
            return answer

    def _key_answer(self, key: str) -> dict[str, Any]:
        account = self._accounts[key]
        return {"workspace": account.workspace, "key": account.label}

    def webhook_stats(self) -> dict[str, Any]:
        with self._lock:
            return {**self._webhook_summary(), "deliveries": list(self._deliveries)}

    def latency_seconds(self) -> float:
        with self._lock:
            return self._config.latency_ms / 1000.0

    # ------------------------------------------------------------------ public API

    def create(self, req: Request, kind: str, body: bytes) -> Reply:
        """``POST`` of a create route: a paid job (or several), idempotent per ``Idempotency-Key``."""
        with self._lock:
            now = self.clock.now()
            account, answer, refusal = self._admit(req, CREATES, "create_requests", now)
            if refusal is not None:
                return refusal
            assert account is not None
            spec, url, error = self._parse_create(kind, body)
            fault = self._create_fault(req, spec, account.workspace)
            if fault is not None and not fault.startswith("slow:"):
                return answer.fault(fault, "")
            key = None if req.idempotency_key is None else (account.workspace, req.idempotency_key)
            if key is not None and key in self._idempotency:
                self._counters["replays"] += 1
                self._workspace(account.workspace)["replays"] += 1
                self._idempotency.move_to_end(key)
                stored = self._idempotency[key]
                return dataclasses.replace(stored, headers=(*answer.headers, ("Idempotent-Replayed", "true")))
            if spec is None:
                assert error is not None
                details = {"field": error.field_name} if error.field_name else {}
                return answer.error(400, "bad_request", str(error), details)
            reply = self._start(answer, kind, spec, url, now, account.workspace)
            if key is not None:
                self._idempotency[key] = reply
                while len(self._idempotency) > MAX_IDEMPOTENCY_KEYS:
                    self._idempotency.popitem(last=False)
            return dataclasses.replace(reply, delay=_slow_ms(fault))

    def read_status(self, req: Request, job_id: str) -> Reply:
        """``GET /jobs/{id}``."""
        with self._lock:
            read = self._open_read(req, job_id, "status_reads")
            if read.refusal is not None:
                return read.refusal
            job = read.job
            assert job is not None
            fault = job.take_fault() or self._random_fault()
            if fault is not None and not fault.startswith("slow:"):
                return read.answer.fault(fault, job_id)
            hints = self._hints(job)
            override = job.take_override()
            view = job.view(read.now, hints=hints, exact=self._config.exact_hints, override=override)
            state = job.state(read.now)
            if override is None and state.terminal and (
                    not state.success or state.result_ready or not self._readiness_shown(job)):
                job.terminal_served = True  # later status reads are "after terminal"
            return read.answer.json(200, {"job": view}, delay=_slow_ms(fault))

    def read_result(self, req: Request, job_id: str) -> Reply:
        """``GET /jobs/{id}/result``: 200 in the job's result shape once ready; while a result may still
        come (active, or completed and not ready) the job's or config's ``result_not_ready`` status
        (404 ``not_found``, 409 or 425 ``result_not_ready``); 409 for a job that never has one."""
        with self._lock:
            read = self._open_read(req, job_id, "result_reads")
            if read.refusal is not None:
                return read.refusal
            job = read.job
            assert job is not None
            fault = job.take_result_fault()
            if fault is not None and not fault.startswith("slow:"):
                return read.answer.fault(fault, job_id)
            state = job.state(read.now)
            if not (state.success and state.result_ready):
                details = {"status": state.status, "terminal": state.terminal}
                status = 409
                if state.success or not state.terminal:
                    status = job.spec.result_not_ready or self._config.result_not_ready
                code = "not_found" if status == 404 else "result_not_ready"
                return read.answer.error(status, code, f"result of job {job_id} is not available", details)
            return read.answer.value(200, job.result_body(read.answer.request_id), delay=_slow_ms(fault))

    def list_jobs(self, req: Request, query: Mapping[str, list[str]]) -> Reply:
        """``GET /jobs?limit=&cursor=&type=&status=``, in the configured list mode."""
        with self._lock:
            now = self.clock.now()
            account, answer, refusal = self._admit(req, READS, "list_reads", now)
            if refusal is not None:
                return refusal
            assert account is not None
            mode = self._config.listing
            if mode.route != "ok":
                return self._list_route_refusal(answer, mode.route)
            fault = self._take_list_fault()
            if fault is not None and not fault.startswith("slow:"):
                return answer.fault(fault, "", malformed=MALFORMED_LIST)
            try:
                parsed = listing.parse_query(query, mode)
            except SpecError as exc:
                return answer.error(400, "bad_request", str(exc), {"field": exc.field_name})
            page = listing.page(self._jobs.values(), now, mode, parsed, account.workspace)
            return answer.json(200, page, delay=_slow_ms(fault))

    def refuse(self, req: Request, status: int, message: str) -> Reply:
        """An unknown route or method under the API prefix (after the key checks)."""
        with self._lock:
            now = self.clock.now()
            account, denied = self._authorise(req, READS, now)
            if account is None:
                assert denied is not None
                return denied
            return _Answer(req.request_id, self._peek(account, READS, now)).error(status, ERROR_CODES[status], message)

    # ------------------------------------------------------------------ webhooks

    def take_due_webhooks(self) -> list[Delivery]:
        """Pop the deliveries due now; lost ones are only counted. Headers are signed now."""
        with self._lock:
            now = self.clock.now()
            due: list[Delivery] = []
            while self._plans and self._plans[0][0] <= now:
                plan = heapq.heappop(self._plans)[2]
                if plan.lost:
                    self._hooks["lost"] += 1
                    self._deliveries.append({"event_id": plan.event_id, "job_id": plan.job_id, "lost": True})
                    continue
                due.append(Delivery(plan, self.webhook_headers(plan, int(now)), 2 if plan.duplicate else 1,
                                    self._generation))
            return due

    def webhook_headers(self, plan: WebhookPlan, timestamp: int) -> dict[str, str]:
        """Headers of one delivery, signed with the secret of the job's workspace's key (the top-level
        ``webhooks.secret`` when the workspace has no key)."""
        account = self._by_workspace.get(plan.workspace)
        secret = self._config.webhooks.secret if account is None else account.webhook_secret
        key = secret + ".wrong" if plan.bad_signature else secret
        return {
            "Content-Type": "application/json",
            "X-Sume-Event-Id": plan.event_id,
            "X-Sume-Timestamp": str(timestamp),
            "X-Sume-Signature": sign(key, timestamp, plan.body),
        }

    def next_webhook_due(self) -> float | None:
        with self._lock:
            return self._plans[0][0] if self._plans else None

    def record_delivery(self, delivery: Delivery, outcomes: list[int | str]) -> None:
        """Record what the receiver answered (an HTTP status or an error name) to each copy."""
        with self._lock:
            if delivery.generation != self._generation:
                return  # planned before a reset
            plan = delivery.plan
            self._hooks["sent"] += len(outcomes)
            self._hooks["duplicated"] += int(plan.duplicate)
            self._hooks["bad_signature"] += int(plan.bad_signature)
            for outcome in outcomes:
                self._hooks["statuses"][str(outcome)] = self._hooks["statuses"].get(str(outcome), 0) + 1
            self._deliveries.append({
                "event_id": plan.event_id, "job_id": plan.job_id, "due": plan.due, "sent_at": self.clock.now(),
                "copies": delivery.copies, "bad_signature": plan.bad_signature, "statuses": list(outcomes),
            })

    def _webhook_summary(self) -> dict[str, Any]:
        return {**self._hooks, "statuses": dict(self._hooks["statuses"]), "pending": len(self._plans)}

    def _plan_webhook(self, job: Job) -> None:
        event = job.webhook_event()
        if job.webhook_url is None or event is None:
            return
        suffix, at = event
        hooks = self._config.webhooks
        lost, duplicate, bad = (self._rng.random() < p for p in (hooks.loss, hooks.duplicate, hooks.bad_signature))
        event_id = "evt_" + secrets.token_hex(12)
        body = json.dumps({
            "id": event_id, "type": f"{job.sume_type}.{suffix}", "created_at": iso(at),
            "data": {"job_id": job.id, "status": job.spec.outcome, "type": job.sume_type},
        }, separators=(",", ":")).encode()
        plan = WebhookPlan(at + hooks.delay, event_id, job.id, job.webhook_url, body, lost, duplicate, bad,
                           workspace=job.workspace)
        self._plan_seq += 1
        heapq.heappush(self._plans, (plan.due, self._plan_seq, plan))
        self._hooks["planned"] += 1

    def _webhook_url(self, kind: str, url: Any) -> str | None:
        if url is None:
            return None
        if kind not in self._config.webhooks.kinds:
            raise SpecError(f"webhook_url is not supported for {kind} jobs", "webhook_url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise SpecError("webhook_url must be an http(s) URL", "webhook_url")
        return url

    # ------------------------------------------------------------------ internals

    def _book(self, key: str, cls: str) -> BudgetBook:
        return self._books.setdefault((key, cls), BudgetBook())

    def _budget_args(self, account: Account, cls: str) -> tuple[Budget, float]:
        if cls == READS:
            return account.read_budget, self._config.other_consumer_share
        return account.create_budget, 0.0

    def _workspace(self, workspace: str) -> dict[str, Any]:
        return self._workspaces.setdefault(workspace, _workspace_counters())

    def _spend(self, account: Account, cls: str, now: float) -> Admission:
        """Charge one attempt to ``account``'s book of ``cls``."""
        budget, share = self._budget_args(account, cls)
        admission = self._book(account.key, cls).admit(now, budget, share, self._config.budget_windows)
        counters = self._workspace(account.workspace)[cls]
        counters["attempts"] += 1
        counters["served" if admission.allowed else "rate_limited"] += 1
        if not admission.allowed:
            self._counters["rate_limited"] += 1
        return admission

    def _peek(self, account: Account | None, cls: str, now: float) -> RateView | None:
        if account is None:
            return None
        budget, share = self._budget_args(account, cls)
        return self._book(account.key, cls).peek(now, budget, share, self._config.budget_windows)

    def _authorise(self, req: Request, cls: str, now: float) -> tuple[Account | None, Reply | None]:
        """(the account of the first configured key the request presents, None), or (None, a 401 for no
        such key or a 403 when the key's workspace is refused)."""
        account = next((self._accounts[k] for k in req.api_keys if k in self._accounts), None)
        if account is not None and not self._config.key_forbidden:
            return account, None
        if account is None:
            # A 401 reports the default key's budget view, as before there were several keys.
            default = None if self._config.api_key is None else self._accounts.get(self._config.api_key)
            self._counters["unauthorized"] += 1
            answer = _Answer(req.request_id, self._peek(default, cls, now))
            return None, answer.error(401, "unauthorized", "missing or invalid API key")
        self._counters["forbidden"] += 1
        self._workspace(account.workspace)["forbidden"] += 1
        answer = _Answer(req.request_id, self._peek(account, cls, now))
        return None, answer.error(403, "forbidden", "this API key's workspace may not use this API")

    def _admit(self, req: Request, cls: str, counter: str, now: float) -> tuple[Account | None, _Answer, Reply | None]:
        """The key checks, then ``counter`` and the key's ``cls`` budget: (account, its answer, None)
        when the request may go on; else the refusal third (a 401/403 with no account, or a 429)."""
        account, denied = self._authorise(req, cls, now)
        if account is None:
            return None, _Answer(req.request_id, None), denied
        self._counters[counter] += 1
        admission = self._spend(account, cls, now)
        answer = _Answer(req.request_id, admission.rate)
        if admission.allowed:
            return account, answer, None
        return account, answer, answer.error(429, "rate_limit_exceeded", "rate limit exceeded",
                                             retry_after=admission.retry_after)

    def _open_read(self, req: Request, job_id: str, counter: str) -> _Read:
        """Gate a job read: key checks, budget, unknown id, read-after-create lag, foreign job (a
        ``forbidden`` one, or one of another workspace than the caller's: not counted on the job)."""
        now = self.clock.now()
        account, answer, refusal = self._admit(req, READS, counter, now)
        if account is None:
            return _Read(answer, now, refusal=refusal)
        read = _Read(answer, now, self._jobs.get(job_id))
        other_workspace = read.job is not None and read.job.workspace != account.workspace
        if not other_workspace:
            self._count_job_read(read.job, job_id, counter, now)
        if refusal is not None:
            read.refusal = refusal
        elif read.job is None or now < read.job.visible_at:
            read.refusal = read.answer.error(404, "not_found", f"job {job_id} not found")
        elif read.job.spec.forbidden or other_workspace:
            self._counters["forbidden"] += 1
            self._workspace(account.workspace)["forbidden"] += 1
            read.refusal = read.answer.error(403, "forbidden", f"job {job_id} belongs to another workspace")
        return read

    def _count_job_read(self, job: Job | None, job_id: str, counter: str, now: float) -> None:
        if job is None:
            reads = self._unknown_reads.setdefault(job_id, {"status_reads": 0, "result_reads": 0})
            reads[counter] += 1
            self._unknown_reads.move_to_end(job_id)
            while len(self._unknown_reads) > MAX_UNKNOWN_IDS:
                self._unknown_reads.popitem(last=False)
            return
        setattr(job, counter, getattr(job, counter) + 1)
        if counter == "status_reads" and job.first_read is None:
            job.first_read = now
        if job.first_any_read is None:
            job.first_any_read = now
        if counter == "status_reads" and job.terminal_served:
            job.status_reads_after_terminal += 1

    def _hints(self, job: Job) -> bool:
        """Whether the job's status replies carry hints (its own switch, else the config's)."""
        return self._config.hints if job.spec.hints is None else job.spec.hints

    def _readiness_shown(self, job: Job) -> bool:
        """Whether its status replies say when its result is ready (``result_ready``)."""
        return self._hints(job) and "result_ready" in job.spec.hint_fields

    def _take_list_fault(self) -> str | None:
        """The next list fault of the current list mode, consumed; None for ``ok`` or none left."""
        faults = self._config.listing.faults
        if self._list_fault_cursor >= len(faults):
            return None
        self._list_fault_cursor += 1
        fault = faults[self._list_fault_cursor - 1]
        return None if fault == LIST_FAULT_OK else fault

    def _random_fault(self) -> str | None:
        config = self._config
        if config.error_rate_5xx and self._rng.random() < config.error_rate_5xx:
            return self._rng.choice(["500", "503:1"])
        if config.malformed_rate and self._rng.random() < config.malformed_rate:
            return "malformed"
        return None

    @staticmethod
    def _list_route_refusal(answer: _Answer, route: str) -> Reply:
        if route == "missing":
            return answer.error(404, "not_found", "no route for /api/v1/jobs")
        if route == "forbidden":
            return answer.error(403, "forbidden", "listing jobs is not allowed for this key")
        return answer.error(400, "bad_request", "the list request was rejected")

    def _parse_create(self, kind: str, body: bytes) -> tuple[JobSpec | None, str | None, SpecError | None]:
        """(spec, webhook url, None) or (None, None, the error) for a create body."""
        try:
            payload = json.loads(body) if body.strip() else {}
            if not isinstance(payload, dict):
                raise SpecError("request body must be a JSON object")
            return parse_spec(kind, payload.get("sim")), self._webhook_url(kind, payload.get("webhook_url")), None
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None, None, SpecError("request body is not valid JSON")
        except SpecError as exc:
            return None, None, exc

    def _create_fault(self, req: Request, spec: JobSpec | None, workspace: str) -> str | None:
        """The create fault for this attempt of one Idempotency-Key (of the workspace), consumed."""
        if spec is None or not spec.create_faults:
            return None
        key = (workspace, req.idempotency_key or req.request_id)
        attempt = self._create_attempts.get(key, 0)
        self._create_attempts[key] = attempt + 1
        return spec.create_faults[attempt] if attempt < len(spec.create_faults) else None

    def _start(self, answer: _Answer, kind: str, spec: JobSpec, url: str | None, now: float,
               workspace: str) -> Reply:
        """Bill and start the job(s), or answer 402."""
        if spec.insufficient_credits:
            self._counters["insufficient_credits"] += 1
            details = {"required": 1, "available": 0}
            return answer.error(402, "insufficient_credits", "not enough credits to start this job", details)
        self._counters["creates"] += 1
        jobs = [self._new_job(kind, spec, None, now, url, workspace) for _ in range(spec.count)]
        if spec.id_shape == "job_ids":
            return answer.json(201, {"job_ids": [j.id for j in jobs]})
        if spec.id_shape == "job_id":
            return answer.json(201, {"job_id": jobs[0].id, "status": "queued"})
        return answer.json(201, {"job": {"id": jobs[0].id, "status": "queued", "type": jobs[0].sume_type}})

    def _new_job(self, kind: str, spec: JobSpec, job_id: str | None, created: float, url: str | None,
                 workspace: str) -> Job:
        not_found_for = self._config.not_found_for if spec.not_found_for is None else spec.not_found_for
        result_url = f"https://cdn.sume.example/signed/{secrets.token_hex(16)}?sig={secrets.token_hex(16)}"
        job = Job(job_id or "job_" + secrets.token_hex(12), kind, spec, created, not_found_for, result_url, url,
                  workspace)
        self._jobs[job.id] = job
        self._counters["jobs_created"] += 1
        self._workspace(workspace)["jobs_created"] += 1
        while len(self._jobs) > self.max_jobs:
            self._jobs.popitem(last=False)
        self._plan_webhook(job)
        return job

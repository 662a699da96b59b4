"""A local, stdlib-only simulator of the Sume job API (see ``shared/sume-api.md``).

The simulator is a real HTTP server (``ThreadingHTTPServer`` bound to 127.0.0.1) used by
integration tests, benchmarks and the demo. It serves the public API under ``/api/v1`` and a
control API under ``/_sim``.

Public API (auth: ``Authorization: Bearer <key>`` or ``X-Api-Key: <key>``)
---------------------------------------------------------------------------
* ``POST /api/v1/images/generations`` | ``/videos/generations`` | ``/ads/videos`` | ``/face-swap``
  | ``/reference-analysis`` create a job of kind ``image`` | ``video`` | ``ad_video`` |
  ``face_swap`` | ``reference_analysis``. The free-form JSON body may carry a ``"sim"`` object
  of behaviour directives (see below). ``Idempotency-Key`` replays return the first response
  byte for byte (header ``Idempotent-Replayed: true``), create nothing and bill nothing.
* ``GET /api/v1/jobs/{id}``: the job, with ``terminal``/``result_ready``/
  ``next_poll_after_seconds`` inside ``job`` when hints are on. Counts one status read.
* ``GET /api/v1/jobs/{id}/result``: 200 once completed and ready, else 409
  ``result_not_ready`` (404 when unknown). Counts one result read.
* ``GET /api/v1/jobs?limit=&cursor=&status=&type=``: newest first, offset cursor.

Every public response carries ``request_id`` in its JSON body (except deliberately broken
bodies) and the headers ``X-Request-Id``, ``RateLimit-Limit``, ``RateLimit-Remaining`` and
``RateLimit-Reset``. Errors use the envelope
``{"error": {"code", "message", "details"}, "request_id": "req_<hex>"}``.

Behaviour directives (``"sim": {...}`` in a create body; every field optional)
-----------------------------------------------------------------------------
* ``outcome`` terminal status (default ``completed``); any string is reported verbatim.
  ``completed``/``complete``/``succeeded``/``success``/``ready`` count as success (result
  available); ``failed``/``error``/``errored``, ``canceled``/``cancelled`` and ``expired`` get
  an ``error`` object with code ``generation_failed``/``canceled``/``expired``.
* ``duration`` seconds until terminal (default per kind: image 3, video 20, ad_video 30,
  face_swap 5, reference_analysis 4), multiplied by the global ``time_scale`` at creation.
* ``steps`` non-terminal phases (default 2), cycling ``queued``/``running``/``processing`` over
  equal slices of ``duration``. ``min_reads``: the status reads a client needs from its first
  read on, obeying every hint exactly (1 + phase changes still ahead then; ``steps + 1`` before
  any read).
* ``result_delay`` seconds (scaled) after completion before ``result_ready`` turns true.
* ``status_override`` ``{"status": "mystery", "reads": N}``: the first N normally-answered
  status reads report that (non-terminal) status with a 1 s hint.
* ``faults`` / ``result_faults``: lists consumed one per status / result read, in order:
  ``"429:S"``, ``"500"``, ``"502"``, ``"503:S"`` (any ``"NNN"`` or ``"NNN:S"`` 4xx/5xx code
  works; ``:S`` sets ``Retry-After``; 429 defaults to ``Retry-After: 1``), ``"malformed"``
  (truncated JSON), ``"html"`` (200 text/html), ``"empty"`` (200, empty body), ``"slow:MS"``
  (sleep MS ms, then answer normally).
* ``hints`` (bool) overrides the global hints switch for this job.
* ``id_shape`` ``"job.id"`` (default) | ``"job_id"`` | ``"job_ids"`` (``count`` jobs, default 2;
  face swap defaults to ``job_ids``), ``insufficient_credits`` (402, nothing created).
* ``create_faults``: consumed one per create request of the same ``Idempotency-Key``:
  ``"slow:MS"`` creates the job but answers MS ms late (the client times out: outcome unknown),
  an error code (``"503:S"``, ``"500"``...) answers with that error and creates nothing.
Unknown directive names are rejected with 400 so typos do not go unnoticed.

Hints: ``next_poll_after_seconds`` is the real time until the next phase boundary (or until
the result becomes ready), rounded up to whole seconds with a minimum of 1, and 0 once there
is nothing left to wait for. With the ``exact_hints`` config switch it is the exact remaining
time in (real) seconds, rounded to milliseconds, which suits tests with a tiny ``time_scale``.

Control API (no auth, JSON, no added latency)
---------------------------------------------
* ``GET /_sim/jobs/{id}`` -> ``{"id", "kind", "status", "status_reads", "result_reads",
  "min_reads", "terminal_status", "spec", ...}``. For an id that was never created but was
  read, 404 with ``{"id", "exists": false, "status_reads", "result_reads"}``.
* ``GET /_sim/stats`` -> ``{"status_reads", "result_reads", "list_reads", "creates" (billed),
  "jobs_created", "create_requests", "replays", "insufficient_credits", "unauthorized",
  "rate_limited", "jobs": {id: {"status_reads", "result_reads", "min_reads", "status"}}}``.
* ``GET /_sim/config``; ``POST /_sim/config`` with any of ``hints``, ``latency_ms``,
  ``time_scale``, ``error_rate_5xx`` (random 500/503 on status reads), ``malformed_rate``,
  ``rate_limit_per_minute`` (int or null; status/result reads beyond it within a rolling 60 s
  window get 429 with ``Retry-After``), ``api_key``, ``seed``, ``exact_hints`` -> full config.
* ``POST /_sim/jobs`` ``{"id"?, "kind": "image", "sim": {...}, "age": 0}`` seeds a job as if
  created ``age`` (scaled) seconds ago -> ``{"id": ...}``.
* ``POST /_sim/reset`` clears jobs, counters, idempotency keys and restores the start config.

The same operations are available in Python on :class:`SumeSimulator` (``configure``,
``stats``, ``job_info``, ``seed_job``, ``reset``).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import math
import random
import re
import secrets
import socket
import sys
import threading
import time
import traceback
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = [
    "API_PREFIX",
    "CONTROL_PREFIX",
    "DEFAULT_API_KEY",
    "SimResponse",
    "SpecError",
    "SumeSimulator",
]

API_PREFIX = "/api/v1"
CONTROL_PREFIX = "/_sim"
DEFAULT_API_KEY = "sume_test_key"

CREATE_ROUTES: dict[str, str] = {
    "images/generations": "image",
    "videos/generations": "video",
    "ads/videos": "ad_video",
    "face-swap": "face_swap",
    "reference-analysis": "reference_analysis",
}
DEFAULT_DURATION: dict[str, float] = {
    "image": 3.0,
    "video": 20.0,
    "ad_video": 30.0,
    "face_swap": 5.0,
    "reference_analysis": 4.0,
}
ACTIVE_CYCLE = ("queued", "running", "processing")
SUCCESS_STATUSES = frozenset({"completed", "complete", "succeeded", "success", "ready"})
FAILURE_CODES: dict[str, str] = {
    "failed": "generation_failed",
    "error": "generation_failed",
    "errored": "generation_failed",
    "canceled": "canceled",
    "cancelled": "canceled",
    "expired": "expired",
}
ID_SHAPES = ("job.id", "job_id", "job_ids")
HTTP_ERROR_CODES: dict[int, str] = {
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
SPEC_FIELDS = frozenset(
    {
        "outcome",
        "duration",
        "steps",
        "result_delay",
        "status_override",
        "faults",
        "result_faults",
        "hints",
        "id_shape",
        "count",
        "insufficient_credits",
        "create_faults",
    }
)
NOMINAL_READ_LIMIT = 10_000  # reported in RateLimit-* headers while no limit is enforced
RATE_WINDOW_SECONDS = 60.0
MAX_BODY_BYTES = 1_000_000
_FAULT_RE = re.compile(r"^(?:malformed|html|empty|slow:\d+|[45]\d\d(?::\d+)?)$")
_HINT_EPSILON = 1e-9


class SpecError(ValueError):
    """Invalid request data (a bad ``sim`` directive, config value or body); maps to HTTP 400."""

    def __init__(self, message: str, field_name: str | None = None) -> None:
        super().__init__(message)
        self.field_name = field_name


@dataclass(frozen=True)
class SimResponse:
    """A fully rendered HTTP response produced by :meth:`SumeSimulator.handle`."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    delay: float = 0.0  # seconds to sleep before writing (outside the lock)


@dataclass
class JobSpec:
    """Behaviour of one simulated job, parsed from a ``sim`` directive object."""

    outcome: str = "completed"
    duration: float = 3.0
    steps: int = 2
    result_delay: float = 0.0
    override_status: str | None = None
    override_reads: int = 0
    faults: list[str] = field(default_factory=list)
    result_faults: list[str] = field(default_factory=list)
    hints: bool | None = None
    id_shape: str = "job.id"
    count: int = 1
    insufficient_credits: bool = False
    #: Faults for the create requests of one Idempotency-Key, one per request, in order:
    #: ``slow:MS`` creates the job but answers late (the client sees a timeout, outcome unknown);
    #: an error code answers with that error and creates nothing.
    create_faults: list[str] = field(default_factory=list)

    @property
    def min_reads(self) -> int:
        return self.steps + 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "duration": self.duration,
            "steps": self.steps,
            "result_delay": self.result_delay,
            "status_override": (
                {"status": self.override_status, "reads": self.override_reads}
                if self.override_status is not None
                else None
            ),
            "faults": list(self.faults),
            "result_faults": list(self.result_faults),
            "hints": self.hints,
            "id_shape": self.id_shape,
            "count": self.count,
            "insufficient_credits": self.insufficient_credits,
            "create_faults": list(self.create_faults),
        }


def _number(raw: dict[str, Any], name: str, default: float, minimum: float = 0.0) -> float:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpecError(f"sim.{name} must be a number", name)
    if value < minimum:
        raise SpecError(f"sim.{name} must be >= {minimum}", name)
    return float(value)


def _integer(raw: dict[str, Any], name: str, default: int, minimum: int, maximum: int) -> int:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise SpecError(f"sim.{name} must be an integer in [{minimum}, {maximum}]", name)
    return value


def _faults(raw: dict[str, Any], name: str) -> list[str]:
    value = raw.get(name, [])
    if not isinstance(value, list) or not all(isinstance(f, str) for f in value):
        raise SpecError(f"sim.{name} must be a list of strings", name)
    for fault in value:
        if not _FAULT_RE.match(fault):
            raise SpecError(f"sim.{name}: unknown fault {fault!r}", name)
    return list(value)


def parse_spec(kind: str, raw: Any) -> JobSpec:
    """Validate a ``sim`` directive object for a job of ``kind``; raise :class:`SpecError`."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SpecError("sim must be an object", "sim")
    unknown = sorted(set(raw) - SPEC_FIELDS)
    if unknown:
        raise SpecError(f"unknown sim directive(s): {', '.join(unknown)}", unknown[0])
    outcome = raw.get("outcome", "completed")
    if not isinstance(outcome, str) or not outcome:
        raise SpecError("sim.outcome must be a non-empty string", "outcome")
    override_status: str | None = None
    override_reads = 0
    override = raw.get("status_override")
    if override is not None:
        if not isinstance(override, dict) or not isinstance(override.get("status"), str):
            raise SpecError('sim.status_override must be {"status": str, "reads": int}', "status_override")
        override_status = override["status"]
        override_reads = _integer(override, "reads", 1, 0, 1_000_000)
    hints = raw.get("hints")
    if hints is not None and not isinstance(hints, bool):
        raise SpecError("sim.hints must be a boolean", "hints")
    default_shape = "job_ids" if kind == "face_swap" else "job.id"
    id_shape = raw.get("id_shape", default_shape)
    if id_shape not in ID_SHAPES:
        raise SpecError(f"sim.id_shape must be one of {', '.join(ID_SHAPES)}", "id_shape")
    count = _integer(raw, "count", 2, 1, 100) if id_shape == "job_ids" else 1
    insufficient = raw.get("insufficient_credits", False)
    if not isinstance(insufficient, bool):
        raise SpecError("sim.insufficient_credits must be a boolean", "insufficient_credits")
    return JobSpec(
        outcome=outcome,
        duration=_number(raw, "duration", DEFAULT_DURATION.get(kind, 3.0)),
        steps=_integer(raw, "steps", 2, 1, 10_000),
        result_delay=_number(raw, "result_delay", 0.0),
        override_status=override_status,
        override_reads=override_reads,
        faults=_faults(raw, "faults"),
        result_faults=_faults(raw, "result_faults"),
        hints=hints,
        id_shape=id_shape,
        count=count,
        insufficient_credits=insufficient,
        create_faults=_faults(raw, "create_faults"),
    )


@dataclass
class _JobState:
    status: str
    terminal: bool
    success: bool
    result_ready: bool
    next_event: float | None  # monotonic time of the next change, None when nothing is left
    updated_offset: float  # real seconds from creation to the last status change


@dataclass
class _Job:
    id: str
    kind: str
    spec: JobSpec
    created_mono: float
    created_wall: float
    scale: float  # time_scale captured at creation
    result_url: str
    status_reads: int = 0
    result_reads: int = 0
    fault_cursor: int = 0
    result_fault_cursor: int = 0
    override_served: int = 0
    first_read_mono: float | None = None

    def min_reads(self) -> int:
        """Status reads a client needs from its first read on if it obeys every hint exactly:
        1 + the phase changes (and the result becoming ready) still ahead at that first read.
        Before any read: ``steps + 1``."""
        if self.first_read_mono is None:
            return self.spec.steps + 1
        duration = self.spec.duration * self.scale
        t = self.first_read_mono - self.created_mono
        slice_len = duration / self.spec.steps
        ahead = sum(1 for i in range(1, self.spec.steps + 1) if i * slice_len > t)
        ready_at = duration + self.spec.result_delay * self.scale
        if self.spec.result_delay > 0 and self.spec.outcome.lower() in SUCCESS_STATUSES and ready_at > t:
            ahead += 1
        return 1 + ahead

    def state(self, now: float) -> _JobState:
        duration = self.spec.duration * self.scale
        elapsed = now - self.created_mono
        if elapsed >= duration:
            status = self.spec.outcome
            success = status.lower() in SUCCESS_STATUSES
            ready_at = self.created_mono + duration + self.spec.result_delay * self.scale
            ready = success and now >= ready_at
            return _JobState(
                status=status,
                terminal=True,
                success=success,
                result_ready=ready,
                next_event=ready_at if success and not ready else None,
                updated_offset=duration,
            )
        slice_len = duration / self.spec.steps
        phase = min(int(elapsed // slice_len), self.spec.steps - 1) if slice_len > 0 else 0
        return _JobState(
            status=ACTIVE_CYCLE[phase % len(ACTIVE_CYCLE)],
            terminal=False,
            success=False,
            result_ready=False,
            next_event=self.created_mono + (phase + 1) * slice_len,
            updated_offset=phase * slice_len,
        )


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _json_bytes(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def _new_request_id() -> str:
    return "req_" + secrets.token_hex(8)


def _error_payload(code: str, message: str, request_id: str, details: dict[str, Any] | None = None) -> bytes:
    return _json_bytes(
        {"error": {"code": code, "message": message, "details": details or {}}, "request_id": request_id}
    )


@dataclass
class _Config:
    hints: bool = True
    latency_ms: int = 0
    time_scale: float = 1.0
    error_rate_5xx: float = 0.0
    malformed_rate: float = 0.0
    rate_limit_per_minute: int | None = None
    api_key: str = DEFAULT_API_KEY
    seed: int | None = None
    exact_hints: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _validated_config(base: _Config, changes: dict[str, Any]) -> _Config:
    """Return a copy of ``base`` with ``changes`` applied; raise :class:`SpecError` when invalid."""
    cfg = _Config(**base.__dict__)
    for name, value in changes.items():
        if name in ("hints", "exact_hints"):
            if not isinstance(value, bool):
                raise SpecError(f"{name} must be a boolean", name)
        elif name == "latency_ms":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecError("latency_ms must be an integer >= 0", name)
        elif name == "time_scale":
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise SpecError("time_scale must be a number > 0", name)
            value = float(value)
        elif name in ("error_rate_5xx", "malformed_rate"):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
                raise SpecError(f"{name} must be a number in [0, 1]", name)
            value = float(value)
        elif name == "rate_limit_per_minute":
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise SpecError("rate_limit_per_minute must be an integer >= 1 or null", name)
        elif name == "api_key":
            if not isinstance(value, str) or not value:
                raise SpecError("api_key must be a non-empty string", name)
        elif name == "seed":
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise SpecError("seed must be an integer or null", name)
        else:
            raise SpecError(f"unknown config field {name!r}", name)
        setattr(cfg, name, value)
    return cfg


class SumeSimulator:
    """In-process Sume API simulator serving real HTTP on 127.0.0.1.

    >>> with SumeSimulator(api_key="k", time_scale=0.01) as sim:  # doctest: +SKIP
    ...     print(sim.base_url)   # http://127.0.0.1:PORT/api/v1

    All state lives behind a single lock; the job timeline is computed from each job's creation
    time on every read, so no background threads are involved besides the HTTP server.
    """

    _config: _Config
    _rng: random.Random
    _jobs: OrderedDict[str, _Job]
    _unknown_reads: OrderedDict[str, dict[str, int]]
    _idempotency: OrderedDict[str, tuple[int, bytes]]
    _create_attempts: dict[str, int]
    _read_window: deque[float]
    _counters: dict[str, int]

    def __init__(
        self,
        api_key: str = DEFAULT_API_KEY,
        hints: bool = True,
        latency_ms: int = 0,
        time_scale: float = 1.0,
        *,
        error_rate_5xx: float = 0.0,
        malformed_rate: float = 0.0,
        rate_limit_per_minute: int | None = None,
        seed: int | None = None,
        exact_hints: bool = False,
        host: str = "127.0.0.1",
        max_jobs: int = 20_000,
        log_requests: bool = False,
    ) -> None:
        self._initial_config = _validated_config(
            _Config(),
            {
                "api_key": api_key,
                "hints": hints,
                "latency_ms": latency_ms,
                "time_scale": time_scale,
                "error_rate_5xx": error_rate_5xx,
                "malformed_rate": malformed_rate,
                "rate_limit_per_minute": rate_limit_per_minute,
                "seed": seed,
                "exact_hints": exact_hints,
            },
        )
        self.host = host
        self.max_jobs = max_jobs
        self.log_requests = log_requests
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._reset_locked()

    # ------------------------------------------------------------------ lifecycle

    def start(self, port: int = 0) -> SumeSimulator:
        """Bind ``host:port`` (0 = any free port) and serve in a daemon thread; returns ``self``."""
        if self._server is not None:
            raise RuntimeError("simulator already started")
        handler = type("_BoundSumeHandler", (_SumeHandler,), {"simulator": self})
        server = ThreadingHTTPServer((self.host, port), handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.01}, name="sume-sim", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close the listening socket and drop open keep-alive connections."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)
        with self._lock:
            connections = list(self._connections)
            self._connections.clear()
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def _track_connection(self, conn: socket.socket, active: bool) -> None:
        with self._lock:
            if active:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def __enter__(self) -> SumeSimulator:
        if self._server is None:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("simulator not started")
        return int(self._server.server_address[1])

    @property
    def root_url(self) -> str:
        """``http://127.0.0.1:PORT`` (no path)."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The API base URL, e.g. ``http://127.0.0.1:PORT/api/v1``."""
        return self.root_url + API_PREFIX

    @property
    def control_url(self) -> str:
        """The control API base URL, e.g. ``http://127.0.0.1:PORT/_sim``."""
        return self.root_url + CONTROL_PREFIX

    # ------------------------------------------------------------------ python control API

    def reset(self) -> None:
        """Clear jobs, counters and idempotency keys; restore the start configuration."""
        with self._lock:
            self._reset_locked()

    def configure(self, **changes: Any) -> dict[str, Any]:
        """Apply config changes (same fields as ``POST /_sim/config``); return the full config."""
        with self._lock:
            self._config = _validated_config(self._config, changes)
            if "seed" in changes:
                self._rng = random.Random(self._config.seed)
            return self._config.to_dict()

    @property
    def config(self) -> dict[str, Any]:
        with self._lock:
            return self._config.to_dict()

    def stats(self) -> dict[str, Any]:
        """Global counters plus per-job read counts (same as ``GET /_sim/stats``)."""
        with self._lock:
            now = time.monotonic()
            jobs: dict[str, Any] = {
                job.id: {
                    "status_reads": job.status_reads,
                    "result_reads": job.result_reads,
                    "min_reads": job.min_reads(),
                    "status": job.state(now).status,
                }
                for job in self._jobs.values()
            }
            for job_id, reads in self._unknown_reads.items():
                jobs.setdefault(job_id, {**reads, "min_reads": None, "status": None})
            return {**self._counters, "jobs": jobs}

    def job_info(self, job_id: str) -> dict[str, Any] | None:
        """Control view of one job (same as ``GET /_sim/jobs/{id}``), or None when unknown."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return None
            state = job.state(time.monotonic())
            return {
                "id": job.id,
                "kind": job.kind,
                "status": state.status,
                "terminal": state.terminal,
                "result_ready": state.result_ready,
                "status_reads": job.status_reads,
                "result_reads": job.result_reads,
                "min_reads": job.min_reads(),
                "terminal_status": job.spec.outcome,
                "faults_remaining": job.spec.faults[job.fault_cursor :],
                "result_faults_remaining": job.spec.result_faults[job.result_fault_cursor :],
                "created_at": _iso(job.created_wall),
                "spec": job.spec.to_dict(),
            }

    def seed_job(
        self,
        kind: str = "image",
        sim: dict[str, Any] | None = None,
        job_id: str | None = None,
        age: float = 0.0,
    ) -> str:
        """Create a job directly (no billing), as if submitted ``age`` simulated seconds ago."""
        if kind not in DEFAULT_DURATION:
            raise SpecError(f"kind must be one of {', '.join(DEFAULT_DURATION)}", "kind")
        if job_id is not None and (not isinstance(job_id, str) or not job_id or "/" in job_id):
            raise SpecError("id must be a non-empty string without '/'", "id")
        if isinstance(age, bool) or not isinstance(age, int | float) or age < 0:
            raise SpecError("age must be a number >= 0", "age")
        spec = parse_spec(kind, sim)
        with self._lock:
            if job_id is not None and job_id in self._jobs:
                raise SpecError(f"job {job_id} already exists", "id")
            job = self._new_job_locked(kind, spec, job_id, age=float(age))
            return job.id

    # ------------------------------------------------------------------ request entry points

    def request_delay(self, path: str) -> float:
        """Seconds of simulated network latency to add before handling ``path``."""
        if urlsplit(path).path.startswith(CONTROL_PREFIX):
            return 0.0
        with self._lock:
            return self._config.latency_ms / 1000.0

    def handle(self, method: str, target: str, headers: Any, body: bytes) -> SimResponse:
        """Route one request (``headers`` needs a case-insensitive ``.get``) to a response."""
        parts = urlsplit(target)
        path = parts.path.rstrip("/") or "/"
        query = parse_qs(parts.query)
        if path == CONTROL_PREFIX or path.startswith(CONTROL_PREFIX + "/"):
            return self._handle_control(method, path[len(CONTROL_PREFIX) :].strip("/"), body)
        request_id = _new_request_id()
        if path != API_PREFIX and not path.startswith(API_PREFIX + "/"):
            return self._api_error(404, "not_found", f"no route for {path}", request_id)
        if not self._authorized(headers):
            with self._lock:
                self._counters["unauthorized"] += 1
            return self._api_error(401, "unauthorized", "missing or invalid API key", request_id)
        route = (
            [unquote(p) for p in path[len(API_PREFIX) :].strip("/").split("/")] if path != API_PREFIX else []
        )
        joined = "/".join(route)
        if joined in CREATE_ROUTES:
            if method != "POST":
                return self._api_error(405, "method_not_allowed", f"{method} not allowed", request_id)
            return self._create(CREATE_ROUTES[joined], headers, body, request_id)
        if route and route[0] == "jobs" and method != "GET":
            return self._api_error(405, "method_not_allowed", f"{method} not allowed", request_id)
        if route == ["jobs"]:
            return self._list_jobs(query, request_id)
        if len(route) == 2 and route[0] == "jobs":
            return self._status_read(route[1], request_id)
        if len(route) == 3 and route[0] == "jobs" and route[2] == "result":
            return self._result_read(route[1], request_id)
        return self._api_error(404, "not_found", f"no route for {path}", request_id)

    # ------------------------------------------------------------------ internals: state

    def _reset_locked(self) -> None:
        self._config = _validated_config(self._initial_config, {})
        self._rng = random.Random(self._config.seed)
        self._jobs = OrderedDict()
        self._unknown_reads = OrderedDict()
        self._idempotency = OrderedDict()
        self._create_attempts = {}
        self._read_window = deque()
        self._counters = {
            "status_reads": 0,
            "result_reads": 0,
            "list_reads": 0,
            "creates": 0,
            "jobs_created": 0,
            "create_requests": 0,
            "replays": 0,
            "insufficient_credits": 0,
            "unauthorized": 0,
            "rate_limited": 0,
        }

    def _new_job_locked(self, kind: str, spec: JobSpec, job_id: str | None = None, age: float = 0.0) -> _Job:
        scale = self._config.time_scale
        offset = age * scale
        job = _Job(
            id=job_id or "job_" + secrets.token_hex(12),
            kind=kind,
            spec=spec,
            created_mono=time.monotonic() - offset,
            created_wall=time.time() - offset,
            scale=scale,
            result_url=f"https://cdn.sume.example/signed/{secrets.token_hex(16)}?sig={secrets.token_hex(16)}",
        )
        self._jobs[job.id] = job
        self._counters["jobs_created"] += 1
        while len(self._jobs) > self.max_jobs:
            self._jobs.popitem(last=False)
        return job

    def _count_unknown_locked(self, job_id: str, counter: str) -> None:
        reads = self._unknown_reads.setdefault(job_id, {"status_reads": 0, "result_reads": 0})
        reads[counter] += 1
        self._unknown_reads.move_to_end(job_id)
        while len(self._unknown_reads) > 1000:
            self._unknown_reads.popitem(last=False)

    def _hints_for(self, job: _Job) -> bool:
        return self._config.hints if job.spec.hints is None else job.spec.hints

    def _hint_value(self, remaining: float | None) -> float | int:
        if remaining is None or remaining <= 0:
            return 0
        if self._config.exact_hints:
            return max(0.001, round(remaining, 3))
        return max(1, math.ceil(remaining - _HINT_EPSILON))

    def _job_view(
        self, job: _Job, now: float, *, with_hints: bool, override: str | None = None
    ) -> dict[str, Any]:
        state = job.state(now)
        view: dict[str, Any] = {
            "id": job.id,
            "type": job.kind,
            "status": state.status,
            "error": None,
            "created_at": _iso(job.created_wall),
            "updated_at": _iso(job.created_wall + state.updated_offset),
            "result_url": job.result_url if state.success and state.result_ready else None,
        }
        if state.terminal and not state.success:
            code = FAILURE_CODES.get(state.status.lower())
            if code is not None:
                view["error"] = {"code": code, "message": f"job {state.status}: simulated {code}"}
        if override is not None:
            view.update(status=override, error=None, result_url=None)
        if with_hints:
            if override is not None:
                view["terminal"] = False
                view["result_ready"] = False
                view["next_poll_after_seconds"] = self._hint_value(
                    job.scale if self._config.exact_hints else 1
                )
            else:
                view["terminal"] = state.terminal
                view["result_ready"] = state.result_ready
                remaining = None if state.next_event is None else state.next_event - now
                view["next_poll_after_seconds"] = self._hint_value(remaining)
        return view

    # ------------------------------------------------------------------ internals: rate limiting

    def _window_locked(self, now: float) -> tuple[int, int, int]:
        """(limit, remaining, reset seconds) of the rolling read window."""
        window = self._read_window
        while window and window[0] <= now - RATE_WINDOW_SECONDS:
            window.popleft()
        limit = self._config.rate_limit_per_minute or NOMINAL_READ_LIMIT
        reset = math.ceil(window[0] + RATE_WINDOW_SECONDS - now) if window else int(RATE_WINDOW_SECONDS)
        return limit, max(0, limit - len(window)), max(1, reset)

    def _admit_read_locked(self, now: float) -> int | None:
        """Record one read in the window; return Retry-After seconds when it must be rejected."""
        _limit, remaining, reset = self._window_locked(now)
        if self._config.rate_limit_per_minute is not None and remaining <= 0:
            self._counters["rate_limited"] += 1
            return reset
        self._read_window.append(now)
        if len(self._read_window) > 200_000:  # memory bound when no limit is enforced
            self._read_window.popleft()
        return None

    # ------------------------------------------------------------------ internals: responses

    def _rate_headers(self, request_id: str) -> list[tuple[str, str]]:
        with self._lock:
            limit, remaining, reset = self._window_locked(time.monotonic())
        return [
            ("X-Request-Id", request_id),
            ("RateLimit-Limit", str(limit)),
            ("RateLimit-Remaining", str(remaining)),
            ("RateLimit-Reset", str(reset)),
        ]

    def _api_response(
        self,
        status: int,
        body: bytes,
        request_id: str,
        *,
        content_type: str = "application/json",
        extra: list[tuple[str, str]] | None = None,
    ) -> SimResponse:
        headers = self._rate_headers(request_id) + (extra or [])
        return SimResponse(status=status, body=body, content_type=content_type, headers=tuple(headers))

    def _api_json(self, status: int, payload: dict[str, Any], request_id: str) -> SimResponse:
        return self._api_response(status, _json_bytes({**payload, "request_id": request_id}), request_id)

    def _api_error(
        self,
        status: int,
        code: str,
        message: str,
        request_id: str,
        details: dict[str, Any] | None = None,
        retry_after: str | None = None,
    ) -> SimResponse:
        extra = [("Retry-After", retry_after)] if retry_after is not None else []
        body = _error_payload(code, message, request_id, details)
        return self._api_response(status, body, request_id, extra=extra)

    def _fault_response(self, fault: str, job_id: str, request_id: str) -> SimResponse:
        """Render an injected fault (everything except ``slow:``)."""
        if fault == "malformed":
            body = ('{"job": {"id": "' + job_id + '", "status": "runn').encode()
            return self._api_response(200, body, request_id)
        if fault == "html":
            body = b"<!DOCTYPE html><html><head><title>Bad Gateway</title></head><body>502</body></html>"
            return self._api_response(200, body, request_id, content_type="text/html; charset=utf-8")
        if fault == "empty":
            return self._api_response(200, b"", request_id)
        code_text, _, retry = fault.partition(":")
        status = int(code_text)
        if status == 429 and not retry:
            retry = "1"
        code = HTTP_ERROR_CODES.get(status, "internal_error" if status >= 500 else "error")
        return self._api_error(
            status, code, f"simulated {status} fault", request_id, retry_after=retry or None
        )

    # ------------------------------------------------------------------ internals: endpoints

    def _authorized(self, headers: Any) -> bool:
        with self._lock:
            key = self._config.api_key
        candidates: list[str] = []
        auth = headers.get("Authorization") or ""
        scheme, _, token = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            candidates.append(token.strip())
        api_key = headers.get("X-Api-Key")
        if api_key:
            candidates.append(api_key.strip())
        return any(hmac.compare_digest(c.encode(), key.encode()) for c in candidates)

    def _create(self, kind: str, headers: Any, body: bytes, request_id: str) -> SimResponse:
        idem_key = (headers.get("Idempotency-Key") or "").strip() or None
        spec: JobSpec | None = None
        spec_error: SpecError | None = None
        try:
            payload = json.loads(body) if body.strip() else {}
            if not isinstance(payload, dict):
                raise SpecError("request body must be a JSON object")
            spec = parse_spec(kind, payload.get("sim"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            spec_error = SpecError("request body is not valid JSON")
        except SpecError as exc:
            spec_error = exc
        create_fault: str | None = None
        with self._lock:
            self._counters["create_requests"] += 1
            if spec is not None and spec.create_faults:
                attempt_key = idem_key or request_id
                attempt = self._create_attempts.get(attempt_key, 0)
                self._create_attempts[attempt_key] = attempt + 1
                if attempt < len(spec.create_faults):
                    create_fault = spec.create_faults[attempt]
        if create_fault is not None and not create_fault.startswith("slow:"):
            return self._fault_response(create_fault, "", request_id)
        with self._lock:
            if idem_key is not None and idem_key in self._idempotency:
                self._counters["replays"] += 1
                status, stored = self._idempotency[idem_key]
                self._idempotency.move_to_end(idem_key)
                replay = True
            else:
                replay = False
                if spec is None:
                    status, stored = 0, b""
                elif spec.insufficient_credits:
                    self._counters["insufficient_credits"] += 1
                    status = 402
                    stored = _error_payload(
                        "insufficient_credits",
                        "not enough credits to start this job",
                        request_id,
                        {"required": 1, "available": 0},
                    )
                else:
                    self._counters["creates"] += 1
                    jobs = [self._new_job_locked(kind, spec) for _ in range(spec.count)]
                    status = 201
                    if spec.id_shape == "job_ids":
                        result: dict[str, Any] = {"job_ids": [j.id for j in jobs]}
                    elif spec.id_shape == "job_id":
                        result = {"job_id": jobs[0].id, "status": "queued"}
                    else:
                        result = {"job": {"id": jobs[0].id, "status": "queued", "type": kind}}
                    stored = _json_bytes({**result, "request_id": request_id})
                if idem_key is not None and status:
                    self._idempotency[idem_key] = (status, stored)
                    while len(self._idempotency) > 20_000:
                        self._idempotency.popitem(last=False)
        if status == 0 and spec_error is not None:
            details = {"field": spec_error.field_name} if spec_error.field_name else {}
            return self._api_error(400, "bad_request", str(spec_error), request_id, details)
        extra = [("Idempotent-Replayed", "true")] if replay else []
        if create_fault is not None:  # slow: the job exists, the answer comes too late
            time.sleep(int(create_fault.partition(":")[2]) / 1000.0)
        return self._api_response(status, stored, request_id, extra=extra)

    def _read_refusal(self, job: _Job | None, job_id: str, retry_after: Any, fault: str | None,
                      request_id: str) -> SimResponse | None:
        """What a read answers before the job's own view: rate limit, unknown job, a fault
        (``slow:MS`` only delays). None: answer normally."""
        if retry_after is not None:
            return self._api_error(
                429,
                "rate_limit_exceeded",
                "read rate limit exceeded",
                request_id,
                retry_after=str(retry_after),
            )
        if job is None:
            return self._api_error(404, "not_found", f"job {job_id} not found", request_id)
        if fault is not None and fault.startswith("slow:"):
            time.sleep(int(fault.partition(":")[2]) / 1000.0)
            return None
        if fault is not None:
            return self._fault_response(fault, job_id, request_id)
        return None

    def _status_read(self, job_id: str, request_id: str) -> SimResponse:
        with self._lock:
            now = time.monotonic()
            self._counters["status_reads"] += 1
            job = self._jobs.get(job_id)
            if job is None:
                self._count_unknown_locked(job_id, "status_reads")
            else:
                job.status_reads += 1
                if job.first_read_mono is None:
                    job.first_read_mono = now
            retry_after = self._admit_read_locked(now)
            fault: str | None = None
            if retry_after is None and job is not None:
                if job.fault_cursor < len(job.spec.faults):
                    fault = job.spec.faults[job.fault_cursor]
                    job.fault_cursor += 1
                elif self._config.error_rate_5xx and self._rng.random() < self._config.error_rate_5xx:
                    fault = self._rng.choice(["500", "503:1"])
                elif self._config.malformed_rate and self._rng.random() < self._config.malformed_rate:
                    fault = "malformed"
        early = self._read_refusal(job, job_id, retry_after, fault, request_id)
        if early is not None:
            return early
        assert job is not None
        with self._lock:
            override: str | None = None
            if job.spec.override_status is not None and job.override_served < job.spec.override_reads:
                job.override_served += 1
                override = job.spec.override_status
            view = self._job_view(job, time.monotonic(), with_hints=self._hints_for(job), override=override)
        return self._api_json(200, {"job": view}, request_id)

    def _result_read(self, job_id: str, request_id: str) -> SimResponse:
        with self._lock:
            now = time.monotonic()
            self._counters["result_reads"] += 1
            job = self._jobs.get(job_id)
            if job is None:
                self._count_unknown_locked(job_id, "result_reads")
            else:
                job.result_reads += 1
            retry_after = self._admit_read_locked(now)
            fault: str | None = None
            if (
                retry_after is None
                and job is not None
                and job.result_fault_cursor < len(job.spec.result_faults)
            ):
                fault = job.spec.result_faults[job.result_fault_cursor]
                job.result_fault_cursor += 1
        early = self._read_refusal(job, job_id, retry_after, fault, request_id)
        if early is not None:
            return early
        assert job is not None
        with self._lock:
            state = job.state(time.monotonic())
        if not (state.success and state.result_ready):
            return self._api_error(
                409,
                "result_not_ready",
                f"result of job {job_id} is not available",
                request_id,
                {"status": state.status, "terminal": state.terminal},
            )
        return self._api_json(
            200, {"job_id": job.id, "type": job.kind, "result": self._result_body(job)}, request_id
        )

    @staticmethod
    def _result_body(job: _Job) -> dict[str, Any]:
        if job.kind in ("video", "ad_video"):
            return {
                "url": job.result_url,
                "width": 1080,
                "height": 1920,
                "duration_seconds": 15.0 if job.kind == "ad_video" else 8.0,
                "format": "mp4",
            }
        if job.kind == "reference_analysis":
            return {
                "url": job.result_url,
                "width": 1024,
                "height": 1024,
                "summary": "simulated reference analysis",
                "tags": ["portrait", "studio", "warm-light"],
            }
        return {"url": job.result_url, "width": 1024, "height": 1024, "format": "png"}

    def _list_jobs(self, query: dict[str, list[str]], request_id: str) -> SimResponse:
        def first(name: str) -> str | None:
            values = query.get(name)
            return values[0] if values else None

        try:
            limit = int(first("limit") or 20)
            offset = int(first("cursor") or 0)
        except ValueError:
            return self._api_error(400, "bad_request", "limit and cursor must be integers", request_id)
        if not 1 <= limit <= 100 or offset < 0:
            return self._api_error(400, "bad_request", "limit must be 1..100 and cursor >= 0", request_id)
        status_filter, type_filter = first("status"), first("type")
        with self._lock:
            now = time.monotonic()
            self._counters["list_reads"] += 1
            views = []
            for job in reversed(self._jobs.values()):
                if type_filter and job.kind != type_filter:
                    continue
                view = self._job_view(job, now, with_hints=False)
                if status_filter and view["status"].lower() != status_filter.lower():
                    continue
                views.append(view)
        page = views[offset : offset + limit]
        next_cursor = str(offset + limit) if offset + limit < len(views) else None
        return self._api_json(200, {"jobs": page, "next_cursor": next_cursor}, request_id)

    # ------------------------------------------------------------------ internals: control API

    def _handle_control(self, method: str, route: str, body: bytes) -> SimResponse:
        def reply(status: int, payload: Any) -> SimResponse:
            return SimResponse(status=status, body=_json_bytes(payload))

        def error(status: int, code: str, message: str, details: dict[str, Any] | None = None) -> SimResponse:
            return reply(status, {"error": {"code": code, "message": message, "details": details or {}}})

        try:
            data = json.loads(body) if body.strip() else {}
        except json.JSONDecodeError:
            return error(400, "bad_request", "body is not valid JSON")
        if method == "POST" and not isinstance(data, dict):
            return error(400, "bad_request", "body must be a JSON object")
        try:
            if route == "stats" and method == "GET":
                return reply(200, self.stats())
            if route == "config" and method == "GET":
                return reply(200, self.config)
            if route == "config" and method == "POST":
                return reply(200, self.configure(**data))
            if route == "reset" and method == "POST":
                self.reset()
                return reply(200, {"ok": True})
            if route == "jobs" and method == "POST":
                job_id = self.seed_job(
                    kind=data.get("kind", "image"),
                    sim=data.get("sim"),
                    job_id=data.get("id"),
                    age=data.get("age", 0),
                )
                return reply(201, {"id": job_id})
            if route.startswith("jobs/") and method == "GET":
                job_id = unquote(route[len("jobs/") :])
                info = self.job_info(job_id)
                if info is not None:
                    return reply(200, info)
                with self._lock:
                    reads = dict(self._unknown_reads.get(job_id, {"status_reads": 0, "result_reads": 0}))
                return reply(404, {"id": job_id, "exists": False, **reads})
        except SpecError as exc:
            details = {"field": exc.field_name} if exc.field_name else {}
            return error(400, "bad_request", str(exc), details)
        return error(404, "not_found", f"no control route {method} /_sim/{route}")


class _SumeHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive handler delegating to :meth:`SumeSimulator.handle`."""

    protocol_version = "HTTP/1.1"
    server_version = "sume-sim/1.0"
    timeout = 60  # idle keep-alive connections are closed after this many seconds
    wbufsize = 64 * 1024  # headers and body leave in one send (flushed per request by the base class)
    simulator: SumeSimulator  # set on the per-server subclass

    def setup(self) -> None:
        super().setup()
        # Without TCP_NODELAY, small split writes meet delayed ACKs and cost ~40 ms per request.
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.simulator._track_connection(self.connection, True)

    def finish(self) -> None:
        self.simulator._track_connection(self.connection, False)
        with contextlib.suppress(OSError):
            super().finish()

    def _dispatch(self) -> None:
        sim = self.simulator
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True
            request_id = _new_request_id()
            status = 400 if length < 0 else 413
            payload = _error_payload(HTTP_ERROR_CODES[status], "invalid request body length", request_id)
            self._write(SimResponse(status, payload, headers=(("X-Request-Id", request_id),)))
            return
        body = self.rfile.read(length) if length else b""
        delay = sim.request_delay(self.path)
        if delay > 0:
            time.sleep(delay)
        try:
            response = sim.handle(self.command, self.path, self.headers, body)
        except Exception:
            traceback.print_exc(file=sys.stderr)
            request_id = _new_request_id()
            response = SimResponse(
                500,
                _error_payload("internal_error", "simulator bug", request_id),
                headers=(("X-Request-Id", request_id),),
            )
        if response.delay > 0:
            time.sleep(response.delay)
        self._write(response)

    def _write(self, response: SimResponse) -> None:
        self.send_response(response.status)
        for name, value in response.headers:
            self.send_header(name, value)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _dispatch

    def log_message(self, format: str, *args: Any) -> None:
        if self.simulator.log_requests:
            # Paths and status codes only: headers (and so the API key) are never logged.
            sys.stderr.write(f"sume-sim {self.address_string()} {format % args}\n")

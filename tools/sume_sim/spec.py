"""Job specs: the ``sim`` directives that fix one simulated job's whole behaviour.

A create body (or a seeded job) may carry ``"sim": {...}``; :func:`parse_spec` validates it into a
:class:`JobSpec` and raises :class:`SpecError` (HTTP 400) on anything unknown, so typos in tests
do not go unnoticed. Every time in a spec is in clock seconds. This module also holds the job
vocabulary (kinds, Sume's type names, statuses) and the small validators the config reuses.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

#: Internal kind -> default duration (clock seconds).
DEFAULT_DURATION: dict[str, float] = {
    "image": 3.0,
    "video": 20.0,
    "ad_video": 30.0,
    "face_swap": 5.0,
    "reference_analysis": 4.0,
}
#: Internal kind -> the ``type`` value Sume reports. Restated here on purpose, not imported from the
#: poller's layer: the simulator states Sume's contract independently of the client it tests.
SUME_TYPES: dict[str, str] = {"image": "image_generation", "video": "video_generation",
                              "ad_video": "ad_video_generation", "face_swap": "face_swap",
                              "reference_analysis": "reference_analysis"}
KIND_BY_TYPE: dict[str, str] = {sume_type: kind for kind, sume_type in SUME_TYPES.items()}
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
TERMINAL_STATUSES = SUCCESS_STATUSES | frozenset(FAILURE_CODES)
ID_SHAPES = ("job.id", "job_id", "job_ids")
#: The workspace of the top-level ``api_key`` and of seeded jobs that name none.
DEFAULT_WORKSPACE = "default"
RESULT_SHAPES = ("object", "list", "string", "large")
DEFAULT_RESULT_BYTES = 400_000
#: HTTP statuses the result route may answer while a result is not ready yet (409 is the default).
RESULT_NOT_READY_STATUSES = (404, 409, 425)
_FAULT_RE = re.compile(r"^(?:malformed|html|empty|slow:\d+|[45]\d\d(?::\d+)?|proxy:[45]\d\d)$")


class SpecError(ValueError):
    """Invalid request data (a bad ``sim`` directive, config value or body); maps to HTTP 400."""

    def __init__(self, message: str, field_name: str | None = None) -> None:
        super().__init__(message)
        self.field_name = field_name


# ---------------------------------------------------------------------------- validators


def check_number(value: Any, name: str, lo: float = 0.0, hi: float = math.inf, prefix: str = "") -> float:
    """A finite number in [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpecError(f"{prefix}{name} must be a number", name)
    if not lo <= value <= hi:
        bounds = f"in [{lo:g}, {hi:g}]" if math.isfinite(hi) else f">= {lo:g}"
        raise SpecError(f"{prefix}{name} must be {bounds}", name)
    return float(value)


def check_int(value: Any, name: str, lo: int, hi: int, prefix: str = "") -> int:
    """An integer in [lo, hi] (booleans are not integers here)."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise SpecError(f"{prefix}{name} must be an integer in [{lo}, {hi}]", name)
    return value


def check_bool(value: Any, name: str, prefix: str = "") -> bool:
    if not isinstance(value, bool):
        raise SpecError(f"{prefix}{name} must be a boolean", name)
    return value


def check_choice(value: Any, name: str, choices: Iterable[str], prefix: str = "") -> str:
    options = tuple(choices)
    if value not in options:
        raise SpecError(f"{prefix}{name} must be one of {', '.join(options)}", name)
    return str(value)


def check_status_choice(value: Any, name: str, choices: Iterable[int], prefix: str = "") -> int:
    """An HTTP status (an integer, not a boolean) among ``choices``."""
    options = tuple(choices)
    if isinstance(value, bool) or not isinstance(value, int) or value not in options:
        raise SpecError(f"{prefix}{name} must be one of {', '.join(map(str, options))}", name)
    return value


def check_keys(raw: Any, allowed: Iterable[str], name: str) -> dict[str, Any]:
    """A JSON object whose keys are all in ``allowed``."""
    if not isinstance(raw, dict):
        raise SpecError(f"{name} must be an object", name)
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise SpecError(f"unknown {name} field(s): {', '.join(unknown)}", unknown[0])
    return raw


def check_faults(value: Any, name: str, prefix: str = "sim.", extra: Iterable[str] = ()) -> tuple[str, ...]:
    """A list of injected faults (``extra`` names more accepted values)."""
    if not isinstance(value, list) or not all(isinstance(f, str) for f in value):
        raise SpecError(f"{prefix}{name} must be a list of strings", name)
    allowed = frozenset(extra)
    for fault in value:
        if fault not in allowed and not _FAULT_RE.match(fault):
            raise SpecError(f"{prefix}{name}: unknown fault {fault!r}", name)
    return tuple(value)


# ---------------------------------------------------------------------------- the spec


#: The hints a status reply may carry (the design note's; Sume's public docs name none of them).
HINT_FIELDS = ("terminal", "result_ready", "next_poll_after_seconds")


@dataclass(frozen=True)
class JobSpec:
    """Behaviour of one simulated job; times in clock seconds."""

    outcome: str = "completed"
    duration: float = 3.0
    steps: int = 2
    result_delay: float = 0.0
    override_status: str | None = None
    override_reads: int = 0
    faults: tuple[str, ...] = ()
    result_faults: tuple[str, ...] = ()
    hints: bool | None = None
    id_shape: str = "job.id"
    count: int = 1
    insufficient_credits: bool = False
    create_faults: tuple[str, ...] = ()
    not_found_for: float | None = None  # None: the config's default
    forbidden: bool = False
    result_shape: str = "object"
    result_bytes: int = DEFAULT_RESULT_BYTES
    terminal_flag: bool | None = None
    result_not_ready: int | None = None  # None: the config's default
    #: With hints on, which of them the status reply carries (Sume documents none of the three).
    hint_fields: tuple[str, ...] = HINT_FIELDS

    @property
    def success(self) -> bool:
        return self.outcome.lower() in SUCCESS_STATUSES

    @property
    def failure_code(self) -> str | None:
        return FAILURE_CODES.get(self.outcome.lower())

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        override = {"status": self.override_status, "reads": self.override_reads}
        data["status_override"] = override if self.override_status is not None else None
        del data["override_status"], data["override_reads"]
        for name in ("faults", "result_faults", "create_faults"):
            data[name] = list(data[name])
        return data


SPEC_FIELDS = frozenset(
    {
        "outcome", "duration", "steps", "result_delay", "status_override", "faults", "result_faults",
        "hints", "id_shape", "count", "insufficient_credits", "create_faults", "not_found_for",
        "forbidden", "result_shape", "result_bytes", "terminal_flag", "result_not_ready", "hint_fields",
    }
)


def _optional_bool(raw: dict[str, Any], name: str) -> bool | None:
    value = raw.get(name)
    return None if value is None else check_bool(value, name, "sim.")


def _override(raw: dict[str, Any]) -> tuple[str | None, int]:
    override = raw.get("status_override")
    if override is None:
        return None, 0
    if not isinstance(override, dict) or not isinstance(override.get("status"), str):
        raise SpecError('sim.status_override must be {"status": str, "reads": int}', "status_override")
    return override["status"], check_int(override.get("reads", 1), "reads", 0, 1_000_000, "sim.status_override.")


def parse_spec(kind: str, raw: Any) -> JobSpec:
    """Validate a ``sim`` directive object for a job of ``kind``; raise :class:`SpecError`."""
    raw = check_keys({} if raw is None else raw, SPEC_FIELDS, "sim")
    outcome = raw.get("outcome", "completed")
    if not isinstance(outcome, str) or not outcome:
        raise SpecError("sim.outcome must be a non-empty string", "outcome")
    override_status, override_reads = _override(raw)
    id_shape = check_choice(raw.get("id_shape", "job_ids" if kind == "face_swap" else "job.id"),
                            "id_shape", ID_SHAPES, "sim.")
    not_found_for = raw.get("not_found_for")
    not_ready = raw.get("result_not_ready")
    return JobSpec(
        outcome=outcome,
        duration=check_number(raw.get("duration", DEFAULT_DURATION.get(kind, 3.0)), "duration", prefix="sim."),
        steps=check_int(raw.get("steps", 2), "steps", 1, 10_000, "sim."),
        result_delay=check_number(raw.get("result_delay", 0.0), "result_delay", prefix="sim."),
        override_status=override_status,
        override_reads=override_reads,
        faults=check_faults(raw.get("faults", []), "faults"),
        result_faults=check_faults(raw.get("result_faults", []), "result_faults"),
        hints=_optional_bool(raw, "hints"),
        id_shape=id_shape,
        count=check_int(raw.get("count", 2), "count", 1, 100, "sim.") if id_shape == "job_ids" else 1,
        insufficient_credits=check_bool(raw.get("insufficient_credits", False), "insufficient_credits", "sim."),
        create_faults=check_faults(raw.get("create_faults", []), "create_faults"),
        not_found_for=None if not_found_for is None else check_number(not_found_for, "not_found_for", prefix="sim."),
        forbidden=check_bool(raw.get("forbidden", False), "forbidden", "sim."),
        result_shape=check_choice(raw.get("result_shape", "object"), "result_shape", RESULT_SHAPES, "sim."),
        result_bytes=check_int(raw.get("result_bytes", DEFAULT_RESULT_BYTES), "result_bytes", 1, 50_000_000, "sim."),
        terminal_flag=_optional_bool(raw, "terminal_flag"),
        result_not_ready=None if not_ready is None else check_status_choice(
            not_ready, "result_not_ready", RESULT_NOT_READY_STATUSES, "sim."),
        hint_fields=_hint_fields(raw.get("hint_fields", list(HINT_FIELDS))),
    )


def _hint_fields(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise SpecError("sim.hint_fields must be a list of hint names", "hint_fields")
    for name in value:
        check_choice(name, "hint_fields", HINT_FIELDS, "sim.")
    return tuple(value)

"""One simulated job: its timeline in clock seconds and the views the API renders of it.

A job is fixed at creation by its :class:`~tools.sume_sim.spec.JobSpec`: ``steps`` active phases
(cycling queued/running/processing) over equal slices of ``duration``, then the outcome, then,
for a success, the result after ``result_delay``. Its state at any clock time is computed from
the creation time alone, so nothing needs to tick. The job also keeps its read counters and the
cursors of its injected faults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tools.sume_sim.spec import ACTIVE_CYCLE, DEFAULT_WORKSPACE, HINT_FIELDS, SUME_TYPES, JobSpec

_EPSILON = 1e-9


def iso(clock_ts: float) -> str:
    """An ISO-8601 UTC timestamp (milliseconds) of clock time ``clock_ts``."""
    try:
        moment = datetime.fromtimestamp(clock_ts, UTC)
    except (OverflowError, OSError, ValueError):  # far-compressed clocks can leave datetime's range
        moment = datetime.max.replace(tzinfo=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def hint_value(remaining: float | None, exact: bool) -> float | int:
    """``next_poll_after_seconds``: whole clock seconds rounded up (min 1), or exact to the ms;
    0 when nothing is left to wait for."""
    if remaining is None or remaining <= 0:
        return 0
    if exact:
        return max(0.001, round(remaining, 3))
    return max(1, math.ceil(remaining - _EPSILON))


@dataclass(frozen=True)
class JobState:
    status: str
    terminal: bool
    success: bool
    result_ready: bool
    next_event: float | None  # clock time of the next change; None when nothing is left
    updated_at: float  # clock time of the last status change


@dataclass
class Job:
    id: str
    kind: str
    spec: JobSpec
    created: float  # clock seconds
    not_found_for: float
    result_url: str
    webhook_url: str | None = None
    workspace: str = DEFAULT_WORKSPACE  # the workspace of the key that created it
    status_reads: int = 0
    result_reads: int = 0
    fault_cursor: int = 0
    result_fault_cursor: int = 0
    override_served: int = 0
    first_read: float | None = None  # clock time of the first status read
    first_any_read: float | None = None  # clock time of the first read of either route
    #: A status read answered the job's terminal status (no override) and with it all a client needs:
    #: a failure, a ready result, or no hints (then readiness cannot be read from the status).
    terminal_served: bool = False
    status_reads_after_terminal: int = 0  # status reads that came after that answer

    @property
    def sume_type(self) -> str:
        return SUME_TYPES[self.kind]

    @property
    def terminal_at(self) -> float:
        return self.created + self.spec.duration

    @property
    def ready_at(self) -> float:
        return self.terminal_at + self.spec.result_delay

    @property
    def visible_at(self) -> float:
        """Before this clock time reads of the job answer 404 (read-after-create lag)."""
        return self.created + self.not_found_for

    def _slice(self) -> float:
        return self.spec.duration / self.spec.steps

    # ------------------------------------------------------------------ state

    def state(self, now: float) -> JobState:
        if now >= self.terminal_at:
            success = self.spec.success
            ready = success and now >= self.ready_at
            pending_ready = self.ready_at if success and not ready else None
            return JobState(self.spec.outcome, True, success, ready, pending_ready, self.terminal_at)
        slice_len = self._slice()
        phase = min(int((now - self.created) // slice_len), self.spec.steps - 1) if slice_len > 0 else 0
        next_event = self.created + (phase + 1) * slice_len
        return JobState(ACTIVE_CYCLE[phase % len(ACTIVE_CYCLE)], False, False, False, next_event,
                        self.created + phase * slice_len)

    def listed_state(self, now: float, lag: float) -> JobState:
        """The state a list shows: a terminal status only ``lag`` clock seconds after it happened,
        the last active phase until then."""
        state = self.state(now)
        if not state.terminal or now >= self.terminal_at + lag:
            return state
        last = self.spec.steps - 1
        return JobState(ACTIVE_CYCLE[last % len(ACTIVE_CYCLE)], False, False, False, self.terminal_at,
                        self.created + last * self._slice())

    def min_reads(self, hints: bool = True) -> int:
        """Status reads a client obeying every hint exactly needs from its first read on: 1 + the
        changes (phase boundaries, result becoming ready) still ahead then; ``steps + 1`` before any
        read. A first read inside the not-found lag adds itself and counts from the lag's end. The
        result becoming ready is a change only when the status replies carry ``hints`` (without
        them ``result_ready`` is not in the reply: the terminal status is the last change)."""
        if self.first_read is None:
            return self.spec.steps + 1
        t, extra = self.first_read, 0
        if t < self.visible_at:
            t, extra = self.visible_at, 1
        slice_len = self._slice()
        ahead = sum(1 for i in range(1, self.spec.steps + 1) if self.created + i * slice_len > t)
        if hints and self.spec.result_delay > 0 and self.spec.success and self.ready_at > t:
            ahead += 1
        return extra + 1 + ahead

    # ------------------------------------------------------------------ faults

    def take_fault(self) -> str | None:
        """The next injected status-read fault, consumed."""
        if self.fault_cursor >= len(self.spec.faults):
            return None
        self.fault_cursor += 1
        return self.spec.faults[self.fault_cursor - 1]

    def take_result_fault(self) -> str | None:
        if self.result_fault_cursor >= len(self.spec.result_faults):
            return None
        self.result_fault_cursor += 1
        return self.spec.result_faults[self.result_fault_cursor - 1]

    def take_override(self) -> str | None:
        """The overriding status for this read, if the spec still has override reads to serve."""
        if self.spec.override_status is None or self.override_served >= self.spec.override_reads:
            return None
        self.override_served += 1
        return self.spec.override_status

    # ------------------------------------------------------------------ views

    def view(self, now: float, *, hints: bool, exact: bool, override: str | None = None) -> dict[str, Any]:
        """The ``job`` object of a status reply."""
        state = self.state(now)
        ready = state.success and state.result_ready
        view: dict[str, Any] = {
            "id": self.id,
            "type": self.sume_type,
            "status": state.status,
            "error": None,
            "created_at": iso(self.created),
            "updated_at": iso(state.updated_at),
            "result_url": self.result_url if ready else None,
        }
        code = self.spec.failure_code
        if state.terminal and not state.success and code is not None:
            view["error"] = {"code": code, "message": f"job {state.status}: simulated {code}"}
        if override is not None:
            view.update(status=override, error=None, result_url=None)
        if hints:
            remaining = None if state.next_event is None else state.next_event - now
            view["terminal"] = state.terminal and override is None
            view["result_ready"] = state.result_ready and override is None
            view["next_poll_after_seconds"] = hint_value(1.0 if override is not None else remaining, exact)
            if self.spec.terminal_flag is not None:
                view["terminal"] = self.spec.terminal_flag
            for name in set(HINT_FIELDS) - set(self.spec.hint_fields):
                del view[name]
        return view

    def list_item(self, now: float, lag: float, full: bool, with_status: bool = True) -> dict[str, Any]:
        state = self.listed_state(now, lag)
        item = {"id": self.id, "type": self.sume_type}
        if with_status:
            item["status"] = state.status
        if full:
            item.update(created_at=iso(self.created), updated_at=iso(state.updated_at))
        return item

    def result(self) -> dict[str, Any]:
        """The ``result`` object of a completed job, by kind."""
        if self.kind in ("video", "ad_video"):
            return {
                "url": self.result_url,
                "width": 1080,
                "height": 1920,
                "duration_seconds": 15.0 if self.kind == "ad_video" else 8.0,
                "format": "mp4",
            }
        if self.kind == "reference_analysis":
            return {
                "url": self.result_url,
                "width": 1024,
                "height": 1024,
                "summary": "simulated reference analysis",
                "tags": ["portrait", "studio", "warm-light"],
            }
        return {"url": self.result_url, "width": 1024, "height": 1024, "format": "png"}

    def result_body(self, request_id: str) -> Any:
        """The whole body of a 200 result reply, in the spec's ``result_shape``."""
        shape = self.spec.result_shape
        if shape == "list":
            return [self.result()]
        if shape == "string":
            return self.result_url
        body: dict[str, Any] = {"job_id": self.id, "type": self.sume_type, "result": self.result()}
        if shape == "large":
            body["result"]["frames"] = "A" * self.spec.result_bytes  # the body exceeds result_bytes
        return {**body, "request_id": request_id}

    def webhook_event(self) -> tuple[str, float] | None:
        """(event suffix, clock time) of the webhook this job triggers: ``ready`` when a success's
        result is ready, ``failed`` when it fails, cancels or expires; None for other outcomes."""
        if self.spec.success:
            return "ready", self.ready_at
        if self.spec.failure_code is not None:
            return "failed", self.terminal_at
        return None

"""The terminal event: one per job on EventBridge, built from the record, never with a payload.

Source ``sume.poller``, detail-type ``Sume Job Terminal``. Consumers dedupe on ``event_id``
(``<job_id>:terminal``) and read the result from the table (or S3) - no result payload, media
URL or error detail beyond Sume's sanitized code and message goes on the bus.

``version`` is the detail's schema (:data:`EVENT_VERSION`); a version only adds fields, so a
consumer of an older one reads a newer one. Version 1 (no ``version`` field) had no
``idempotency_key``; version 2 adds it: the submission's idempotency key (the caller's own, or the
one submit derived and answered), so a caller answered ``queued`` - no job id yet - recognises its
job's event by its own id alone. A create that started several jobs (a face swap) gives each of
their events the same key.
"""

from __future__ import annotations

import json
from typing import Any

from ..core.aws import client

EVENT_SOURCE = "sume.poller"
EVENT_DETAIL_TYPE = "Sume Job Terminal"
#: The detail's schema version (see the module docstring).
EVENT_VERSION = 2


def terminal_event(job_id: str, record: dict[str, Any]) -> dict[str, Any]:
    """The event's detail (schema pinned by the contract tests)."""
    location = "s3" if "result_s3_key" in record else "table" if "result_json" in record else None
    return {
        "version": EVENT_VERSION,
        "event_id": f"{job_id}:terminal",
        "job_id": job_id,
        "key": record.get("key"),  # the job's Sume key (None: a record from before keys, the default key)
        "idempotency_key": record.get("idempotency_key"),  # None: a registered job, submitted elsewhere
        "kind": record.get("kind"),
        "status": record.get("status"),
        "sume_status": record.get("sume_status"),
        "error": record.get("error"),
        "result_available": location is not None,
        "result_location": location,
        "terminal_at": record.get("terminal_at"),
        "reads": record.get("reads"),
    }


class EventBus:
    def __init__(self, bus_name: str, events: Any = None) -> None:
        self.bus_name = bus_name
        self._events = events

    def put_terminal(self, job_id: str, record: dict[str, Any]) -> None:
        if self._events is None:  # most poll invocations never need it: created on first use
            self._events = client("events")
        reply = self._events.put_events(Entries=[{
            "Source": EVENT_SOURCE,
            "DetailType": EVENT_DETAIL_TYPE,
            "Detail": json.dumps(terminal_event(job_id, record), separators=(",", ":")),
            "EventBusName": self.bus_name,
        }])
        if reply.get("FailedEntryCount"):
            raise RuntimeError(f"PutEvents refused the terminal event: {reply['Entries'][0].get('ErrorCode')}")

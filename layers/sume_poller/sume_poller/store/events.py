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

PutEvents is sent once per call (:data:`EVENTS_CONFIG`: no SDK retry): it runs under the outbox's
publish claim (:mod:`sume_poller.poll.outbox`), whose expiry is the retry - botocore's standard retry
re-sent a call EventBridge had taken but answered late, a raw duplicate. A call that fails says
whether the event may be on the bus: :class:`PublishRefused` (EventBridge answered no, or no
request left: it is not) or :class:`PublishUnknown` (no answer to a request sent: it may be).
"""

from __future__ import annotations

import json
from typing import Any

from botocore.config import Config
from botocore.exceptions import ClientError, ConnectTimeoutError, EndpointConnectionError

from ..core.aws import CONNECT_TIMEOUT, READ_TIMEOUT, client

EVENT_SOURCE = "sume.poller"
EVENT_DETAIL_TYPE = "Sume Job Terminal"
#: The detail's schema version (see the module docstring).
EVENT_VERSION = 2
#: One attempt per PutEvents (the publish claim's expiry is the retry), the shared timeouts.
EVENTS_CONFIG = Config(retries={"mode": "standard", "total_max_attempts": 1})
#: The longest one PutEvents call takes (real seconds): its connect and read timeouts.
CALL_MAX_REAL = float(CONNECT_TIMEOUT + READ_TIMEOUT)


class PublishRefused(RuntimeError):
    """The event is not on the bus: EventBridge refused it, or the request never left."""


class PublishUnknown(RuntimeError):
    """The request was sent and no answer came (a timeout, a connection closed): it may be on the bus."""




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

    @property
    def events(self) -> Any:
        if self._events is None:  # most poll invocations never need it: created on first use
            self._events = client("events", EVENTS_CONFIG)
        return self._events

    def put_terminal(self, job_id: str, record: dict[str, Any]) -> None:
        """One PutEvents of the job's terminal event; :class:`PublishRefused` or :class:`PublishUnknown`."""
        try:
            reply = self.events.put_events(Entries=[{
                "Source": EVENT_SOURCE,
                "DetailType": EVENT_DETAIL_TYPE,
                "Detail": json.dumps(terminal_event(job_id, record), separators=(",", ":")),
                "EventBusName": self.bus_name,
            }])
        except ClientError as exc:  # EventBridge answered; a 5xx does not say the event was not taken
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            raise (PublishUnknown if status >= 500 else PublishRefused)(
                f"PutEvents answered {status}: {exc.response.get('Error', {}).get('Code')}") from exc
        except (ConnectTimeoutError, EndpointConnectionError) as exc:
            raise PublishRefused(f"PutEvents not sent: {type(exc).__name__}") from exc
        except Exception as exc:  # a read timeout, a connection closed: the request may have been taken
            raise PublishUnknown(f"PutEvents sent, no answer: {type(exc).__name__}") from exc
        if reply.get("FailedEntryCount"):
            raise PublishRefused(f"PutEvents refused the terminal event: {reply['Entries'][0].get('ErrorCode')}")

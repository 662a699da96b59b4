"""EventBridge in process, under a real botocore client: the layer's own retries run as configured.

The poll function's events client is a real boto3 client with the layer's configuration
(:data:`sume_poller.core.aws.CLIENT_CONFIG`: standard retry mode, 2 attempts, a 3 s read timeout); only
the HTTP exchange is replaced (botocore's ``before-send`` hook answers instead of the network), so
botocore's retry handler decides, as it would in Lambda, whether an attempt is sent again. Each
attempt is a scheduler point, and the scheduler may make it: accepted (the event is on the bus);
refused (``FailedEntryCount``); throttled; timed out before EventBridge saw it; or **accepted and
then timed out** - the event is on the bus but the caller waited out its read timeout, which
botocore's standard mode retries.

Every ``PutEvents`` call (one layer call, all its attempts) is recorded: who made it, how many of its
attempts EventBridge accepted, and how it ended for the caller (returned, raised, or the caller
was killed before it returned) - what the one-event invariant needs to tell a duplicate whose outcome
was unknown from one that was not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import boto3
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ReadTimeoutError

_SESSION: list[boto3.session.Session] = []
#: One events client per configuration per process (building one costs ~3 ms): each run resets what it
#: keeps between calls (the retry quota) and points its hooks at the run's world.
_CLIENTS: dict[int, tuple[Any, list[EventsWorld]]] = {}


def session() -> boto3.session.Session:
    """One boto3 session per process (a client built from it costs ~3 ms; a new session ~60)."""
    if not _SESSION:
        _SESSION.append(boto3.session.Session(aws_access_key_id="sim", aws_secret_access_key="sim",
                                              region_name="us-east-1"))
    return _SESSION[0]


@dataclass
class Accepted:
    job_id: str
    event_id: str
    detail: dict[str, Any]
    actor: str
    call: int
    at: float


@dataclass
class Call:
    id: int
    actor: Any
    job_id: str
    attempts: int = 0
    accepted: int = 0
    #: "ok" (returned to the caller), "error" (raised to it), None (the caller was killed first).
    outcome: str | None = None


@dataclass
class EventsWorld:
    sched: Any
    faults: Any
    accepted: list[Accepted] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    #: Told of each attempt: (job id, what happened to it).
    observers: list[Any] = field(default_factory=list)
    _open: dict[int, Call] = field(default_factory=dict)

    def client(self, config: Any) -> Any:
        """An events client with ``config`` (the layer's), answered by this world."""
        cached = _CLIENTS.get(id(config))
        if cached is None or not _reset_quota(cached[0]):
            client = session().client("events", config=config, endpoint_url="https://events.sim.invalid")
            current: list[EventsWorld] = [self]
            client.meta.events.register("before-call.events.PutEvents", lambda **kw: current[0]._before_call(**kw))
            client.meta.events.register("before-send.events.PutEvents", lambda **kw: current[0]._send(**kw))  # type: ignore[arg-type]
            client.meta.events.register("after-call.events.PutEvents", lambda **kw: current[0]._after_call(**kw))
            client.meta.events.register("after-call-error.events.PutEvents",
                                        lambda **kw: current[0]._after_error(**kw))
            cached = _CLIENTS[id(config)] = (client, current)
        cached[1][0] = self
        return cached[0]

    def _key(self) -> int:
        return id(self.sched.current)

    def _before_call(self, params: dict[str, Any], **_: Any) -> None:
        body = params["body"]
        detail = json.loads(json.loads(body.decode() if isinstance(body, bytes) else body)["Entries"][0]["Detail"])
        call = Call(len(self.calls) + 1, self.sched.current, str(detail.get("job_id")))
        self.calls.append(call)
        self._open[self._key()] = call

    def _after_call(self, **_: Any) -> None:
        call = self._open.pop(self._key(), None)
        if call is not None:
            call.outcome = "ok"

    def _after_error(self, **_: Any) -> None:
        call = self._open.pop(self._key(), None)
        if call is not None:
            call.outcome = "error"

    def _send(self, request: Any, **_: Any) -> AWSResponse:
        call = self._open.get(self._key())
        body = json.loads(request.body)
        entry = body["Entries"][0]
        detail = json.loads(entry["Detail"])
        job_id = str(detail.get("job_id"))
        self.sched.point(f"events PutEvents {job_id}")
        if call is not None:
            call.attempts += 1
        fault = self.faults.pick("events", ("refuse", "throttle", "timeout", "accept_timeout"))
        for observer in self.observers:
            observer(job_id, f"PutEvents attempt {call.attempts if call else '?'}: {fault or 'accepted'}")
        if fault in ("timeout", "accept_timeout"):
            if fault == "accept_timeout":
                self._accept(job_id, detail, call)
            self.sched.note_fault(f"events {fault} {job_id}")
            self.sched.sleep(3.0, "events read timeout")  # the client's read timeout (CLIENT_CONFIG)
            raise ReadTimeoutError(endpoint_url=request.url)
        if fault == "throttle":
            self.sched.note_fault(f"events throttled {job_id}")
            return _response(request.url, 400, {"__type": "ThrottlingException", "message": "Rate exceeded"})
        if fault == "refuse":
            self.sched.note_fault(f"events refused {job_id}")
            return _response(request.url, 200, {"FailedEntryCount": 1, "Entries": [
                {"ErrorCode": "InternalFailure", "ErrorMessage": "simulated"}]})
        event_id = self._accept(job_id, detail, call)
        return _response(request.url, 200, {"FailedEntryCount": 0, "Entries": [{"EventId": event_id}]})

    def _accept(self, job_id: str, detail: dict[str, Any], call: Call | None) -> str:
        event_id = f"ev-{len(self.accepted) + 1}"
        actor = self.sched.current
        self.accepted.append(Accepted(job_id, event_id, detail, actor.name if actor else "?",
                                      call.id if call else 0, self.sched.now))
        if call is not None:
            call.accepted += 1
        return event_id


def _reset_quota(client: Any) -> bool:
    """Give the client's retry quota (standard mode) its full capacity again; False if it cannot be
    found (then a new client is built)."""
    try:
        handlers = client.meta.events._emitter._unique_id_handlers
        entry = next(v for k, v in handlers.items() if k.startswith("retry-config-"))
        quota = entry["handler"].__self__._retry_quota._quota
        quota._available_capacity = quota._max_capacity
    except (AttributeError, KeyError, StopIteration):
        return False
    return True


def _response(url: str, status: int, body: dict[str, Any]) -> AWSResponse:
    headers: Any = {"x-amzn-RequestId": "sim"}
    response = AWSResponse(url, status, headers, None)
    response._content = json.dumps(body).encode()  # type: ignore[attr-defined]  # its body, read by botocore
    return response

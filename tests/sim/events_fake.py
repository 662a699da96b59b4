"""EventBridge in process, under a real botocore client: the layer's own retries run as configured.

The poll function's events client is a real boto3 client built with the configuration the layer
builds its own with (:func:`EventsWorld.layer_client` stands in for ``sume_poller.core.aws.client``
in the events module: the module's config merged over ``CLIENT_CONFIG``); only the HTTP exchange is
replaced (botocore's ``before-send`` hook answers instead of the network), so botocore's retry
handler decides, as it would in Lambda, whether an attempt is sent again. An attempt is two scheduler
points (it reaches EventBridge, its answer comes back), each within the client's connect or read
timeout or failing as the client would; and the scheduler may make it: accepted (the event is on the
bus); refused (``FailedEntryCount``); throttled; timed out before EventBridge saw it; or **accepted
and then timed out** - the event is on the bus but the caller waited out its read timeout.

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
from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError

_SESSION: list[boto3.session.Session] = []
#: One events client per configuration per process (building one costs ~3 ms): each run resets what it
#: keeps between calls (the retry quota) and points its hooks at the run's world.
_CLIENTS: dict[tuple[tuple[str, str], ...], tuple[Any, list[EventsWorld]]] = {}


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
        """An events client with ``config`` (what the layer builds its own with), answered by this world."""
        key = _config_key(config)
        cached = _CLIENTS.get(key)
        if cached is None or not _reset_quota(cached[0]):
            client = session().client("events", config=config, endpoint_url="https://events.sim.invalid")
            current: list[EventsWorld] = [self]
            timeouts = (float(getattr(client.meta.config, "connect_timeout", 60)),
                        float(getattr(client.meta.config, "read_timeout", 60)))
            client.meta.events.register("before-call.events.PutEvents", lambda **kw: current[0]._before_call(**kw))
            client.meta.events.register("before-send.events.PutEvents",
                                        lambda **kw: current[0]._send(timeouts=timeouts, **kw))  # type: ignore[arg-type]
            client.meta.events.register("after-call.events.PutEvents", lambda **kw: current[0]._after_call(**kw))
            client.meta.events.register("after-call-error.events.PutEvents",
                                        lambda **kw: current[0]._after_error(**kw))
            cached = _CLIENTS[key] = (client, current)
        cached[1][0] = self
        return cached[0]

    def layer_client(self, service: str, config: Any = None) -> Any:
        """:func:`sume_poller.core.aws.client` for the events module: the client the layer would build
        (its ``config`` merged over ``CLIENT_CONFIG``, as that function merges it), answered here."""
        from sume_poller.core.aws import CLIENT_CONFIG

        assert service == "events", service
        return self.client(CLIENT_CONFIG if config is None else CLIENT_CONFIG.merge(config))

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

    def _send(self, request: Any, timeouts: tuple[float, float], **_: Any) -> AWSResponse:
        """One attempt: it reaches EventBridge at the scheduler's next pick of this actor - past the
        client's connect timeout it never did (the client's connect timeout) - and its answer comes back
        at the next - past the read timeout it is lost (the event, if taken, is on the bus)."""
        call = self._open.get(self._key())
        body = json.loads(request.body)
        entry = body["Entries"][0]
        detail = json.loads(entry["Detail"])
        job_id = str(detail.get("job_id"))
        connect, read = timeouts
        sent = self.sched.now
        self.sched.point(f"events PutEvents {job_id}")
        if call is not None:
            call.attempts += 1
        if self.sched.now - sent > connect:
            self._tell(job_id, call, "connect timeout (the caller was paused)")
            raise ConnectTimeoutError(endpoint_url=request.url)
        fault = self.faults.pick("events", ("refuse", "throttle", "timeout", "accept_timeout"))
        self._tell(job_id, call, fault or "accepted")
        if fault in ("timeout", "accept_timeout"):
            if fault == "accept_timeout":
                self._accept(job_id, detail, call)
            self.sched.note_fault(f"events {fault} {job_id}")
            self.sched.sleep(read, "events read timeout")
            raise ReadTimeoutError(endpoint_url=request.url)
        if fault == "throttle":
            self.sched.note_fault(f"events throttled {job_id}")
            reply = _response(request.url, 400, {"__type": "ThrottlingException", "message": "Rate exceeded"})
        elif fault == "refuse":
            self.sched.note_fault(f"events refused {job_id}")
            reply = _response(request.url, 200, {"FailedEntryCount": 1, "Entries": [
                {"ErrorCode": "InternalFailure", "ErrorMessage": "simulated"}]})
        else:
            event_id = self._accept(job_id, detail, call)
            reply = _response(request.url, 200, {"FailedEntryCount": 0, "Entries": [{"EventId": event_id}]})
        answered = self.sched.now
        self.sched.point(f"events PutEvents {job_id} reply")
        if self.sched.now - answered > read:
            self._tell(job_id, call, "read timeout (the caller was paused): the answer is lost")
            raise ReadTimeoutError(endpoint_url=request.url)
        return reply

    def _tell(self, job_id: str, call: Call | None, what: str) -> None:
        for observer in self.observers:
            observer(job_id, f"PutEvents attempt {call.attempts if call else '?'}: {what}")

    def _accept(self, job_id: str, detail: dict[str, Any], call: Call | None) -> str:
        event_id = f"ev-{len(self.accepted) + 1}"
        actor = self.sched.current
        self.accepted.append(Accepted(job_id, event_id, detail, actor.name if actor else "?",
                                      call.id if call else 0, self.sched.now))
        if call is not None:
            call.accepted += 1
        return event_id


def _config_key(config: Any) -> tuple[tuple[str, str], ...]:
    """What a botocore ``Config`` sets (equal configurations, one client)."""
    return tuple(sorted((k, repr(v)) for k, v in getattr(config, "_user_provided_options", {}).items()))


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

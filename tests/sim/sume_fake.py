"""Sume in process: the project's simulator model (``tools.sume_sim``) behind the real ``SumeClient``.

The client's ``urllib3`` pool is replaced by :class:`Transport`, which routes each request through
the simulator's own HTTP routing (:func:`tools.sume_sim.http.handle`) to its model, on the
simulation's clock, and hands the reply back as a real ``urllib3.HTTPResponse`` - so the client's
parsing, rate-limit headers, streaming of large results and error mapping all run as they do
against the simulator's server. A request is two scheduler points: when it reaches Sume (the model
answers then) and when the reply reaches the caller, so reads have a duration and others run
meanwhile. A ``slow:`` fault or a long answer takes its time on the clock; past the call's timeout the
caller gets urllib3's read timeout (Sume did the work and counted the read). The scheduler may also
refuse the connection (no request reaches Sume: urllib3 retries a connect error once, so this is
two in a row).

Reads of one job are watched (:attr:`Transport.watch`): the invariant that no two of them are in
flight at once is checked where a read starts.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from urllib3 import HTTPResponse
from urllib3._collections import HTTPHeaderDict
from urllib3.exceptions import MaxRetryError, NewConnectionError, ReadTimeoutError

from tools.sume_sim.http import handle

BASE = "http://sume.sim.invalid/api/v1"


def _timeout_of(timeout: Any) -> float:
    """The seconds a call may take (urllib3's Timeout: its total and its read timeout)."""
    values = [getattr(timeout, "total", None), getattr(timeout, "_read", None)]
    numbers = [float(v) for v in values if isinstance(v, int | float)]
    return min(numbers) if numbers else 10.0


def job_of(path: str) -> tuple[str, str] | None:
    """("status" | "result", job id) for a per-job route, else None."""
    parts = path.split("?")[0].strip("/").split("/")
    if len(parts) >= 4 and parts[2] == "jobs":
        if len(parts) == 4:
            return "status", parts[3]
        if len(parts) == 5 and parts[4] == "result":
            return "result", parts[3]
    return None


class Transport:
    """Stands in for ``urllib3.PoolManager`` in :class:`sume_poller.sume.client.SumeClient`."""

    def __init__(self, sched: Any, faults: Any, model: Any) -> None:
        self.sched = sched
        self.faults = faults
        self.model = model
        #: Told of each per-job read: (phase "start" | "end", route, job id, actor).
        self.watch: list[Callable[[str, str, str, Any], None]] = []
        #: Told of each create's answer: (idempotency key, status, body, actor).
        self.creates: list[Callable[[str, int, bytes, Any], None]] = []
        #: Every request: (clock, method, path, status or error).
        self.log: list[tuple[float, str, str, Any]] = []

    def request(self, method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None,
                preload_content: bool = False, timeout: Any = None, **_: Any) -> HTTPResponse:
        parts = urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        read = job_of(parts.path)
        label = f"sume {method} {parts.path.rsplit('/api/v1', 1)[-1]}"
        self.sched.point(label)
        if self.faults.take("sume_connect"):
            self.sched.note_fault(f"sume connect refused {label}")
            raise MaxRetryError(None, url, NewConnectionError(None, "Connection refused (simulated)"))  # type: ignore[arg-type]
        actor = self.sched.current
        if read is not None:
            for watcher in self.watch:
                watcher("start", read[0], read[1], actor)
        try:
            reply = handle(self.model, method, target, headers or {}, body or b"")
            self.log.append((self.sched.now, method, target, reply.status))
            if method == "POST" and read is None:  # a create: told as Sume answers it, whether or not the caller hears
                key = (headers or {}).get("Idempotency-Key", "")
                for told in self.creates:
                    told(key, reply.status, reply.body, actor)
            took = reply.delay + (self.faults.latency() if method == "GET" else 0.0)
            limit = _timeout_of(timeout)
            if took >= limit:
                self.sched.sleep(limit, "sume read timeout")
                self.log.append((self.sched.now, method, target, "read timeout"))
                raise ReadTimeoutError(None, url, "Read timed out (simulated)")  # type: ignore[arg-type]
            if took > 0:
                self.sched.sleep(took, "sume slow reply")
            else:
                answered = self.sched.now
                self.sched.point(f"{label} reply")
                if self.sched.now - answered > limit:  # the caller was paused past its timeout
                    raise ReadTimeoutError(None, url, "Read timed out (simulated: the caller was paused)")  # type: ignore[arg-type]
        finally:
            if read is not None:
                for watcher in self.watch:
                    watcher("end", read[0], read[1], actor)
        headers_out = HTTPHeaderDict()
        for name, value in reply.headers:
            headers_out.add(name, value)
        headers_out["Content-Type"] = reply.content_type
        headers_out["Content-Length"] = str(len(reply.body))
        return HTTPResponse(body=io.BytesIO(reply.body), headers=headers_out, status=reply.status,
                            preload_content=False, decode_content=False, request_method=method, request_url=url)

"""The simulator's HTTP surface: a ``ThreadingHTTPServer`` on 127.0.0.1 over the model.

It routes the public API (``/api/v1/...``, see ``README.md``) and the control API (``/_sim/...``,
no auth, no latency) onto :class:`~tools.sume_sim.model.Model` and renders replies: JSON bodies,
``X-Request-Id``, the model's headers, ``latency_ms`` before every public request and the
delay of ``slow:`` faults. Keep-alive connections are tracked so that stopping drops them.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

from tools.sume_sim.model import ERROR_CODES, Model, Reply, Request, new_request_id
from tools.sume_sim.spec import SpecError

API_PREFIX = "/api/v1"
CONTROL_PREFIX = "/_sim"
CREATE_ROUTES: dict[str, str] = {
    "images/generations": "image",
    "videos/generations": "video",
    "ads/videos": "ad_video",
    "face-swap": "face_swap",
    "reference-analysis": "reference_analysis",
}
MAX_BODY_BYTES = 1_000_000


class Headers(Protocol):
    """Case-insensitive header lookup (``email.message.Message``, urllib3's dicts, plain dicts)."""

    def get(self, name: str, /) -> Any: ...


@dataclass(frozen=True)
class Response:
    """A fully rendered HTTP response."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    delay: float = 0.0  # real seconds to wait before writing


def _json(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def render(reply: Reply) -> Response:
    body = reply.raw if reply.raw is not None else _json(reply.body)
    headers = (("X-Request-Id", reply.request_id), *reply.headers)
    return Response(reply.status, body, reply.content_type, headers, reply.delay)


def api_keys(headers: Headers) -> tuple[str, ...]:
    """The keys a request presents: ``Authorization: Bearer <key>`` and/or ``X-Api-Key``."""
    keys: list[str] = []
    scheme, _, token = (headers.get("Authorization") or "").strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        keys.append(token.strip())
    if headers.get("X-Api-Key"):
        keys.append(str(headers.get("X-Api-Key")).strip())
    return tuple(keys)


def handle(model: Model, method: str, target: str, headers: Headers, body: bytes) -> Response:
    """Route one request to the public or control API."""
    parts = urlsplit(target)
    path = parts.path.rstrip("/") or "/"
    if path == CONTROL_PREFIX or path.startswith(CONTROL_PREFIX + "/"):
        return control(model, method, path[len(CONTROL_PREFIX):].strip("/"), body)
    req = Request(api_keys(headers), new_request_id(), (headers.get("Idempotency-Key") or "").strip() or None)
    if path != API_PREFIX and not path.startswith(API_PREFIX + "/"):
        reply = Reply(404, _error_body("not_found", f"no route for {path}", req.request_id), req.request_id)
        return render(reply)
    route = [unquote(p) for p in path[len(API_PREFIX):].strip("/").split("/")] if path != API_PREFIX else []
    return render(_public(model, req, method, route, parse_qs(parts.query), body))


def _public(model: Model, req: Request, method: str, route: list[str], query: dict[str, list[str]],
            body: bytes) -> Reply:
    joined = "/".join(route)
    if joined in CREATE_ROUTES:
        if method != "POST":
            return model.refuse(req, 405, f"{method} not allowed")
        return model.create(req, CREATE_ROUTES[joined], body)
    if route and route[0] == "jobs" and method != "GET":
        return model.refuse(req, 405, f"{method} not allowed")
    if route == ["jobs"]:
        return model.list_jobs(req, query)
    if len(route) == 2 and route[0] == "jobs":
        return model.read_status(req, route[1])
    if len(route) == 3 and route[0] == "jobs" and route[2] == "result":
        return model.read_result(req, route[1])
    return model.refuse(req, 404, f"no route for {API_PREFIX}/{joined}")


def _error_body(code: str, message: str, request_id: str | None = None,
                details: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"error": {"code": code, "message": message, "details": details or {}}}
    return body if request_id is None else {**body, "request_id": request_id}


# ---------------------------------------------------------------------------- control API


def control(model: Model, method: str, route: str, body: bytes) -> Response:
    """``/_sim/...``: stats, config, jobs, budget, webhooks, keys, reset."""

    def reply(status: int, payload: Any) -> Response:
        return Response(status, _json(payload))

    try:
        data = json.loads(body) if body.strip() else {}
    except json.JSONDecodeError:
        return reply(400, _error_body("bad_request", "body is not valid JSON"))
    if method == "POST" and not isinstance(data, dict):
        return reply(400, _error_body("bad_request", "body must be a JSON object"))
    handler = _CONTROL_ROUTES.get((method, route))
    try:
        if handler is not None:
            status, payload = handler(model, data)
            return reply(status, payload)
        if method == "GET" and route.startswith("jobs/"):
            job_id = unquote(route[len("jobs/"):])
            info = model.job_info(job_id)
            if info is not None:
                return reply(200, info)
            return reply(404, {"id": job_id, "exists": False, **model.unknown_reads(job_id)})
    except SpecError as exc:
        details = {"field": exc.field_name} if exc.field_name else {}
        return reply(400, _error_body("bad_request", str(exc), details=details))
    return reply(404, _error_body("not_found", f"no control route {method} {CONTROL_PREFIX}/{route}"))


def _seed(model: Model, data: dict[str, Any]) -> tuple[int, Any]:
    job_id = model.seed_job(kind=data.get("kind", "image"), sim=data.get("sim"), job_id=data.get("id"),
                            age=data.get("age", 0), webhook_url=data.get("webhook_url"), key=data.get("key"),
                            workspace=data.get("workspace"))
    return 201, {"id": job_id}


def _rotate_key(model: Model, data: dict[str, Any]) -> tuple[int, Any]:
    extra = sorted(set(data) - {"old", "new"})
    if extra:
        raise SpecError(f"unknown field(s): {', '.join(extra)}", extra[0])
    return 200, model.rotate_key(data.get("old", ""), data.get("new", ""))


def _remove_key(model: Model, data: dict[str, Any]) -> tuple[int, Any]:
    extra = sorted(set(data) - {"key"})
    if extra:
        raise SpecError(f"unknown field(s): {', '.join(extra)}", extra[0])
    return 200, model.remove_key(data.get("key", ""))


def _reset(model: Model, data: dict[str, Any]) -> tuple[int, Any]:
    model.reset()
    return 200, {"ok": True}


_CONTROL_ROUTES: dict[tuple[str, str], Callable[[Model, Any], tuple[int, Any]]] = {
    ("GET", "stats"): lambda m, _: (200, m.stats()),
    ("GET", "config"): lambda m, _: (200, m.config.to_dict()),
    ("POST", "config"): lambda m, data: (200, m.configure(**data)),
    ("GET", "budget"): lambda m, _: (200, m.budget_stats()),
    ("GET", "webhooks"): lambda m, _: (200, m.webhook_stats()),
    ("POST", "reset"): _reset,
    ("POST", "jobs"): _seed,
    ("POST", "keys/add"): lambda m, data: (201, m.add_key(data)),
    ("POST", "keys/rotate"): _rotate_key,
    ("POST", "keys/remove"): _remove_key,
}


# ---------------------------------------------------------------------------- server


class SimServer:
    """Serves one model over HTTP/1.1 keep-alive in a daemon thread."""

    def __init__(self, model: Model, host: str = "127.0.0.1", log_requests: bool = False) -> None:
        self.model = model
        self.host = host
        self.log_requests = log_requests
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self, port: int = 0) -> SimServer:
        handler = type("_BoundSumeHandler", (_SumeHandler,), {"sim_server": self})
        server = ThreadingHTTPServer((self.host, port), handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.01}, name="sume-sim", daemon=True
        )
        self._thread.start()
        return self

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("simulator not started")
        return int(self._server.server_address[1])

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

    def track(self, conn: socket.socket, active: bool) -> None:
        with self._lock:
            if active:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)


class _SumeHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive handler delegating to :func:`handle`."""

    protocol_version = "HTTP/1.1"
    server_version = "sume-sim/2.0"
    timeout = 60  # idle keep-alive connections are closed after this many seconds
    wbufsize = 64 * 1024  # headers and body leave in one send
    sim_server: SimServer  # set on the per-server subclass

    def setup(self) -> None:
        super().setup()
        # Without TCP_NODELAY, small split writes meet delayed ACKs and cost ~40 ms per request.
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sim_server.track(self.connection, True)

    def finish(self) -> None:
        self.sim_server.track(self.connection, False)
        with contextlib.suppress(OSError):
            super().finish()

    def _dispatch(self) -> None:
        model = self.sim_server.model
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True
            status = 400 if length < 0 else 413
            request_id = new_request_id()
            error = _error_body(ERROR_CODES[status], "invalid request body length", request_id)
            self._write(render(Reply(status, error, request_id)))
            return
        body = self.rfile.read(length) if length else b""
        if not urlsplit(self.path).path.startswith(CONTROL_PREFIX):
            time.sleep(model.latency_seconds())
        try:
            response = handle(model, self.command, self.path, self.headers, body)
        except Exception:
            traceback.print_exc(file=sys.stderr)
            request_id = new_request_id()
            response = render(Reply(500, _error_body("internal_error", "simulator bug", request_id), request_id))
        if response.delay > 0:
            time.sleep(response.delay)
        self._write(response)

    def _write(self, response: Response) -> None:
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
        if self.sim_server.log_requests:
            # Paths and status codes only: headers (and so the API key) are never logged.
            sys.stderr.write(f"sume-sim {self.address_string()} {format % args}\n")

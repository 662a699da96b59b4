"""An HTTP forwarder that hands each request to a real endpoint at once and holds back the reply of the
ones it is told to: what a service that takes a call and answers it late does to its client (the request
is processed, the client times out). Counts what it forwarded::

    with SlowReplies(moto.endpoint_url, match=lambda headers: "PutEvents" in headers.get("X-Amz-Target", ""),
                     delay=5.0) as proxy:
        ...  # point the client at proxy.url; proxy.forwarded() is how many matching requests reached moto

Standard library only (a forwarding server of a few dozen lines; mitmproxy and the like are far heavier
and not in this project's environments).
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self
from urllib.parse import urlsplit

#: Hop-by-hop headers a forwarder does not pass on.
_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization",
                  "proxy-authenticate", "content-length", "host"})


class SlowReplies:
    """Forward to ``target`` (``http://host:port``); the reply of a request whose headers ``match`` is
    sent ``delay`` real seconds after the target answered it."""

    def __init__(self, target: str, *, match: Callable[[Mapping[str, str]], bool], delay: float) -> None:
        parts = urlsplit(target)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.match, self.delay = match, delay
        self._count = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="slow-replies", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def forwarded(self) -> int:
        """Matching requests handed to the target so far."""
        with self._lock:
            return self._count

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                slow = proxy.match(self.headers)
                if slow:
                    with proxy._lock:
                        proxy._count += 1
                upstream = http.client.HTTPConnection(proxy.host, proxy.port, timeout=30)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    reply = upstream.getresponse()
                    payload = reply.read()
                finally:
                    upstream.close()
                if slow:
                    time.sleep(proxy.delay)  # the target took the call; its answer comes late
                try:
                    self.send_response(reply.status)
                    for key, value in reply.getheaders():
                        if key.lower() not in _HOP:
                            self.send_header(key, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:  # the client gave up waiting
                    self.close_connection = True

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

        return Handler

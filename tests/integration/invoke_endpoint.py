"""Lambda's Invoke API over the in-process stack's handlers, for tests of a function that invokes
another (the jobs function's POST /jobs): moto cannot run a Lambda without Docker.

A small HTTP server on 127.0.0.1 answers ``POST /2015-03-31/functions/{name}/invocations``
(RequestResponse) for the stack's functions by their physical names: it runs the handler in-process
(:meth:`InProcessStack.invoke`) and answers as Lambda does - the handler's JSON reply, or for an
exception ``X-Amz-Function-Error: Unhandled`` and the Python runtime's error document
(``errorType`` the exception's class name, ``errorMessage`` its text). Point boto3 at it with
``AWS_ENDPOINT_URL_LAMBDA=<url>``; ``invoked`` lists (logical id, event) in order.
"""

from __future__ import annotations

import json
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from tools.stack.inprocess import InProcessStack


class InvokeEndpoint:
    """Lambda's Invoke API (``POST /2015-03-31/functions/{name}/invocations``, RequestResponse)
    over the in-process stack's handlers (see the module docstring)."""

    def __init__(self, stack: InProcessStack) -> None:
        names = {spec.function_name: lid for lid, spec in stack.specs.items()}
        self.invoked: list[tuple[str, Any]] = []
        invoked = self.invoked

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                parts = urlsplit(self.path).path.split("/")
                name = unquote(parts[3]) if len(parts) == 5 and parts[4] == "invocations" else ""
                event = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
                if name not in names or self.headers.get("X-Amz-Invocation-Type", "RequestResponse") != \
                        "RequestResponse":
                    self._send(404, {"Type": "User", "message": f"Function not found: {name}"},
                               {"x-amzn-ErrorType": "ResourceNotFoundException"})
                    return
                invoked.append((names[name], event))
                try:
                    reply, headers = stack.invoke(names[name], event), {}
                except Exception as exc:  # what Lambda's Python runtime reports for an exception
                    reply = {"errorMessage": str(exc), "errorType": type(exc).__name__,
                             "stackTrace": traceback.format_tb(exc.__traceback__)}
                    headers = {"X-Amz-Function-Error": "Unhandled"}
                self._send(200, reply, {"X-Amz-Executed-Version": "$LATEST", **headers})

            def _send(self, status: int, body: Any, headers: dict[str, str]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                for key, value in {"Content-Type": "application/json", "Content-Length": str(len(data)),
                                   **headers}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> InvokeEndpoint:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()

"""boto3 clients: one Session and one client per service per container, short timeouts, few retries.

Every AWS call a record makes must fit inside the invocation: with a 1 s connect and 3 s read
timeout and two attempts (standard retry mode) one call takes at most about 8 s, whatever
botocore's defaults would allow. ``AWS_ENDPOINT_URL`` (set by local runs) points the clients
at moto or ministack.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

AwsError = (BotoCoreError, ClientError)

#: Real seconds: every AWS call's connect and read timeouts.
CONNECT_TIMEOUT, READ_TIMEOUT = 1, 3
CLIENT_CONFIG = Config(
    connect_timeout=CONNECT_TIMEOUT,
    read_timeout=READ_TIMEOUT,
    retries={"mode": "standard", "total_max_attempts": 2},  # the first attempt and one retry
    max_pool_connections=16,
)

#: What a client is built from: a change of any of these, or of a service's own endpoint
#: (``AWS_ENDPOINT_URL_<SERVICE>``; local runs point one process at another endpoint or key), makes
#: :func:`client` start over with a new Session.
ENVIRONMENT = ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
               "AWS_SESSION_TOKEN", "AWS_PROFILE")

_session: boto3.session.Session | None = None
_clients: dict[str, Any] = {}
_built_from: tuple[Any, ...] | None = None
_lock = threading.Lock()


def client(service: str, config: Config | None = None) -> Any:
    """The container's client of ``service``: one Session and one client per service, shared by
    every part (clients are thread-safe; each new one parses botocore's model of its service,
    tens of milliseconds of cold start). ``config`` (a module-level constant: clients are kept per
    service and config) is merged over :data:`CLIENT_CONFIG`, for the calls its limits do not fit."""
    global _session, _built_from
    environment = (*(os.environ.get(name) for name in ENVIRONMENT),
                   *sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_ENDPOINT_URL_")))
    key = service if config is None else f"{service}#{id(config)}"
    with _lock:
        if _session is None or environment != _built_from:
            _session, _built_from = boto3.session.Session(), environment
            _clients.clear()
        if key not in _clients:
            merged = CLIENT_CONFIG if config is None else CLIENT_CONFIG.merge(config)
            _clients[key] = _session.client(service, config=merged)  # type: ignore[call-overload]
        return _clients[key]


def reset_session() -> None:
    """Forget the Session and its clients."""
    global _session
    with _lock:
        _session = None
        _clients.clear()


def error_code(exc: Exception) -> str | None:
    """The AWS error code of a ClientError, else None."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code"))
    return None

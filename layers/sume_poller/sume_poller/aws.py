"""boto3 clients: one Session per container, short timeouts, few retries.

Every AWS call a record makes must fit inside the invocation: with a 1 s connect and 3 s read
timeout and two attempts (standard retry mode) one call takes at most about 8 s, whatever
botocore's defaults would allow. ``AWS_ENDPOINT_URL`` (set by local runs) points the clients
at moto or ministack.
"""

from __future__ import annotations

import threading
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

AwsError = (BotoCoreError, ClientError)

CLIENT_CONFIG = Config(
    connect_timeout=1,
    read_timeout=3,
    retries={"mode": "standard", "max_attempts": 2},
    max_pool_connections=16,
)

_session: boto3.session.Session | None = None
_lock = threading.Lock()


def client(service: str) -> Any:
    """A client from the container's one boto3 Session (a Session loads botocore's data files:
    about 70 ms of cold start each)."""
    global _session
    with _lock:
        if _session is None:
            _session = boto3.session.Session()
        return _session.client(service, config=CLIENT_CONFIG)  # type: ignore[call-overload]


def reset_session() -> None:
    """Forget the Session (local runs change credentials and endpoints between cases)."""
    global _session
    with _lock:
        _session = None


def error_code(exc: Exception) -> str | None:
    """The AWS error code of a ClientError, else None."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code"))
    return None

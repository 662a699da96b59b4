"""Secrets, read at runtime through Powertools Parameters and cached per container.

* :class:`Secret` - a string secret (SSM SecureString or Secrets Manager secret): a Sume API
  key, a webhook signing secret, the key configuration. Cached (five minutes unless the caller
  says otherwise) and re-read at once after
  :meth:`Secret.invalidate` (Sume rejected the key: rotation picks up without a deploy).
* :class:`RedisCredentials` - the ElastiCache RBAC user, a Secrets Manager secret holding
  ``{"username": ..., "password": ...}``; redis-py asks for it on every new connection.

Values are never logged. Powertools is imported on first use: only code paths that need a
secret pay for it.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from redis.credentials import CredentialProvider

from ..core.aws import client

#: Seconds a fetched secret is reused before Parameters reads it again.
MAX_AGE = 300


def _provider(source: str) -> Any:
    """A Powertools provider of ``source`` ("ssm" or "secretsmanager") on the container's client
    (Powertools' default providers would build a boto3 Session of their own)."""
    from aws_lambda_powertools.utilities import parameters

    if source == "secretsmanager":
        return parameters.SecretsProvider(boto3_client=client("secretsmanager"))
    return parameters.SSMProvider(boto3_client=client("ssm"))


class Secret:
    """Callable returning the secret; :meth:`invalidate` forces a fresh read (after a 401)."""

    def __init__(self, name: str, source: str, max_age: float = MAX_AGE) -> None:
        self._name = name
        self._source = source
        self._max_age = max_age
        self._provider: Any = None
        self._force = threading.Event()
        # Single flight: the records of a batch run on parallel threads, and on a cold container
        # they would all miss the cache at once and each read the parameter.
        self._lock = threading.Lock()

    def __call__(self) -> str:
        with self._lock:
            force = self._force.is_set()
            self._force.clear()
            if self._provider is None:
                self._provider = _provider(self._source)
            options = {} if self._source == "secretsmanager" else {"decrypt": True}
            value = self._provider.get(self._name, max_age=int(self._max_age), force_fetch=force, **options)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"the secret at {self._name} is empty")
        return value.strip()

    def invalidate(self) -> None:
        self._force.set()


class RedisCredentials(CredentialProvider):
    """The Redis ACL user from a Secrets Manager secret (JSON with username and password)."""

    def __init__(self, secret_name: str) -> None:
        self._name = secret_name
        self._provider: Any = None

    def get_credentials(self) -> tuple[str] | tuple[str, str]:
        if self._provider is None:
            self._provider = _provider("secretsmanager")
        raw: Any = self._provider.get(self._name, max_age=MAX_AGE)
        data = json.loads(raw) if isinstance(raw, str) else raw
        if not isinstance(data, dict) or not isinstance(data.get("password"), str):
            raise ValueError(f"secret {self._name} must be JSON with a password (and a username)")
        username = data.get("username")
        return (str(username), data["password"]) if username else (data["password"],)

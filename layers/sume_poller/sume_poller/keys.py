"""The Sume API key, read at runtime through Powertools Parameters and cached per container."""

from __future__ import annotations

import threading

from .config import Settings

#: Seconds a fetched key is reused before Parameters reads it again (rotation picks up by then).
KEY_MAX_AGE = 300


class ApiKeyProvider:
    """Callable returning the key; ``invalidate()`` forces a fresh read (after a 401)."""

    def __init__(self, settings: Settings) -> None:
        self._name = settings.sume_api_key_name
        self._source = settings.sume_api_key_source
        self._force = threading.Event()
        # Single flight: the messages of a batch are polled on parallel threads, and on a cold
        # container they would all miss the cache at once and each read the parameter.
        self._lock = threading.Lock()

    def __call__(self) -> str:
        with self._lock:
            return self._fetch()

    def _fetch(self) -> str:
        # Imported here: only the code paths that talk to Sume pay for it.
        from aws_lambda_powertools.utilities import parameters

        force = self._force.is_set()
        self._force.clear()
        if self._source == "secretsmanager":
            value = parameters.get_secret(self._name, max_age=KEY_MAX_AGE, force_fetch=force)
        else:
            value = parameters.get_parameter(self._name, decrypt=True, max_age=KEY_MAX_AGE,
                                             force_fetch=force)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"the Sume API key at {self._name} is empty")
        return value.strip()

    def invalidate(self) -> None:
        self._force.set()

"""Sume keys: which API keys a deployment serves, each with its own limits and webhook secret.

Sume's budgets are per API key (one key per workspace), so a deployment that serves many
workspaces keeps per key what Sume counts per key - the read and create budgets, the 401 pause
and key check, sweeps (the list route lists one workspace), webhook verification - and shares the
rest (the learned schedule, leases, the table, the queues). A job names its key (``key`` in the
record and in every message; absent: the default key, so records and events from before keys
keep working).

Where keys come from:

* the default key (id ``DEFAULT_KEY_ID``, "default" unless set): the deployment's one key -
  ``SUME_API_KEY_NAME`` (SSM or Secrets Manager), the budget parameters, the webhook secret;
* the key configuration, one Secrets Manager secret (``SUME_KEYS_SECRET_NAME``, say ``sume/keys``)
  holding the key list - ids, limits and where each key's secrets live, never a secret itself::

      {"keys": {"acme": {"api_key_from": "secretsmanager:sume/keys/api-keys/acme",
                         "reads_per_minute": 60, "reads_per_day": 5000,
                         "creates_per_minute": 5, "creates_per_day": 100,
                         "webhook_secret_from": "secretsmanager:sume/keys/webhook-secrets/acme"},
                "globex": {"api_key_from": "ssm:/sume/keys/api-keys/globex"}}}

  An entry's limits default to Sume's documented ones (the deployment's budget settings). Its API
  key lives under ``<config name>/api-keys/`` (:data:`API_KEYS`), its optional webhook signing secret
  under ``<config name>/webhook-secrets/`` (:data:`WEBHOOK_SECRETS`), each a Secrets Manager secret
  (``secretsmanager:<name>``) or an SSM SecureString (``ssm:/<name>``). The IAM grants are built from
  those prefixes, so each function may read only what it uses: the key list every function that
  serves keys, the API keys only those that call Sume, the webhook secrets only the webhook
  function. A secret is read when first used, never by a function that does not use it. An entry
  with the default key's id replaces the default key.

  Format 1 (before the split) held ``api_key`` and ``webhook_secret`` inline, where every function
  reading the list could read them. Such an entry still loads (:func:`legacy_fields`: a warning and
  the ``KeyConfigLegacy`` metric, alarmed) until ``make migrate-keys`` (tools/ops.py) moves them; an
  ``api_key_from`` outside ``api-keys/`` is refused (no function may read it any more).

The configuration is re-read on a short cache (:data:`MAX_AGE`; ``SUME_KEYS_MAX_AGE``), at once after a 401,
and at once (at most every :data:`UNKNOWN_REREAD` seconds) when a job names a key it does not
hold: keys are added, rotated and removed without a deploy. A configuration that stops parsing
keeps the last good one (logged, counted as ``KeyConfigInvalid``); with none, the call fails.
Key ids, never key values, appear in logs, metrics and Redis key names.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any, Generic, TypeVar

from ..core.jobs import keyed_shard, valid_key_id
from ..core.observability import count_now, logger
from ..core.values import value

#: Seconds the key configuration is reused before it is read again.
MAX_AGE = 60.0
#: The soonest the configuration is read again for a key it does not name (real seconds).
UNKNOWN_REREAD = 10.0
LIMITS = ("reads_per_minute", "reads_per_day", "creates_per_minute", "creates_per_day")
LIMIT_MAX = 100_000_000
#: Where, under the configuration's name, the API keys and the webhook signing secrets live
#: (template.yaml grants each to the functions that use it: tests/unit/test_template_account.py).
API_KEYS = "api-keys"
WEBHOOK_SECRETS = "webhook-secrets"
#: Format 1's inline secrets: still read, counted as KeyConfigLegacy until make migrate-keys moves them.
LEGACY_FIELDS = ("api_key", "webhook_secret")
ENTRY_FIELDS = frozenset({"api_key_from", "webhook_secret_from", *LEGACY_FIELDS, *LIMITS})
MIGRATE = "run make migrate-keys (README \"Many keys\")"


class UnknownKey(LookupError):
    """A job names a key the configuration does not hold (removed, or never added)."""

    def __init__(self, key_id: str) -> None:
        super().__init__(f"key {key_id!r} is not in the key configuration")
        self.key_id = key_id


class KeyConfigError(ValueError):
    """The key configuration does not parse; the message lists every problem (never a value)."""


def check_key_id(value: object) -> str:
    """``value`` if it is a key id, else ValueError (key ids are not secret: the message shows it)."""
    if not valid_key_id(value):
        raise ValueError(f"a key id is 1-32 letters, digits, '_' or '-' (starting with a letter or digit), "
                         f"not {str(value)[:40]!r}")
    return value


@value
class Limits:
    """Sume's budgets for one key (0: not limited here)."""

    reads_per_minute: int = 120
    reads_per_day: int = 10_000
    creates_per_minute: int = 10
    creates_per_day: int = 300


@value
class SumeKey:
    """One key: its id, limits and secrets. ``api_key()`` answers the current value."""

    id: str
    limits: Limits
    api_key: Callable[[], str] = field(repr=False, compare=False)
    webhook_secret: Callable[[], str] | None = field(default=None, repr=False, compare=False)
    default: bool = False

    def budget_name(self, prefix: str, what: str) -> str:
        """The Redis key of this key's ``what`` budget ("reads" or "creates"): its own hash tag, so
        in cluster mode each key's budget may live in its own slot. The default key keeps the name
        it had before keys (its state carries over)."""
        return f"{prefix}!budget:{{{what}}}" if self.default else f"{prefix}!budget:{{{what}:{self.id}}}"

    def scope(self, prefix: str) -> str:
        """The Redis prefix of this key's own state (sweeps, coverage, fan-out cursor)."""
        return prefix if self.default else f"{prefix}@{self.id}:"

    def shard(self, shard: str) -> str:
        """The pending-index partition of this key's jobs in ``shard`` ("p07" -> "p07:acme")."""
        return keyed_shard(shard, None if self.default else self.id)


def record_key(record: Mapping[str, Any] | None, default_id: str) -> str:
    """The key a job record names (records from before keys name none: the default key)."""
    key = (record or {}).get("key")
    return key if isinstance(key, str) and key else default_id


def _constant(value: str) -> Callable[[], str]:
    return lambda: value


def legacy_fields(raw: str) -> dict[str, list[str]]:
    """Key id -> the format-1 fields (inline secrets) its entry still holds, of a configuration that
    parses as JSON (anything else: nothing; :meth:`KeyRing.parse` says what is wrong with it)."""
    try:
        entries = json.loads(raw).get("keys")
    except (ValueError, AttributeError):
        return {}
    if not isinstance(entries, dict):
        return {}
    return {str(key_id): found for key_id, entry in entries.items()
            if isinstance(entry, dict) and (found := [f for f in LEGACY_FIELDS if f in entry])}


class KeyRing:
    """The keys a container serves, read from the default key and the key configuration.

    ``read_config`` returns the configuration's raw text (None: no configuration); ``secret(name,
    source)`` returns a callable secret for keys that live elsewhere (cached by the caller's
    provider). Thread-safe: a batch's records look keys up from parallel threads.
    """

    def __init__(self, default_id: str, default: SumeKey | None = None, *,
                 read_config: Callable[[bool], str | None] | None = None,
                 secret: Callable[[str, str], Any] | None = None, defaults: Limits = Limits(),
                 config_name: str | None = None, clock: Callable[[], float] = time.monotonic,
                 max_age: float = MAX_AGE) -> None:
        self.default_id = default_id
        self.max_age = max_age
        #: Keys that live elsewhere live under the configuration's name (the IAM grants are built from it).
        self._ref_prefix = f"{config_name}/" if config_name else None
        self._default = default
        self._read_config = read_config
        self._secret = secret
        self._defaults = defaults
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: dict[str, SumeKey] | None = None
        self._read_at = -float("inf")
        self._force = False
        self._secrets: dict[tuple[str, str], Any] = {}

    def get(self, key_id: str | None) -> SumeKey:
        """The key a job names (None: the default key); :class:`UnknownKey` when the
        configuration, read again at once, still does not hold it."""
        wanted = key_id or self.default_id
        keys = self._current()
        if wanted not in keys and self._clock() - self._read_at >= UNKNOWN_REREAD:
            keys = self._current(force=True)
        if wanted not in keys:
            raise UnknownKey(wanted)
        return keys[wanted]

    def all(self) -> list[SumeKey]:
        """Every key, the default first."""
        keys = self._current()
        return sorted(keys.values(), key=lambda k: (not k.default, k.id))

    def first(self) -> SumeKey:
        """The default key, else the first configured one; :class:`KeyConfigError` with none."""
        keys = self.all()
        if not keys:
            raise KeyConfigError("no Sume key: set SUME_API_KEY_NAME (the default key) or add keys to the "
                                 "key configuration (SUME_KEYS_SECRET_NAME)")
        return keys[0]

    def invalidate(self) -> None:
        """Sume refused a key: read the configuration (and the keys' secrets) again on next use."""
        self._force = True
        for secret in list(self._secrets.values()):
            getattr(secret, "invalidate", lambda: None)()
        if self._default is not None:
            getattr(self._default.api_key, "invalidate", lambda: None)()

    # -- reading ------------------------------------------------------------------------------------
    def _current(self, *, force: bool = False) -> dict[str, SumeKey]:
        with self._lock:
            force = force or self._force
            if self._keys is not None and not force and self._clock() - self._read_at < self.max_age:
                return self._keys
            self._force = False
            try:
                self._keys = self._load(force)
            except KeyConfigError as exc:
                count_now("KeyConfigInvalid")
                if self._keys is None:
                    raise
                logger.error("the key configuration does not parse; keeping the last good one",
                             extra={"reason": str(exc)})
            self._read_at = self._clock()
            return self._keys

    def _load(self, force: bool) -> dict[str, SumeKey]:
        keys = {self._default.id: self._default} if self._default else {}
        raw = self._read_config(force) if self._read_config else None
        if raw is None:
            return keys
        for key in self.parse(raw):
            keys[key.id] = key
        if legacy := legacy_fields(raw):
            count_now("KeyConfigLegacy")
            logger.warning(f"the key configuration holds secrets inline, readable by every function that reads the "
                           f"key list: {MIGRATE}", extra={"keys": sorted(legacy)})  # ids, never values
        return keys

    def parse(self, raw: str) -> list[SumeKey]:
        """The configuration's keys; :class:`KeyConfigError` lists every problem."""
        try:
            data = json.loads(raw)
        except ValueError:
            raise KeyConfigError("the key configuration is not JSON") from None
        entries = data.get("keys") if isinstance(data, dict) else None
        if not isinstance(entries, dict):
            raise KeyConfigError('the key configuration must be a JSON object {"keys": {"<id>": {...}}}')
        problems: list[str] = []
        keys = []
        for key_id, entry in entries.items():
            try:
                keys.append(self._entry(key_id, entry))
            except ValueError as exc:
                problems.append(str(exc))
        if problems:
            raise KeyConfigError("; ".join(problems))
        return keys

    def _entry(self, key_id: object, entry: object) -> SumeKey:
        key_id = check_key_id(key_id)
        if not isinstance(entry, dict):
            raise ValueError(f"key {key_id}: its entry must be an object")
        if unknown := sorted(set(entry) - ENTRY_FIELDS):
            raise ValueError(f"key {key_id}: unknown fields {unknown} (known: {sorted(ENTRY_FIELDS)})")
        limits = {}
        for name in LIMITS:
            value = entry.get(name, getattr(self._defaults, name))
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= LIMIT_MAX:
                raise ValueError(f"key {key_id}: {name} must be an integer from 0 to {LIMIT_MAX}")
            limits[name] = value
        api_key = self._secret_of(key_id, entry, "api_key", API_KEYS)
        assert api_key is not None  # required
        return SumeKey(key_id, Limits(**limits), api_key, self._secret_of(key_id, entry, "webhook_secret",
                                                                          WEBHOOK_SECRETS, required=False),
                       default=key_id == self.default_id)

    def _secret_of(self, key_id: str, entry: dict[str, Any], what: str, folder: str,
                   required: bool = True) -> Callable[[], str] | None:
        """The entry's ``what`` ("api_key" or "webhook_secret"): from ``<what>_from`` under the
        configuration's ``folder``, or (format 1) inline; None when optional and absent."""
        inline, where = entry.get(what), entry.get(f"{what}_from")
        if (inline is not None and where is not None) or (required and inline is None and where is None):
            raise ValueError(f"key {key_id}: give exactly one of {what}_from and {what} (format 1: inline)")
        if inline is not None:
            if not isinstance(inline, str) or not inline.strip():
                raise ValueError(f"key {key_id}: {what} must be a non-empty string")
            return _constant(inline.strip())
        if where is None:
            return None
        source, _, name = str(where).partition(":")
        if source not in ("ssm", "secretsmanager") or not name or self._secret is None:
            raise ValueError(f"key {key_id}: {what}_from must be 'ssm:/<name>' or 'secretsmanager:<name>'")
        prefix = f"{self._ref_prefix}{folder}/" if self._ref_prefix else None
        if prefix and not name.lstrip("/").startswith(prefix):
            raise ValueError(f"key {key_id}: {what}_from must name a secret or SSM parameter under {prefix} "
                             f"(the only place the functions that use it may read): {MIGRATE}")
        if (source, name) not in self._secrets:
            self._secrets[(source, name)] = self._secret(name, source)
        secret: Callable[[], str] = self._secrets[(source, name)]
        return secret


T = TypeVar("T")


class PerKey(Generic[T]):
    """Parts of one key (its budget, gate, Sume client...), built on first use and built again
    when the key's limits change (a rotated API key needs no rebuild: clients ask the ring for the
    current value on every request). ``removed`` builds the parts for a key the configuration no
    longer holds (None: :class:`UnknownKey` propagates)."""

    def __init__(self, ring: KeyRing, build: Callable[[SumeKey], T],
                 removed: Callable[[str], T] | None = None) -> None:
        self.ring = ring
        self._build = build
        self._removed = removed
        self._lock = threading.Lock()
        self._built: dict[str, tuple[SumeKey | None, T]] = {}

    def __call__(self, key_id: str | None) -> T:
        key: SumeKey | None
        try:
            key = self.ring.get(key_id)
            wanted = key.id
        except UnknownKey as exc:
            if self._removed is None:
                raise
            key, wanted = None, exc.key_id
        with self._lock:
            built = self._built.get(wanted)
            if built is None or built[0] != key:
                built = (key, self._build(key) if key is not None else self._removed(wanted))  # type: ignore[misc]
                self._built[wanted] = built
            return built[1]

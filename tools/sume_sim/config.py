"""The simulator's configuration: one immutable :class:`Config`, changed only through :func:`updated`.

Fields are what ``POST /_sim/config`` and :meth:`SumeSimulator.configure` accept; every change is
validated and an invalid one raises :class:`SpecError`. ``time_scale`` is the clock's scale and is
fixed when the simulator is built. The dict-valued fields (``read_budget``, ``create_budget``,
``list``, ``webhooks``, ``keys``) are replaced whole: a field missing from the new dict takes its
default.

API keys: the top-level ``api_key`` is the key of the ``default`` workspace, with the top-level
budgets and webhook secret; ``keys`` adds more, each with its own workspace and optionally its own
budgets and secret (:class:`KeyEntry`). :meth:`Config.accounts` resolves them into
:class:`Account` s. One workspace has at most one key. A key's value is a secret: messages, stats
and logs name it by its workspace or :func:`key_label`, never in full.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tools.sume_sim.spec import (
    DEFAULT_DURATION,
    DEFAULT_WORKSPACE,
    RESULT_NOT_READY_STATUSES,
    SpecError,
    check_bool,
    check_choice,
    check_faults,
    check_int,
    check_keys,
    check_number,
    check_status_choice,
)

DEFAULT_API_KEY = "sume_test_key"
DEFAULT_WEBHOOK_SECRET = "sume_sim_webhook_secret"  # noqa: S105 - a well-known test value
MINUTE = 60
DAY = 86_400
LIST_FIELDS = ("minimal", "full")
LIST_ORDERS = ("any", "newest_first", "newest_created")
LIST_ROUTES = ("ok", "missing", "bad_request", "forbidden")
LIST_STATUS_FILTERS = ("honoured", "ignored", "loose")
LIST_FAULT_OK = "ok"  # a list fault that answers normally
MAX_FOREIGN = 100
KEY_ENTRY_FIELDS = ("workspace", "read_budget", "create_budget", "webhook_secret")
MAX_WORKSPACE_CHARS = 64


def key_label(key: str) -> str:
    """A key's non-secret name: its first 8 characters (at most half of a short key) and ``...``."""
    return key[: min(8, len(key) // 2)] + "..."


def derived_workspace(key: str) -> str:
    """The workspace of a ``keys`` entry that names none: ``ws_`` and 12 hex digits of the key's SHA-256."""
    return "ws_" + hashlib.sha256(key.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Budget:
    """Per-key limits of one class of calls; None = that window is not enforced."""

    per_minute: int | None = None
    per_day: int | None = None

    def limits(self) -> dict[int, int | None]:
        """Window size (clock seconds) -> limit."""
        return {MINUTE: self.per_minute, DAY: self.per_day}

    @property
    def enforced(self) -> bool:
        return self.per_minute is not None or self.per_day is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: How Sume counts a budget window: ``fixed`` windows ``[k*W, (k+1)*W)``, or ``sliding``: the last
#: ``W`` seconds before each request.
WINDOW_KINDS = ("fixed", "sliding")


@dataclass(frozen=True)
class BudgetWindows:
    """The kind of each budget window (Sume's contract does not say which it counts), for every key
    and class of calls."""

    minute: str = "fixed"
    day: str = "fixed"

    def kind(self, size: int) -> str:
        """The kind of the window of ``size`` clock seconds."""
        return self.minute if size == MINUTE else self.day

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ListMode:
    """How ``GET /api/v1/jobs`` behaves, and which misses of a real list it shows."""

    fields: str = "minimal"
    order: str = "any"
    cursor: bool = False
    multi_status: bool = False
    omit_kinds: tuple[str, ...] = ()
    newest_n: int | None = None
    lag: float = 0.0
    route: str = "ok"
    status_filter: str = "honoured"
    item_status: bool = True
    cursor_repeat: bool = False
    faults: tuple[str, ...] = ()
    foreign: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "omit_kinds": list(self.omit_kinds), "faults": list(self.faults)}


@dataclass(frozen=True)
class Webhooks:
    """Which kinds accept ``webhook_url``, the signing secret and the delivery misbehaviours."""

    kinds: tuple[str, ...] = ()
    secret: str = DEFAULT_WEBHOOK_SECRET
    loss: float = 0.0
    duplicate: float = 0.0
    delay: float = 0.0
    bad_signature: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "kinds": list(self.kinds)}


@dataclass(frozen=True)
class KeyEntry:
    """One ``keys`` entry: its workspace; a budget or secret left None is the top-level one."""

    workspace: str
    read_budget: Budget | None = None
    create_budget: Budget | None = None
    webhook_secret: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"workspace": self.workspace}
        if self.read_budget is not None:
            data["read_budget"] = self.read_budget.to_dict()
        if self.create_budget is not None:
            data["create_budget"] = self.create_budget.to_dict()
        if self.webhook_secret is not None:
            data["webhook_secret"] = self.webhook_secret
        return data


@dataclass(frozen=True)
class Account:
    """A configured key resolved against the top-level fields: its workspace, limits and secret."""

    key: str
    workspace: str
    read_budget: Budget
    create_budget: Budget
    webhook_secret: str

    @property
    def label(self) -> str:
        return key_label(self.key)


@dataclass(frozen=True)
class Config:
    api_key: str | None = DEFAULT_API_KEY  # None: the default workspace has no key
    hints: bool = True
    exact_hints: bool = False
    latency_ms: int = 0
    time_scale: float = 1.0
    error_rate_5xx: float = 0.0
    malformed_rate: float = 0.0
    seed: int | None = None
    read_budget: Budget = field(default_factory=Budget)
    create_budget: Budget = field(default_factory=Budget)
    budget_windows: BudgetWindows = field(default_factory=BudgetWindows)
    other_consumer_share: float = 0.0
    not_found_for: float = 0.0
    key_forbidden: bool = False
    result_not_ready: int = 409
    listing: ListMode = field(default_factory=ListMode)  # the "list" field
    webhooks: Webhooks = field(default_factory=Webhooks)
    keys: tuple[tuple[str, KeyEntry], ...] = ()  # API key -> entry, in the order given

    def accounts(self) -> tuple[Account, ...]:
        """Every configured key, the top-level ``api_key`` (default workspace) first."""
        accounts = []
        if self.api_key is not None:
            accounts.append(Account(self.api_key, DEFAULT_WORKSPACE, self.read_budget, self.create_budget,
                                    self.webhooks.secret))
        for key, entry in self.keys:
            accounts.append(Account(
                key, entry.workspace,
                self.read_budget if entry.read_budget is None else entry.read_budget,
                self.create_budget if entry.create_budget is None else entry.create_budget,
                self.webhooks.secret if entry.webhook_secret is None else entry.webhook_secret,
            ))
        return tuple(accounts)

    def to_dict(self) -> dict[str, Any]:
        data = {
            name: getattr(self, name)
            for name in ("api_key", "hints", "exact_hints", "latency_ms", "time_scale", "error_rate_5xx",
                         "malformed_rate", "seed", "other_consumer_share", "not_found_for", "key_forbidden",
                         "result_not_ready")
        }
        return {
            **data,
            "read_budget": self.read_budget.to_dict(),
            "create_budget": self.create_budget.to_dict(),
            "rate_limit_per_minute": self.read_budget.per_minute,
            "budget_windows": self.budget_windows.to_dict(),
            "list": self.listing.to_dict(),
            "webhooks": self.webhooks.to_dict(),
            "keys": {key: entry.to_dict() for key, entry in self.keys},
        }


# ---------------------------------------------------------------------------- parsing


def _limit(value: Any, name: str) -> int | None:
    return None if value is None else check_int(value, name, 1, 10**12)


def _budget(value: Any, name: str) -> Budget:
    raw = check_keys({} if value is None else value, ("per_minute", "per_day"), name)
    return Budget(_limit(raw.get("per_minute"), "per_minute"), _limit(raw.get("per_day"), "per_day"))


def _budget_windows(value: Any) -> BudgetWindows:
    raw = check_keys({} if value is None else value, BudgetWindows.__dataclass_fields__, "budget_windows")
    return BudgetWindows(*(check_choice(raw.get(size, "fixed"), size, WINDOW_KINDS, "budget_windows.")
                           for size in ("minute", "day")))


def _kinds(value: Any, name: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(k, str) for k in value):
        raise SpecError(f"{name} must be a list of kinds", name)
    for kind in value:
        check_choice(kind, name, DEFAULT_DURATION)
    return tuple(value)


def _list_mode(value: Any) -> ListMode:
    raw = check_keys({} if value is None else value, ListMode.__dataclass_fields__, "list")
    newest_n = raw.get("newest_n")
    cursor = check_bool(raw.get("cursor", False), "cursor", "list.")
    cursor_repeat = check_bool(raw.get("cursor_repeat", False), "cursor_repeat", "list.")
    if cursor_repeat and not cursor:
        raise SpecError("list.cursor_repeat needs list.cursor: true", "cursor_repeat")
    return ListMode(
        fields=check_choice(raw.get("fields", "minimal"), "fields", LIST_FIELDS, "list."),
        order=check_choice(raw.get("order", "any"), "order", LIST_ORDERS, "list."),
        cursor=cursor,
        multi_status=check_bool(raw.get("multi_status", False), "multi_status", "list."),
        omit_kinds=_kinds(raw.get("omit_kinds", []), "omit_kinds"),
        newest_n=None if newest_n is None else check_int(newest_n, "newest_n", 0, 10**9, "list."),
        lag=check_number(raw.get("lag", 0.0), "lag", prefix="list."),
        route=check_choice(raw.get("route", "ok"), "route", LIST_ROUTES, "list."),
        status_filter=check_choice(raw.get("status_filter", "honoured"), "status_filter", LIST_STATUS_FILTERS,
                                   "list."),
        item_status=check_bool(raw.get("item_status", True), "item_status", "list."),
        cursor_repeat=cursor_repeat,
        faults=check_faults(raw.get("faults", []), "faults", "list.", (LIST_FAULT_OK,)),
        foreign=check_int(raw.get("foreign", 0), "foreign", 0, MAX_FOREIGN, "list."),
    )


def _webhooks(value: Any) -> Webhooks:
    raw = check_keys({} if value is None else value, Webhooks.__dataclass_fields__, "webhooks")
    secret = raw.get("secret", DEFAULT_WEBHOOK_SECRET)
    if not isinstance(secret, str) or not secret:
        raise SpecError("webhooks.secret must be a non-empty string", "secret")

    def share(name: str) -> float:
        return check_number(raw.get(name, 0.0), name, 0.0, 1.0, "webhooks.")

    return Webhooks(
        kinds=_kinds(raw.get("kinds", []), "kinds"),
        secret=secret,
        loss=share("loss"),
        duplicate=share("duplicate"),
        delay=check_number(raw.get("delay", 0.0), "delay", prefix="webhooks."),
        bad_signature=share("bad_signature"),
    )


def _api_key(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise SpecError("api_key must be a non-empty string (or null: the default workspace has no key)", "api_key")
    return value


def _key_value(value: Any, name: str) -> str:
    """An API key of ``keys`` or of a key control call: a non-empty string without surrounding spaces."""
    if not isinstance(value, str) or not value or value != value.strip():
        raise SpecError(f"{name} must be a non-empty API key string without surrounding whitespace", name)
    return value


def key_entry(key: str, value: Any, prefix: str = "keys.") -> KeyEntry:
    """One ``keys`` entry (the object under its key), validated."""
    name = prefix.rstrip(".") or "key"
    if value is not None and not isinstance(value, dict):
        raise SpecError(f"each {name} entry must be an object", name)
    raw = check_keys({} if value is None else value, KEY_ENTRY_FIELDS, name)
    workspace = raw.get("workspace")
    if workspace is None:
        workspace = derived_workspace(key)
    elif not isinstance(workspace, str) or not workspace.strip() or len(workspace) > MAX_WORKSPACE_CHARS:
        raise SpecError(f"{prefix}workspace must be a non-empty string of at most {MAX_WORKSPACE_CHARS} characters",
                        "workspace")
    secret = raw.get("webhook_secret")
    if secret is not None and (not isinstance(secret, str) or not secret):
        raise SpecError(f"{prefix}webhook_secret must be a non-empty string", "webhook_secret")
    budgets = {name: None if raw.get(name) is None else _budget(raw[name], name)
               for name in ("read_budget", "create_budget")}
    return KeyEntry(workspace, budgets["read_budget"], budgets["create_budget"], secret)


def _keys(value: Any) -> tuple[tuple[str, KeyEntry], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise SpecError("keys must be an object: API key -> {workspace, read_budget, create_budget, "
                        "webhook_secret}", "keys")
    return tuple((_key_value(key, "keys"), key_entry(key, entry)) for key, entry in value.items())


def check_accounts(config: Config) -> Config:
    """``config`` if its keys are distinct and no two share a workspace, else :class:`SpecError`."""
    if config.api_key is not None and any(key == config.api_key for key, _ in config.keys):
        raise SpecError("keys must not repeat the top-level api_key (it is the default workspace's key)", "keys")
    seen: set[str] = set()
    for account in config.accounts():
        if account.workspace in seen:
            raise SpecError(f"workspace {account.workspace!r} has two keys; a workspace has one key", "workspace")
        seen.add(account.workspace)
    return config


def _seed(value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise SpecError("seed must be an integer or null", "seed")
    return value


def _time_scale(value: Any) -> float:
    scale = check_number(value, "time_scale", 0.0, 1.0)
    if scale <= 0:
        raise SpecError("time_scale must be in (0, 1]", "time_scale")
    return scale


#: Config field -> (attribute, parser of a raw value).
_FIELDS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "api_key": ("api_key", _api_key),
    "hints": ("hints", lambda v: check_bool(v, "hints")),
    "exact_hints": ("exact_hints", lambda v: check_bool(v, "exact_hints")),
    "key_forbidden": ("key_forbidden", lambda v: check_bool(v, "key_forbidden")),
    "latency_ms": ("latency_ms", lambda v: check_int(v, "latency_ms", 0, 600_000)),
    "error_rate_5xx": ("error_rate_5xx", lambda v: check_number(v, "error_rate_5xx", 0.0, 1.0)),
    "malformed_rate": ("malformed_rate", lambda v: check_number(v, "malformed_rate", 0.0, 1.0)),
    "other_consumer_share": ("other_consumer_share", lambda v: check_number(v, "other_consumer_share", 0.0, 1.0)),
    "not_found_for": ("not_found_for", lambda v: check_number(v, "not_found_for")),
    "result_not_ready": ("result_not_ready",
                         lambda v: check_status_choice(v, "result_not_ready", RESULT_NOT_READY_STATUSES)),
    "seed": ("seed", _seed),
    "read_budget": ("read_budget", lambda v: _budget(v, "read_budget")),
    "create_budget": ("create_budget", lambda v: _budget(v, "create_budget")),
    "budget_windows": ("budget_windows", _budget_windows),
    "list": ("listing", _list_mode),
    "webhooks": ("webhooks", _webhooks),
    "keys": ("keys", _keys),
}


def updated(base: Config, changes: Mapping[str, Any], *, initial: bool = False) -> Config:
    """``base`` with ``changes`` applied, validated; ``initial`` allows setting ``time_scale``.

    ``rate_limit_per_minute`` is an alias of ``read_budget.per_minute`` and is applied after a
    ``read_budget`` given in the same call.
    """
    values: dict[str, Any] = {}
    for name, value in changes.items():
        if name == "time_scale":
            scale = _time_scale(value)
            if not initial and not math.isclose(scale, base.time_scale):
                raise SpecError(
                    "time_scale is the clock scale and is fixed when the simulator starts; "
                    "start another simulator to change it",
                    name,
                )
            values["time_scale"] = scale
        elif name in _FIELDS:
            attribute, parse = _FIELDS[name]
            values[attribute] = parse(value)
        elif name != "rate_limit_per_minute":
            raise SpecError(f"unknown config field {name!r}", name)
    if "rate_limit_per_minute" in changes:
        per_minute = _limit(changes["rate_limit_per_minute"], "rate_limit_per_minute")
        values["read_budget"] = replace(values.get("read_budget", base.read_budget), per_minute=per_minute)
    return check_accounts(replace(base, **values))


# ---------------------------------------------------------------------------- key changes at runtime


def _configured(config: Config, key: Any, name: str) -> str:
    if isinstance(key, str) and key in {a.key for a in config.accounts()}:
        return key
    raise SpecError(f"{name} is not a configured API key", name)


def _unused(config: Config, value: Any, name: str) -> str:
    key = _key_value(value, name)
    if key in {a.key for a in config.accounts()}:
        raise SpecError(f"{name} is already a configured API key", name)
    return key


def with_key_added(base: Config, raw: Any) -> Config:
    """``base`` with one more key: ``raw`` is a ``keys`` entry plus its ``key``."""
    fields = check_keys(raw, ("key", *KEY_ENTRY_FIELDS), "key")
    key = _unused(base, fields.get("key"), "key")
    entry = key_entry(key, {k: v for k, v in fields.items() if k != "key"}, "")
    return check_accounts(replace(base, keys=(*base.keys, (key, entry))))


def with_key_rotated(base: Config, old_value: Any, new_value: Any) -> Config:
    """``base`` with key ``old`` replaced by ``new``: same workspace, limits and secret."""
    old = _configured(base, old_value, "old")
    new = _unused(base, new_value, "new")
    if old == base.api_key:
        return replace(base, api_key=new)
    return replace(base, keys=tuple((new if key == old else key, entry) for key, entry in base.keys))


def with_key_removed(base: Config, value: Any) -> Config:
    """``base`` without key ``value`` (the top-level ``api_key`` becomes None)."""
    key = _configured(base, value, "key")
    if key == base.api_key:
        return replace(base, api_key=None)
    return replace(base, keys=tuple((k, entry) for k, entry in base.keys if k != key))

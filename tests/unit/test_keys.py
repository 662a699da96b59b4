"""The key ring (keys.py): the configuration's shape and errors, its cache and re-reads, and the
parts built per key."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sume_poller.config.keys import (
    MAX_AGE,
    UNKNOWN_REREAD,
    KeyConfigError,
    KeyRing,
    Limits,
    PerKey,
    SumeKey,
    UnknownKey,
)


class Config:
    """The key configuration as a Secrets Manager secret would answer it, with a clock."""

    def __init__(self, keys: dict[str, Any]) -> None:
        self.text: str | None = json.dumps({"keys": keys})
        self.reads = 0
        self.forced = 0
        self.now = 1_000.0

    def read(self, force: bool) -> str | None:
        self.reads += 1
        self.forced += force
        return self.text

    def ring(self, default: SumeKey | None = None, **options: Any) -> KeyRing:
        return KeyRing("main", default, read_config=self.read, clock=lambda: self.now, **options)


DEFAULT = SumeKey("main", Limits(), lambda: "sume_live_main", default=True)


def test_keys_come_from_the_default_and_the_configuration_with_documented_limits_by_default() -> None:
    config = Config({"acme": {"api_key": "sume_live_acme", "reads_per_minute": 60, "webhook_secret": "whsec_a"},
                     "globex": {"api_key": "sume_live_globex"}})
    ring = config.ring(DEFAULT)
    assert [k.id for k in ring.all()] == ["main", "acme", "globex"]  # the default first
    acme = ring.get("acme")
    assert acme.limits == Limits(reads_per_minute=60) and acme.api_key() == "sume_live_acme"
    assert acme.webhook_secret is not None and acme.webhook_secret() == "whsec_a"
    assert ring.get("globex").limits == Limits() and ring.get("globex").webhook_secret is None
    assert ring.get(None) is DEFAULT and not acme.default


def test_an_entry_with_the_default_id_replaces_the_default_key() -> None:
    ring = Config({"main": {"api_key": "sume_live_new", "reads_per_day": 500}}).ring(DEFAULT)
    main = ring.get(None)
    assert main.default and main.api_key() == "sume_live_new" and main.limits.reads_per_day == 500


def test_each_key_names_its_own_redis_state_and_partitions_the_default_keeps_todays() -> None:
    other = SumeKey("acme", Limits(), lambda: "")
    assert DEFAULT.budget_name("p:", "reads") == "p:!budget:{reads}"  # state from before keys carries over
    assert other.budget_name("p:", "reads") == "p:!budget:{reads:acme}"  # its own cluster slot
    assert (DEFAULT.scope("p:"), other.scope("p:")) == ("p:", "p:@acme:")
    assert (DEFAULT.shard("p03"), other.shard("p03")) == ("p03", "p03:acme")


@pytest.mark.parametrize(("raw", "problems"), [
    ("not json", ["not JSON"]),
    (json.dumps(["keys"]), ['{"keys"']),
    (json.dumps({"keys": {"bad id!": {"api_key": "k"}}}), ["a key id is"]),
    (json.dumps({"keys": {"a": {"api_key": "k", "reads_per_minute": -1}, "b": {}}}),
     ["key a: reads_per_minute", "key b: give exactly one of api_key_from and api_key"]),
    (json.dumps({"keys": {"a": {"api_key": "sume_live_secret", "tier": 3}}}), ["unknown fields ['tier']"]),
    (json.dumps({"keys": {"a": {"api_key_from": "ssm:/elsewhere/a"}}}), ["under keys/api-keys/"]),
    (json.dumps({"keys": {"a": {"api_key_from": "secretsmanager:keys/a"}}}),
     ["under keys/api-keys/", "make migrate-keys"]),
    (json.dumps({"keys": {"a": {"api_key_from": "secretsmanager:keys/api-keys/a",
                                "webhook_secret_from": "secretsmanager:keys/api-keys/a"}}}),
     ["webhook_secret_from must name a secret or SSM parameter under keys/webhook-secrets/"]),
    (json.dumps({"keys": {"a": {"api_key": "sume_live_secret", "api_key_from": "secretsmanager:keys/api-keys/a"}}}),
     ["give exactly one of api_key_from and api_key"]),
])
def test_a_bad_configuration_says_every_problem_and_never_a_secret(raw: str, problems: list[str]) -> None:
    config = Config({})
    config.text = raw
    with pytest.raises(KeyConfigError) as failed:
        config.ring(DEFAULT, secret=lambda name, source: lambda: "x", config_name="keys").get("a")
    for problem in problems:
        assert problem in str(failed.value)
    assert "sume_live_secret" not in str(failed.value)


def test_a_configuration_that_stops_parsing_keeps_the_last_good_one() -> None:
    config = Config({"acme": {"api_key": "sume_live_acme"}})
    ring = config.ring(DEFAULT)
    assert ring.get("acme").api_key() == "sume_live_acme"
    config.text, config.now = "{broken", config.now + MAX_AGE
    assert ring.get("acme").api_key() == "sume_live_acme"  # read again, refused, the last good one kept
    assert config.reads == 2


def test_the_configuration_is_cached_and_read_again_at_once_after_a_401() -> None:
    config = Config({"acme": {"api_key": "sume_live_old"}})
    ring = config.ring(DEFAULT)
    assert ring.get("acme").api_key() == "sume_live_old"
    config.text = json.dumps({"keys": {"acme": {"api_key": "sume_live_rotated"}}})
    assert ring.get("acme").api_key() == "sume_live_old" and config.reads == 1  # within the cache
    ring.invalidate()  # Sume answered 401
    assert ring.get("acme").api_key() == "sume_live_rotated" and config.forced == 1


@pytest.mark.parametrize("max_age", [MAX_AGE, 2.0])
def test_the_cache_lasts_its_max_age_sume_keys_max_age_sets_it(max_age: float) -> None:
    from sume_poller.config.settings import Env, KeySettings

    env = Env({"SUME_KEYS_SECRET_NAME": "keys"} | ({} if max_age == MAX_AGE else {"SUME_KEYS_MAX_AGE": "2"}))
    assert KeySettings.read(env, None).max_age == max_age and not env.problems  # type: ignore[arg-type]
    config = Config({"acme": {"api_key": "sume_live_acme"}})
    ring = config.ring(DEFAULT, max_age=max_age)
    ring.get("acme")
    config.text = json.dumps({"keys": {}})  # removed
    config.now += max_age - 0.5
    assert ring.get("acme").id == "acme" and config.reads == 1
    config.now += 0.5
    with pytest.raises(UnknownKey):
        ring.get("acme")
    assert config.reads == 2 and config.forced == 0


def test_an_unknown_key_reads_the_configuration_again_at_once_but_not_on_every_lookup() -> None:
    config = Config({})
    ring = config.ring(DEFAULT)
    with pytest.raises(UnknownKey):
        ring.get("acme")
    config.text = json.dumps({"keys": {"acme": {"api_key": "sume_live_acme"}}})
    with pytest.raises(UnknownKey):  # read again for the first lookup only: at most every UNKNOWN_REREAD
        ring.get("acme")
    config.now += UNKNOWN_REREAD
    assert ring.get("acme").id == "acme" and config.forced == 1


def test_a_key_kept_elsewhere_is_read_through_one_secret_per_name() -> None:
    made: list[tuple[str, str]] = []

    def secret(name: str, source: str) -> Any:
        made.append((name, source))
        return lambda: f"value of {name}"

    config = Config({"a": {"api_key_from": "ssm:/keys/api-keys/a"},
                     "b": {"api_key_from": "secretsmanager:keys/api-keys/b",
                           "webhook_secret_from": "secretsmanager:keys/webhook-secrets/b"}})
    ring = config.ring(DEFAULT, secret=secret, config_name="keys")
    assert ring.get("a").api_key() == "value of /keys/api-keys/a"
    assert ring.get("b").api_key() == "value of keys/api-keys/b"
    webhook = ring.get("b").webhook_secret
    assert webhook is not None and webhook() == "value of keys/webhook-secrets/b"
    assert ring.get("a").webhook_secret is None
    config.now += MAX_AGE
    ring.get("a")  # read again: the same secret objects (their own caches)
    assert made == [("/keys/api-keys/a", "ssm"), ("keys/api-keys/b", "secretsmanager"),
                    ("keys/webhook-secrets/b", "secretsmanager")]


def test_no_key_at_all_is_a_clear_error() -> None:
    with pytest.raises(KeyConfigError, match="no Sume key"):
        KeyRing("main").first()


def test_parts_per_key_are_built_again_when_limits_change_not_when_the_key_rotates() -> None:
    config = Config({"acme": {"api_key": "sume_live_1", "reads_per_minute": 60}})
    ring = config.ring(DEFAULT)
    built: list[tuple[str, int]] = []
    parts = PerKey(ring, lambda key: built.append((key.id, key.limits.reads_per_minute)) or len(built),
                   removed=lambda key_id: f"removed {key_id}")
    assert parts("acme") == parts("acme") == 1
    config.text, config.now = json.dumps({"keys": {"acme": {"api_key": "sume_live_2", "reads_per_minute": 60}}}), \
        config.now + MAX_AGE
    assert parts("acme") == 1  # rotated: clients ask the ring for the value, nothing to rebuild
    config.text, config.now = json.dumps({"keys": {"acme": {"api_key": "sume_live_2", "reads_per_minute": 30}}}), \
        config.now + MAX_AGE
    assert parts("acme") == 2 and built == [("acme", 60), ("acme", 30)]
    assert parts("gone") == "removed gone"


def test_a_secret_kept_elsewhere_is_read_only_by_the_function_that_uses_it() -> None:
    """The key list names where each secret lives; a secret is read when first used. Fan-out (ids and
    limits) reads neither, the webhook function no API key, the pollers no webhook secret - which
    is what lets each role be granted only its own (template.yaml)."""
    reads: list[str] = []

    def secret(name: str, source: str) -> Any:
        return lambda: reads.append(name) or f"value of {name}"

    config = Config({"acme": {"api_key_from": "secretsmanager:keys/api-keys/acme", "reads_per_minute": 7,
                              "webhook_secret_from": "secretsmanager:keys/webhook-secrets/acme"}})
    fanout = config.ring(DEFAULT, secret=secret, config_name="keys")
    assert [(k.id, k.limits.reads_per_minute) for k in fanout.all()] == [("main", 120), ("acme", 7)]
    assert reads == []
    hook = fanout.get("acme").webhook_secret
    assert hook is not None and hook() == "value of keys/webhook-secrets/acme"
    assert reads == ["keys/webhook-secrets/acme"]


def test_format_1_inline_secrets_still_load_counted_and_named_by_id_never_value(
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """A deployed configuration from before the split keeps working (the functions that use its
    inline secrets read them) until make migrate-keys moves them; every read counts
    KeyConfigLegacy (alarmed) and the warning says what to do, with key ids only."""
    config = Config({"acme": {"api_key": "sume_live_acme", "webhook_secret": "whsec_acme"},
                     "globex": {"api_key_from": "secretsmanager:keys/api-keys/globex"}})
    ring = config.ring(DEFAULT, secret=lambda name, source: lambda: "sume_live_globex", config_name="keys")
    acme = ring.get("acme")
    assert acme.api_key() == "sume_live_acme"
    assert acme.webhook_secret is not None and acme.webhook_secret() == "whsec_acme"
    metrics = capsys.readouterr().out
    assert '"KeyConfigLegacy"' in metrics and "sume_live" not in metrics
    (warning,) = [r for r in caplog.records if "inline" in r.getMessage()]
    assert "make migrate-keys" in warning.getMessage() and warning.keys == ["acme"]
    assert "sume_live" not in warning.getMessage() + json.dumps(warning.keys)
    config.text = json.dumps({"keys": {"acme": {"api_key_from": "secretsmanager:keys/api-keys/acme"}}})
    config.now += MAX_AGE
    ring.get("acme")
    assert '"KeyConfigLegacy"' not in capsys.readouterr().out  # migrated: no longer counted

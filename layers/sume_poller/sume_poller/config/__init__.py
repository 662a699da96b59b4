"""Configuration, read once per container: settings from the environment (:mod:`.settings`),
the Sume keys a deployment serves with their limits (:mod:`.keys`), and secrets (:mod:`.credentials`).
"""

from __future__ import annotations

from .. import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "credentials": ("RedisCredentials", "Secret"),
    "keys": ("KeyRing", "Limits", "PerKey", "SumeKey", "UnknownKey", "record_key"),
    "settings": ("BudgetSettings", "Common", "ConfigError", "Env", "KeySettings", "RedisSettings", "SumeSettings",
                 "declared", "setting"),
})

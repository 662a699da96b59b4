"""The local stacks' key configuration (tools/stack/base.py): what ``keys=`` writes is what the
functions' key ring parses, each key's limits those its simulator options enforce."""

from __future__ import annotations

import json

from sume_poller.config.keys import KeyRing, Limits
from tools.stack.inprocess import InProcessStack


def test_the_key_configuration_of_keys_is_the_format_the_key_ring_parses() -> None:
    stack = InProcessStack(keys={"acme": {"read_budget": {"per_minute": 10, "per_day": None},
                                          "create_budget": {"per_day": 50}, "webhook_secret": "whsec_acme"},
                                 "globex": {"workspace": "ws_globex"}})  # not started: no service runs
    stack.keys = {"acme": "sume_local_acme_1", "globex": "sume_local_globex_1"}
    defaults = Limits(120, 0, 0, 0)
    stored = stack.key_secrets()
    ring = KeyRing("default", defaults=defaults, secret=lambda name, source: lambda: stored[name],
                   config_name="sume-poller/keys")
    keys = {k.id: k for k in ring.parse(json.dumps(stack.key_config()))}
    assert keys["acme"].limits == Limits(10, 0, 0, 50)  # per_day None: the deployment's (here 0)
    assert keys["acme"].api_key() == "sume_local_acme_1" and keys["acme"].webhook_secret() == "whsec_acme"  # type: ignore[misc]
    assert "sume_local" not in json.dumps(stack.key_config())  # format 2: no secret in the list
    inline = {k.id: k for k in ring.parse(json.dumps(stack.key_config(inline=True)))}  # format 1, as deployed before
    assert inline["acme"].api_key() == "sume_local_acme_1" and inline["acme"].limits == keys["acme"].limits
    assert keys["globex"].limits == defaults and keys["globex"].webhook_secret is None
    assert not keys["acme"].default and stack._key_options["acme"]["workspace"] == "acme"

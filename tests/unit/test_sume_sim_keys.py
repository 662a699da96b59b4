"""Unit tests of the Sume simulator's API keys (tools/sume_sim): several keys, one workspace each, each
with its own budgets and webhook secret. The model without HTTP, on a fake wall clock."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import pytest

from sume_poller.core.clock import ORIGIN, Clock
from tools.sume_sim.config import Config, derived_workspace, key_label, updated
from tools.sume_sim.model import Model, Reply, Request
from tools.sume_sim.spec import SpecError

KEY = "sume_unit_default_key"
KEY_A = "sume_live_aaaa_0123456789"
KEY_B = "sume_live_bbbb_9876543210"
#: Half a second into a minute window.
T0 = ORIGIN + 10 * 86_400.0 + 3600 + 0.5
HOOK = "http://127.0.0.1:9/hook"


class FakeWall:
    """A wall clock the test moves, in clock seconds (scale 1)."""

    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def make(**config: Any) -> tuple[Model, FakeWall]:
    wall = FakeWall()
    base = updated(Config(), {"time_scale": 1.0, "api_key": KEY, **config}, initial=True)
    return Model(Clock(1.0, wall=wall), base), wall


def two_keys(**config: Any) -> tuple[Model, FakeWall]:
    """The default key plus A (workspace "acme", 2 reads a minute) and B ("globex", 4 reads a minute)."""
    keys = {KEY_A: {"workspace": "acme", "read_budget": {"per_minute": 2}},
            KEY_B: {"workspace": "globex", "read_budget": {"per_minute": 4}}}
    return make(keys=keys, **config)


def as_key(key: str, **kw: Any) -> Request:
    return Request((key,), **kw)


def read(model: Model, key: str, job_id: str) -> Reply:
    return model.read_status(as_key(key), job_id)


def create(model: Model, key: str, body: dict[str, Any] | None = None, **kw: Any) -> Reply:
    return model.create(as_key(key, **kw), "image", json.dumps(body or {}).encode())


def job_id_of(reply: Reply) -> str:
    assert reply.status == 201, reply.body
    return str(reply.body["job"]["id"])


def listed(model: Model, key: str) -> set[str]:
    reply = model.list_jobs(as_key(key), {"limit": ["100"]})
    assert reply.status == 200, reply.body
    return {item["id"] for item in reply.body["jobs"]}


def minute(model: Model, workspace: str, cls: str = "reads") -> dict[str, Any]:
    return dict(model.budget_stats()["keys"][workspace][cls]["60"][-1])


# ---------------------------------------------------------------------------- budgets per key


def test_two_keys_hit_their_own_per_minute_limits_independently() -> None:
    model, wall = two_keys()
    job_a = model.seed_job("image", {"duration": 600}, key=KEY_A)
    job_b = model.seed_job("image", {"duration": 600}, key=KEY_B)
    a = [read(model, KEY_A, job_a) for _ in range(3)]
    assert [r.status for r in a] == [200, 200, 429]
    assert [r.header("RateLimit-Remaining") for r in a] == ["1", "0", "0"]
    assert a[2].header("Retry-After") == "60" and a[2].header("RateLimit-Policy") == "2;w=60"
    b = [read(model, KEY_B, job_b) for _ in range(5)]  # A's 429 took nothing from B
    assert [r.status for r in b] == [200, 200, 200, 200, 429]
    assert [r.header("RateLimit-Limit") for r in b] == ["4"] * 5 and b[0].header("RateLimit-Remaining") == "3"
    assert b[4].header("Retry-After") == "60"
    wall.advance(20)
    assert read(model, KEY_A, job_a).header("Retry-After") == "40"  # from A's own window
    default_job = model.seed_job("image")
    assert read(model, KEY, default_job).header("RateLimit-Limit") is None  # the top level enforces nothing
    assert (minute(model, "acme")["attempts"], minute(model, "acme")["refused"]) == (4, 2)
    assert (minute(model, "globex")["attempts"], minute(model, "globex")["refused"]) == (5, 1)
    wall.advance(40)  # a new minute for both
    assert read(model, KEY_A, job_a).status == 200 and read(model, KEY_B, job_b).status == 200
    assert model.stats()["rate_limited"] == 3


def test_a_key_takes_the_top_level_budgets_and_secret_unless_it_names_its_own() -> None:
    model, _ = make(read_budget={"per_minute": 5}, create_budget={"per_day": 7},
                    keys={KEY_A: {}, KEY_B: {"create_budget": {"per_minute": None, "per_day": None}}})
    accounts = {a.key: a for a in model.config.accounts()}
    assert accounts[KEY_A].workspace == derived_workspace(KEY_A) and accounts[KEY_A].workspace.startswith("ws_")
    assert (accounts[KEY_A].read_budget.per_minute, accounts[KEY_A].create_budget.per_day) == (5, 7)
    assert accounts[KEY_B].create_budget.enforced is False and accounts[KEY_B].read_budget.per_minute == 5
    model.configure(read_budget={"per_minute": 9})  # inherited budgets follow the top level
    assert create(model, KEY_A).header("RateLimit-Policy") == "7;w=86400"
    assert create(model, KEY_B).header("RateLimit-Policy") is None
    job_id = model.seed_job("image", key=KEY_A)
    assert read(model, KEY_A, job_id).header("RateLimit-Policy") == "9;w=60"


# ---------------------------------------------------------------------------- workspaces


def test_a_job_of_another_workspace_is_403_and_costs_the_callers_read_budget() -> None:
    model, _ = two_keys()
    theirs = job_id_of(create(model, KEY_B))
    for reply in (read(model, KEY_A, theirs), model.read_result(as_key(KEY_A), theirs)):
        assert reply.status == 403 and set(reply.body) == {"error", "request_id"}
        assert reply.body["error"]["code"] == "forbidden"
        assert reply.body["error"]["message"] == f"job {theirs} belongs to another workspace"
    assert read(model, KEY_A, theirs).status == 429  # the two 403s spent A's two reads
    assert read(model, KEY_B, theirs).status == 200
    assert minute(model, "globex")["attempts"] == 1
    info = model.job_info(theirs)
    assert info is not None and info["workspace"] == "globex"
    assert info["status_reads"] == 1 and info["result_reads"] == 0  # the owner's reads only
    stats = model.stats()
    assert stats["forbidden"] == 2 and stats["keys"]["acme"]["forbidden"] == 2
    assert stats["status_reads"] == 3 and stats["result_reads"] == 1


def test_the_list_shows_only_the_callers_workspace() -> None:
    model, _ = two_keys(list={"newest_n": 2})
    mine = {job_id_of(create(model, KEY_A)) for _ in range(2)}
    theirs = {job_id_of(create(model, KEY_B)) for _ in range(3)}
    default = model.seed_job("image")
    assert listed(model, KEY_A) == mine  # newest_n counts the workspace's own jobs
    assert len(listed(model, KEY_B)) == 2 and listed(model, KEY_B) <= theirs
    assert listed(model, KEY) == {default}
    assert read(model, KEY, next(iter(mine))).status == 403


def test_idempotency_keys_are_scoped_per_workspace() -> None:
    model, _ = two_keys()
    first = create(model, KEY_A, {"prompt": "x"}, idempotency_key="submit-1")
    again = create(model, KEY_A, {"prompt": "x"}, idempotency_key="submit-1")
    assert again.header("Idempotent-Replayed") == "true" and again.body == first.body
    other = create(model, KEY_B, {"prompt": "x"}, idempotency_key="submit-1")
    assert other.header("Idempotent-Replayed") is None and job_id_of(other) != job_id_of(first)
    assert model.job_info(job_id_of(other))["workspace"] == "globex"  # type: ignore[index]
    stats = model.stats()
    assert (stats["creates"], stats["replays"]) == (2, 1)
    assert (stats["keys"]["acme"]["replays"], stats["keys"]["globex"]["replays"]) == (1, 0)


def test_seeded_jobs_belong_to_a_key_a_workspace_or_the_default_one() -> None:
    model, _ = two_keys()
    by_key = model.seed_job("image", key=KEY_B)
    by_name = model.seed_job("image", workspace="globex")
    nobody = model.seed_job("image", workspace="initech")
    default = model.seed_job("image")
    assert listed(model, KEY_B) == {by_key, by_name} and listed(model, KEY) == {default}
    assert read(model, KEY, nobody).status == 403
    cases: list[tuple[dict[str, Any], str]] = [({"key": "sume_nope"}, "key"), ({"workspace": ""}, "workspace"),
                                               ({"key": KEY_A, "workspace": "acme"}, "workspace")]
    for kwargs, field in cases:
        with pytest.raises(SpecError) as caught:
            model.seed_job("image", **kwargs)
        assert caught.value.field_name == field and "sume_nope" not in str(caught.value)
    assert model.stats()["keys"]["initech"]["key"] is None


# ---------------------------------------------------------------------------- keys at runtime


def test_rotate_hands_the_workspace_limits_and_book_to_the_new_key() -> None:
    model, _ = two_keys()
    job_id = job_id_of(create(model, KEY_A, idempotency_key="submit-1"))
    assert read(model, KEY_A, job_id).header("RateLimit-Remaining") == "1"
    new = "sume_live_aaaa_rotated_1"
    assert model.rotate_key(KEY_A, new) == {"workspace": "acme", "key": "sume_liv..."}
    assert read(model, KEY_A, job_id).status == 401
    kept = read(model, new, job_id)  # the book came along: one read left, now none
    assert (kept.status, kept.header("RateLimit-Remaining")) == (200, "0")
    assert read(model, new, job_id).status == 429
    replay = create(model, new, idempotency_key="submit-1")
    assert replay.header("Idempotent-Replayed") == "true" and job_id_of(replay) == job_id
    assert minute(model, "acme")["attempts"] == 3 and new in model.config.to_dict()["keys"]
    assert KEY_A not in model.config.to_dict()["keys"]
    model.rotate_key(KEY, "sume_default_rotated")  # the top-level key rotates too
    assert model.config.api_key == "sume_default_rotated"
    assert model.list_jobs(as_key(KEY), {}).status == 401
    assert model.list_jobs(as_key("sume_default_rotated"), {}).status == 200
    for old, fresh, field in ((KEY_A, "x_key", "old"), (KEY_B, new, "new"), (KEY_B, " spaced", "new")):
        with pytest.raises(SpecError) as caught:
            model.rotate_key(old, fresh)
        assert caught.value.field_name == field and KEY_A not in str(caught.value)


def test_remove_and_add_keys() -> None:
    model, _ = two_keys()
    job_id = job_id_of(create(model, KEY_B))
    assert model.remove_key(KEY_B) == {"workspace": "globex", "key": "sume_liv..."}
    assert read(model, KEY_B, job_id).status == 401 and create(model, KEY_B).status == 401
    with pytest.raises(SpecError) as caught:
        model.remove_key(KEY_B)
    assert caught.value.field_name == "key"
    stats = model.stats()["keys"]
    assert stats["globex"]["key"] is None and stats["globex"]["jobs_created"] == 1  # counts stay
    assert "globex" not in model.budget_stats()["keys"]
    added = model.add_key({"key": "sume_live_cccc_555", "workspace": "globex", "read_budget": {"per_minute": 1}})
    assert added == {"workspace": "globex", "key": "sume_liv..."}
    assert read(model, "sume_live_cccc_555", job_id).status == 200  # the workspace's jobs are its jobs
    assert read(model, "sume_live_cccc_555", job_id).status == 429
    model.remove_key(KEY)  # the top-level key: the default workspace has no key now
    assert model.config.to_dict()["api_key"] is None and model.list_jobs(as_key(KEY), {}).status == 401
    for entry, field in (({"key": KEY_A}, "key"), ({"key": "k9", "workspace": "acme"}, "workspace"),
                         ({"key": "k9", "bogus": 1}, "bogus"), ({"workspace": "w"}, "key"),
                         ({"key": "k9", "read_budget": {"per_hour": 1}}, "per_hour")):
        with pytest.raises(SpecError) as caught:
            model.add_key(entry)
        assert caught.value.field_name == field


# ---------------------------------------------------------------------------- stats


def test_stats_break_down_per_key_named_by_workspace_never_by_the_key() -> None:
    model, _ = two_keys(create_budget={"per_minute": 2})
    job_a = job_id_of(create(model, KEY_A))
    create(model, KEY_A)
    assert create(model, KEY_A).status == 429
    for _ in range(3):
        read(model, KEY_A, job_a)
    read(model, KEY_B, job_a)
    stats = model.stats()
    acme = stats["keys"]["acme"]
    assert acme == {"key": "sume_liv...", "read_budget": {"per_minute": 2, "per_day": None},
                    "create_budget": {"per_minute": 2, "per_day": None},
                    "reads": {"attempts": 3, "served": 2, "rate_limited": 1},
                    "creates": {"attempts": 3, "served": 2, "rate_limited": 1},
                    "jobs_created": 2, "replays": 0, "forbidden": 0}
    globex = stats["keys"]["globex"]
    assert globex["reads"] == {"attempts": 1, "served": 1, "rate_limited": 0} and globex["forbidden"] == 1
    assert list(stats["keys"]) == ["default", "acme", "globex"]
    # what a benchmark computes per key: served over budget, 429s per attempt
    assert acme["reads"]["served"] / acme["read_budget"]["per_minute"] == 1.0
    assert acme["reads"]["rate_limited"] / acme["reads"]["attempts"] == pytest.approx(1 / 3)
    budget = model.budget_stats()
    assert set(budget["keys"]) == {"default", "acme", "globex"}
    assert budget["keys"]["acme"]["creates"]["60"][-1]["served"] == 2
    for answer in (stats, budget):
        text = json.dumps(answer)
        assert all(key not in text for key in (KEY, KEY_A, KEY_B))


def test_key_labels_never_show_a_whole_key() -> None:
    assert key_label("sume_live_abcdef0123") == "sume_liv..."
    assert key_label("k2") == "k..." and key_label("x") == "..."


# ---------------------------------------------------------------------------- webhooks


def test_webhooks_are_signed_with_the_workspace_keys_secret() -> None:
    keys = {KEY_A: {"workspace": "acme", "webhook_secret": "whsec_acme"}, KEY_B: {"workspace": "globex"}}
    model, wall = make(keys=keys, webhooks={"kinds": ["image"], "secret": "whsec_top"})
    mine = job_id_of(create(model, KEY_A, {"webhook_url": HOOK, "sim": {"duration": 1}}))
    inherited = job_id_of(create(model, KEY_B, {"webhook_url": HOOK, "sim": {"duration": 1}}))
    wall.advance(1.5)
    secrets = {}
    for delivery in model.take_due_webhooks():
        stamp = delivery.headers["X-Sume-Timestamp"]
        for secret in ("whsec_acme", "whsec_top"):
            digest = hmac.new(secret.encode(), f"{stamp}.".encode() + delivery.plan.body, hashlib.sha256).hexdigest()
            if delivery.headers["X-Sume-Signature"] == f"v1={digest}":
                secrets[delivery.plan.job_id] = secret
    assert secrets == {mine: "whsec_acme", inherited: "whsec_top"}


# ---------------------------------------------------------------------------- config


def test_a_config_with_only_api_key_is_unchanged() -> None:
    model, _ = make(read_budget={"per_minute": 1})
    config = model.config.to_dict()
    assert config["api_key"] == KEY and config["keys"] == {}
    job_id = model.seed_job("image")
    assert model.read_status(as_key(KEY), job_id).status == 200
    assert model.read_status(as_key(KEY), job_id).status == 429
    assert model.read_status(as_key("wrong"), job_id).status == 401
    assert model.job_info(job_id)["workspace"] == "default"  # type: ignore[index]
    assert model.list_jobs(as_key(KEY), {}).status == 429  # one budget for every read
    budget = model.budget_stats()
    assert budget["reads"] == budget["keys"]["default"]["reads"] and list(budget["keys"]) == ["default"]
    assert model.configure(api_key="sume_second")["api_key"] == "sume_second"
    assert model.read_status(as_key("sume_second"), job_id).status == 200  # a fresh book, as before


def test_keys_config_is_validated_with_field_names() -> None:
    model, _ = make()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"keys": ["k"]}, "keys"),
        ({"keys": {"": {}}}, "keys"),
        ({"keys": {"k1": "acme"}}, "keys"),
        ({"keys": {"k1": {"tier": 1}}}, "tier"),
        ({"keys": {"k1": {"workspace": ""}}}, "workspace"),
        ({"keys": {"k1": {"workspace": "w" * 65}}}, "workspace"),
        ({"keys": {"k1": {"read_budget": {"per_minute": 0}}}}, "per_minute"),
        ({"keys": {"k1": {"webhook_secret": 5}}}, "webhook_secret"),
        ({"keys": {KEY: {}}}, "keys"),
        ({"keys": {"k1": {"workspace": "default"}}}, "workspace"),
        ({"keys": {"k1": {"workspace": "w"}, "k2": {"workspace": "w"}}}, "workspace"),
        ({"api_key": ""}, "api_key"),
    ]
    for changes, field in cases:
        with pytest.raises(SpecError) as caught:
            model.configure(**changes)
        assert caught.value.field_name == field, changes
    config = model.configure(keys={"k1": {"workspace": "w", "read_budget": {"per_minute": 3}}})
    assert config["keys"] == {"k1": {"workspace": "w", "read_budget": {"per_minute": 3, "per_day": None}}}
    assert model.configure(**config)["keys"] == config["keys"]  # the config answer round-trips
    assert model.configure(api_key=None, keys={"k1": {"workspace": "default"}})["api_key"] is None

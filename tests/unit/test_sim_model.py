"""Unit tests of the Sume simulator's model (tools/sume_sim), without HTTP, on a fake wall clock."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
from datetime import datetime
from typing import Any

import pytest

from sume_poller.core.clock import ORIGIN, Clock
from tools.sume_sim.config import Config, updated
from tools.sume_sim.http import api_keys, render
from tools.sume_sim.model import Model, Reply, Request
from tools.sume_sim.spec import SpecError, parse_spec
from tools.sume_sim.timeline import hint_value

KEY = "sume_unit_key"
DAY = 86_400.0
#: A clock time half a second into a minute window (and into the 11th day after the origin, + 1 h).
T0 = ORIGIN + 10 * DAY + 3600 + 0.5


class FakeWall:
    """A wall clock the test moves; positions are given in clock seconds of ``scale``."""

    def __init__(self, scale: float, clock_time: float = T0) -> None:
        self.scale = scale
        self.clock_time = clock_time

    def __call__(self) -> float:
        return ORIGIN + (self.clock_time - ORIGIN) * self.scale

    def advance(self, clock_seconds: float) -> None:
        self.clock_time += clock_seconds


def make(scale: float = 1.0, **config: Any) -> tuple[Model, FakeWall]:
    wall = FakeWall(scale)
    base = updated(Config(), {"time_scale": scale, "api_key": KEY, **config}, initial=True)
    return Model(Clock(scale, wall=wall), base), wall


def req(**kw: Any) -> Request:
    return Request((KEY,), **kw)


def view(model: Model, job_id: str) -> dict[str, Any]:
    reply = model.read_status(req(), job_id)
    assert reply.status == 200, reply.body
    return dict(reply.body["job"])


def create(model: Model, kind: str = "image", body: dict[str, Any] | None = None, **kw: Any) -> Reply:
    return model.create(req(**kw), kind, json.dumps(body or {}).encode())


def list_page(model: Model, query: str = "") -> Reply:
    parsed: dict[str, list[str]] = {}
    for part in filter(None, query.split("&")):
        name, _, value = part.partition("=")
        parsed.setdefault(name, []).append(value)
    return model.list_jobs(req(), parsed)


def info(model: Model, job_id: str) -> dict[str, Any]:
    found = model.job_info(job_id)
    assert found is not None
    return found


def window(model: Model, cls: str = "reads", size: str = "60") -> dict[str, Any]:
    return dict(model.budget_stats()[cls][size][-1])


def clock_of(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


# ---------------------------------------------------------------------------- timeline and hints


@pytest.mark.parametrize("scale", [1.0, 0.1, 0.001])
def test_timeline_and_hints_are_in_clock_seconds(scale: float) -> None:
    model, wall = make(scale)
    job_id = model.seed_job("video", {"duration": 20, "steps": 2, "result_delay": 5})
    fresh = view(model, job_id)
    assert (fresh["status"], fresh["terminal"], fresh["next_poll_after_seconds"]) == ("queued", False, 10)
    assert clock_of(fresh["created_at"]) == pytest.approx(T0, abs=0.01)
    wall.advance(10.5)
    running = view(model, job_id)
    assert (running["status"], running["next_poll_after_seconds"]) == ("running", 10)
    assert clock_of(running["updated_at"]) == pytest.approx(T0 + 10, abs=0.01)
    wall.advance(10)
    done = view(model, job_id)
    assert (done["status"], done["terminal"], done["result_ready"]) == ("completed", True, False)
    assert done["next_poll_after_seconds"] == 5 and done["result_url"] is None
    assert model.read_result(req(), job_id).status == 409
    wall.advance(5)
    ready = view(model, job_id)
    assert ready["result_ready"] is True and ready["next_poll_after_seconds"] == 0
    assert model.read_result(req(), job_id).status == 200


def test_hint_rounding_and_exact_hints() -> None:
    assert [hint_value(r, exact=False) for r in (None, 0, -1, 0.2, 1.0, 2.5, 3.0000000001)] == [0, 0, 0, 1, 1, 3, 3]
    assert [hint_value(r, exact=True) for r in (0.0004, 0.2, 2.5004)] == [0.001, 0.2, 2.5]
    model, wall = make(0.01, exact_hints=True)
    job_id = model.seed_job("image", {"duration": 3, "steps": 1})
    wall.advance(0.75)
    assert view(model, job_id)["next_poll_after_seconds"] == pytest.approx(2.25, abs=0.001)


def test_seeded_age_and_phases_cycle() -> None:
    model, _ = make()
    late = model.seed_job("image", {"duration": 9, "steps": 3}, age=7)
    assert (view(model, late)["status"], view(model, late)["next_poll_after_seconds"]) == ("processing", 2)
    four = model.seed_job("image", {"duration": 8, "steps": 4}, age=7)
    assert view(model, four)["status"] == "queued"  # the fourth phase cycles back


def test_min_reads_counts_changes_ahead_of_the_first_read() -> None:
    model, wall = make()
    job_id = model.seed_job("video", {"duration": 6, "steps": 2, "result_delay": 5})
    assert model.stats()["jobs"][job_id]["min_reads"] == 3
    wall.advance(4)
    view(model, job_id)
    assert model.stats()["jobs"][job_id]["min_reads"] == 3  # the boundary at 6 and the result at 11
    lagging = model.seed_job("image", {"duration": 6, "steps": 2, "not_found_for": 2})
    assert model.read_status(req(), lagging).status == 404
    assert model.stats()["jobs"][lagging]["min_reads"] == 4  # the 404 read, then 3 from the lag's end


def after_terminal(model: Model, job_id: str) -> int:
    return int(model.stats()["jobs"][job_id]["status_reads_after_terminal"])


def test_status_reads_while_the_result_is_not_ready_are_not_after_terminal() -> None:
    model, wall = make()
    job_id = model.seed_job("video", {"duration": 2, "steps": 1, "result_delay": 5})
    wall.advance(2.5)
    for _ in range(3):  # completed, result_ready false: reading the status again is how to wait
        done = view(model, job_id)
        assert (done["status"], done["result_ready"]) == ("completed", False)
    assert after_terminal(model, job_id) == 0
    wall.advance(5)
    assert view(model, job_id)["result_ready"] is True
    assert after_terminal(model, job_id) == 0  # the read that saw the result ready is not after it
    view(model, job_id)
    model.read_status(req(), job_id)
    assert after_terminal(model, job_id) == 2 and info(model, job_id)["status_reads_after_terminal"] == 2
    assert model.stats()["jobs"][job_id]["min_reads"] == 2  # the first read and the result becoming ready


@pytest.mark.parametrize("outcome", ["failed", "canceled", "expired", "mystery"])
def test_a_failure_is_all_a_client_needs(outcome: str) -> None:
    model, _ = make()
    job_id = model.seed_job("image", {"duration": 0, "outcome": outcome, "result_delay": 5})
    view(model, job_id)
    assert after_terminal(model, job_id) == 0
    view(model, job_id)
    assert after_terminal(model, job_id) == 1


@pytest.mark.parametrize("where", ["job", "config"])
def test_without_hints_one_terminal_answer_is_all_a_client_needs(where: str) -> None:
    model, wall = make(hints=where == "job")
    spec = {"duration": 6, "steps": 2, "result_delay": 5, **({"hints": False} if where == "job" else {})}
    job_id = model.seed_job("video", spec)
    wall.advance(4)
    assert "result_ready" not in view(model, job_id)
    assert model.stats()["jobs"][job_id]["min_reads"] == 2  # the first read and the completion at 6
    wall.advance(3)
    assert view(model, job_id)["status"] == "completed"  # the result is not ready, but nothing says so
    view(model, job_id)
    assert after_terminal(model, job_id) == 1
    model.configure(hints=True)
    if where == "config":  # replies carry hints again: readiness is a change the client can see
        assert model.stats()["jobs"][job_id]["min_reads"] == 3


def test_an_overridden_status_is_not_a_terminal_answer() -> None:
    model, _ = make()
    job_id = model.seed_job("image", {"duration": 0, "status_override": {"status": "mystery", "reads": 2}})
    assert [view(model, job_id)["status"] for _ in range(3)] == ["mystery", "mystery", "completed"]
    assert after_terminal(model, job_id) == 0
    view(model, job_id)
    assert after_terminal(model, job_id) == 1


@pytest.mark.parametrize(("outcome", "code"), [("failed", "generation_failed"), ("canceled", "canceled"),
                                               ("expired", "expired"), ("mystery", None)])
def test_failure_outcomes(outcome: str, code: str | None) -> None:
    model, _ = make()
    job = view(model, model.seed_job("image", {"duration": 0, "outcome": outcome}))
    assert job["status"] == outcome and job["terminal"] is True and job["result_ready"] is False
    assert (job["error"] or {}).get("code") == code


def test_status_override_then_real_status() -> None:
    model, _ = make()
    job_id = model.seed_job("image", {"duration": 0, "status_override": {"status": "mystery", "reads": 1}})
    first = view(model, job_id)
    assert (first["status"], first["terminal"], first["next_poll_after_seconds"]) == ("mystery", False, 1)
    assert view(model, job_id)["status"] == "completed"


def test_terminal_flag_overrides_the_reported_terminal() -> None:
    model, _ = make()
    done = view(model, model.seed_job("image", {"duration": 0, "terminal_flag": False}))
    assert done["status"] == "completed" and done["terminal"] is False
    early = view(model, model.seed_job("image", {"duration": 60, "terminal_flag": True}))
    assert early["status"] == "queued" and early["terminal"] is True
    plain = view(model, model.seed_job("image", {"duration": 60, "terminal_flag": True, "hints": False}))
    assert "terminal" not in plain


def test_job_and_create_types_are_sumes() -> None:
    model, _ = make()
    expected = {"image": "image_generation", "video": "video_generation", "ad_video": "ad_video_generation",
                "face_swap": "face_swap", "reference_analysis": "reference_analysis"}
    for kind, sume_type in expected.items():
        assert view(model, model.seed_job(kind))["type"] == sume_type
    created = create(model, "video")
    assert created.status == 201 and created.body["job"]["type"] == "video_generation"
    assert info(model, created.body["job"]["id"])["kind"] == "video"


def test_spec_validation() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec("image", {"outcom": "failed"})
    assert err.value.field_name == "outcom"
    for bad in ({"result_shape": "xml"}, {"forbidden": 1}, {"not_found_for": -1}, {"faults": ["boom"]},
                {"terminal_flag": "no"}, {"result_bytes": 0}):
        with pytest.raises(SpecError):
            parse_spec("image", bad)
    assert parse_spec("face_swap", None).id_shape == "job_ids"


# ---------------------------------------------------------------------------- faults and creates


def test_faults_in_order_and_slow_delay() -> None:
    model, _ = make()
    job_id = model.seed_job("image", {"duration": 60, "faults": ["429:7", "503", "malformed", "html", "empty",
                                                                "slow:150"]})
    limited = model.read_status(req(), job_id)
    assert (limited.status, limited.header("Retry-After")) == (429, "7")
    assert model.read_status(req(), job_id).body["error"]["code"] == "internal_error"
    malformed = model.read_status(req(), job_id)
    assert malformed.status == 200 and malformed.raw is not None
    with pytest.raises(ValueError):
        json.loads(malformed.raw)
    assert model.read_status(req(), job_id).content_type.startswith("text/html")
    assert model.read_status(req(), job_id).raw == b""
    slow = model.read_status(req(), job_id)
    assert slow.status == 200 and slow.delay == pytest.approx(0.15)
    assert info(model, job_id)["faults_remaining"] == []


def test_random_faults_are_seeded() -> None:
    def codes(seed: int) -> list[int]:
        model, _ = make(error_rate_5xx=0.5, seed=seed)
        job_id = model.seed_job("image")
        return [model.read_status(req(), job_id).status for _ in range(30)]

    assert codes(3) == codes(3)
    assert set(codes(3)) == {200, 500, 503}


def test_idempotent_replay_and_create_faults() -> None:
    model, _ = make()
    first = create(model, body={"prompt": "x"}, idempotency_key="k1")
    again = create(model, body={"prompt": "x"}, idempotency_key="k1")
    assert render(first).body == render(again).body and again.header("Idempotent-Replayed") == "true"
    body = {"sim": {"create_faults": ["503:2", "slow:300"]}}
    refused = create(model, body=body, idempotency_key="k2")
    assert (refused.status, refused.header("Retry-After")) == (503, "2")
    late = create(model, body=body, idempotency_key="k2")
    assert late.status == 201 and late.delay == pytest.approx(0.3)
    replay = create(model, body=body, idempotency_key="k2")
    assert replay.body == late.body and replay.delay == 0
    stats = model.stats()
    assert (stats["creates"], stats["jobs_created"], stats["replays"], stats["create_requests"]) == (2, 2, 2, 5)


def test_insufficient_credits_and_bad_bodies() -> None:
    model, _ = make()
    assert create(model, body={"sim": {"insufficient_credits": True}}).status == 402
    assert model.create(req(), "image", b"{nope").status == 400
    assert create(model, body={"sim": {"steps": 0}}).body["error"]["details"] == {"field": "steps"}
    assert model.stats()["jobs_created"] == 0


# ---------------------------------------------------------------------------- budgets


@pytest.mark.parametrize("scale", [1.0, 0.01])
def test_minute_window_counts_refused_attempts(scale: float) -> None:
    model, wall = make(scale, read_budget={"per_minute": 3})
    job_id = model.seed_job("image", {"duration": 600})
    remaining = [model.read_status(req(), job_id).header("RateLimit-Remaining") for _ in range(3)]
    assert remaining == ["2", "1", "0"]
    wall.advance(10)
    refused = [model.read_status(req(), job_id) for _ in range(5)]
    assert {r.status for r in refused} == {429}
    assert refused[0].body["error"]["code"] == "rate_limit_exceeded"
    assert refused[0].header("Retry-After") == "50"  # clock seconds to the window's end (59.5 - 10, up)
    assert refused[0].header("RateLimit-Reset") == "50" and refused[0].header("RateLimit-Remaining") == "0"
    stats = window(model)
    assert (stats["attempts"], stats["served"], stats["refused"], stats["limit"]) == (8, 3, 5, 3)
    assert stats["start"] == math.floor(T0 / 60) * 60
    wall.advance(50)  # the next window
    assert model.read_status(req(), job_id).status == 200
    assert [w["attempts"] for w in model.budget_stats()["reads"]["60"]] == [8, 1]
    assert model.stats()["rate_limited"] == 5 and model.stats()["status_reads"] == 9


def test_day_window_and_the_headers_choice_of_window() -> None:
    model, wall = make(read_budget={"per_minute": 3, "per_day": 4})
    job_id = model.seed_job("image", {"duration": 600})
    first = model.read_status(req(), job_id)
    assert first.header("RateLimit-Policy") == "3;w=60, 4;w=86400"
    assert (first.header("RateLimit-Limit"), first.header("RateLimit-Remaining")) == ("3", "2")  # minute is tighter
    model.read_status(req(), job_id)
    wall.advance(60)
    third = model.read_status(req(), job_id)  # minute: 1 of 3, day: 3 of 4 -> the day window is tighter
    assert (third.header("RateLimit-Limit"), third.header("RateLimit-Remaining")) == ("4", "1")
    model.read_result(req(), job_id)  # day: 4 of 4
    refused = model.read_status(req(), job_id)
    day_left = math.ceil((math.floor(T0 / DAY) + 1) * DAY - (T0 + 60))
    assert refused.status == 429 and refused.header("Retry-After") == str(day_left)
    # both windows have 0 left: the headers report the shorter one, Retry-After the one that refused
    assert (refused.header("RateLimit-Limit"), refused.header("RateLimit-Remaining")) == ("3", "0")
    assert refused.header("RateLimit-Reset") == "60"
    day = window(model, size="86400")
    assert (day["attempts"], day["served"], day["refused"]) == (5, 4, 1)


def test_ties_pick_the_shorter_window_and_unenforced_sends_nothing() -> None:
    model, _ = make(read_budget={"per_minute": 10, "per_day": 10})
    job_id = model.seed_job("image")
    reply = model.read_status(req(), job_id)
    assert reply.header("RateLimit-Remaining") == "9" and int(reply.header("RateLimit-Reset") or 0) <= 60
    model.configure(read_budget=None)
    assert model.read_status(req(), job_id).header("RateLimit-Limit") is None
    assert create(model).header("RateLimit-Limit") is None


def test_create_budget_is_separate_from_reads() -> None:
    model, _ = make(create_budget={"per_minute": 1}, read_budget={"per_day": 100})
    created = create(model)
    assert (created.header("RateLimit-Policy"), created.header("RateLimit-Remaining")) == ("1;w=60", "0")
    refused = create(model)
    assert refused.status == 429 and refused.header("Retry-After") == "60"
    read = model.read_status(req(), created.body["job"]["id"])
    assert read.header("RateLimit-Policy") == "100;w=86400"
    assert window(model, "creates")["refused"] == 1 and model.stats()["jobs_created"] == 1


def test_served_never_exceeds_the_limit() -> None:
    model, wall = make(0.01, read_budget={"per_minute": 7, "per_day": 20})
    job_id = model.seed_job("image")
    statuses = []
    for _ in range(10):
        statuses += [model.read_status(req(), job_id).status for _ in range(5)]
        wall.advance(30)
    for size, limit in (("60", 7), ("86400", 20)):
        for entry in model.budget_stats()["reads"][size]:
            assert entry["served"] <= limit
    # refused attempts count too: the day's 20 are used up after two minutes of 10 attempts
    assert statuses.count(200) == 14


def test_other_consumer_spends_its_share_evenly() -> None:
    model, wall = make(read_budget={"per_minute": 100}, other_consumer_share=0.5)
    job_id = model.seed_job("image", {"duration": 600})
    wall.advance(29.5)  # 30 s into the window: the other client has spent 25
    assert model.read_status(req(), job_id).header("RateLimit-Remaining") == "74"
    for _ in range(59):
        model.read_status(req(), job_id)
    wall.advance(20)  # 50 s in: the other wants 41 but only 40 fit
    refused = model.read_status(req(), job_id)
    assert refused.status == 429 and refused.header("RateLimit-Remaining") == "0"
    entry = window(model)
    assert (entry["attempts"], entry["served"], entry["refused"]) == (61, 60, 1)
    assert (entry["other"], entry["other_served"]) == (41, 40)
    wall.advance(60)
    model.read_status(req(), job_id)
    closed = model.budget_stats()["reads"]["60"][0]
    assert closed["other"] == 50 and closed["other_served"] == 40  # finished its even share; no room left


def test_budgets_are_per_key() -> None:
    model, _ = make(read_budget={"per_minute": 1})
    job_id = model.seed_job("image")
    assert model.read_status(req(), job_id).status == 200
    assert model.read_status(req(), job_id).status == 429
    model.configure(api_key="sume_second_key")
    assert model.read_status(Request(("sume_second_key",)), job_id).status == 200


# ---------------------------------------------------------------------------- deployment behaviours


def test_read_after_create_lag() -> None:
    model, wall = make(0.01, not_found_for=3)
    lagging = model.create(req(), "image", b"{}").body["job"]["id"]
    immediate = model.seed_job("image", {"not_found_for": 0})
    assert model.read_status(req(), lagging).body["error"]["code"] == "not_found"
    assert model.read_result(req(), lagging).status == 404
    assert model.read_status(req(), immediate).status == 200
    assert list_page(model).body["jobs"] == [{"id": immediate, "type": "image_generation", "status": "queued"}]
    wall.advance(3.5)
    assert model.read_status(req(), lagging).status == 200
    assert model.read_result(req(), lagging).status == 200
    assert info(model, lagging)["status_reads"] == 2


def test_forbidden_job_and_forbidden_key() -> None:
    model, _ = make()
    foreign = model.seed_job("image", {"duration": 0, "forbidden": True})
    for reply in (model.read_status(req(), foreign), model.read_result(req(), foreign)):
        assert reply.status == 403 and reply.body["error"]["code"] == "forbidden"
        assert set(reply.body) == {"error", "request_id"}
    assert list_page(model).body["jobs"] == []
    model.configure(key_forbidden=True)
    assert model.read_status(req(), foreign).status == 403
    assert create(model).status == 403 and list_page(model).status == 403
    assert model.read_status(Request(("wrong",)), foreign).status == 401
    assert model.stats()["forbidden"] == 5 and model.stats()["unauthorized"] == 1


@pytest.mark.parametrize("shape", ["object", "list", "string", "large"])
def test_result_shapes(shape: str) -> None:
    model, _ = make()
    job_id = model.seed_job("image", {"duration": 0, "result_shape": shape, "result_bytes": 5000})
    reply = model.read_result(req(), job_id)
    rendered = render(reply)
    assert reply.status == 200 and ("X-Request-Id", reply.request_id) in rendered.headers
    body = json.loads(rendered.body)
    if shape == "list":
        assert isinstance(body, list) and body[0]["url"].startswith("https://")
    elif shape == "string":
        assert isinstance(body, str) and body.startswith("https://cdn.sume.example/")
    else:
        assert body["request_id"] == reply.request_id and body["type"] == "image_generation"
        assert (len(rendered.body) > 5000) == (shape == "large")


def test_large_result_default_size() -> None:
    model, _ = make()
    job_id = model.seed_job("video", {"duration": 0, "result_shape": "large"})
    assert len(render(model.read_result(req(), job_id)).body) > 400_000


@pytest.mark.parametrize(("status", "code"), [(404, "not_found"), (409, "result_not_ready"),
                                              (425, "result_not_ready")])
def test_result_not_ready_answer_is_configurable(status: int, code: str) -> None:
    model, wall = make(result_not_ready=status)
    waiting = model.seed_job("video", {"duration": 2, "result_delay": 5})
    failed = model.seed_job("image", {"duration": 0, "outcome": "failed"})
    for _ in range(2):  # while running, then completed and not ready
        reply = model.read_result(req(), waiting)
        assert reply.status == status and reply.body["error"]["code"] == code
        assert set(reply.body) == {"error", "request_id"}
        wall.advance(3)
    assert reply.body["error"]["details"] == {"status": "completed", "terminal": True}
    never = model.read_result(req(), failed)  # a failure never has a result: 409 whatever the mode
    assert (never.status, never.body["error"]["code"]) == (409, "result_not_ready")
    wall.advance(2)
    assert model.read_result(req(), waiting).status == 200


def test_result_not_ready_per_job_directive_and_validation() -> None:
    model, _ = make()
    assert model.config.result_not_ready == 409 and model.config.to_dict()["result_not_ready"] == 409
    early = model.seed_job("image", {"duration": 0, "result_delay": 5, "result_not_ready": 425})
    plain = model.seed_job("image", {"duration": 0, "result_delay": 5})
    model.configure(result_not_ready=404)
    assert model.read_result(req(), early).status == 425  # the job's directive wins over the config
    assert model.read_result(req(), plain).status == 404
    assert info(model, early)["spec"]["result_not_ready"] == 425
    for bad in (400, 410, "425", True, None):
        with pytest.raises(SpecError) as err:
            model.configure(result_not_ready=bad)
        assert err.value.field_name == "result_not_ready"
        with pytest.raises(SpecError) as err:
            parse_spec("image", {"result_not_ready": bad if bad is not None else 0})
        assert err.value.field_name == "result_not_ready"


# ---------------------------------------------------------------------------- list


def seed_named(model: Model, count: int, **spec: Any) -> list[str]:
    """Jobs job_00.. created one clock second apart (oldest first)."""
    ids = [model.seed_job("image", spec or None, job_id=f"job_{i:02d}", age=count - i) for i in range(count)]
    return ids


def test_list_default_minimal_unordered_without_cursor() -> None:
    model, _ = make()
    ids = seed_named(model, 8, duration=600)
    first = list_page(model).body
    assert set(first) == {"jobs", "request_id"}
    listed = [item["id"] for item in first["jobs"]]
    assert sorted(listed) == ids and listed not in (ids, ids[::-1])
    assert listed == [i["id"] for i in list_page(model).body["jobs"]]  # stable
    assert all(set(item) == {"id", "type", "status"} for item in first["jobs"])
    assert [i["id"] for i in list_page(model, "limit=3&cursor=whatever").body["jobs"]] == listed[:3]
    assert model.stats()["list_reads"] == 3 and window(model)["attempts"] == 3


def test_list_full_newest_first_with_cursor() -> None:
    model, _ = make(list={"fields": "full", "order": "newest_first", "cursor": True})
    ids = seed_named(model, 5, duration=600)
    seen: list[str] = []
    cursor: str | None = ""
    while cursor is not None:
        body = list_page(model, "limit=2" + (f"&cursor={cursor}" if cursor else "")).body
        assert set(body["jobs"][0]) == {"id", "type", "status", "created_at", "updated_at"}
        seen += [item["id"] for item in body["jobs"]]
        cursor = body["next_cursor"]
    assert seen == ids[::-1]
    assert list_page(model, "cursor=bm9wZQ").status == 400


def test_list_query_validation_and_filters() -> None:
    model, _ = make()
    model.seed_job("image", {"duration": 600})
    done = model.seed_job("video", {"duration": 0})
    for bad in ("limit=0", "limit=101", "limit=x", "type=video", "status=queued,completed"):
        reply = list_page(model, bad)
        assert reply.status == 400 and reply.body["error"]["code"] == "bad_request", bad
    assert [i["id"] for i in list_page(model, "type=video_generation").body["jobs"]] == [done]
    assert [i["id"] for i in list_page(model, "status=COMPLETED").body["jobs"]] == [done]
    model.configure(list={"multi_status": True})
    assert len(list_page(model, "status=queued,completed").body["jobs"]) == 2


def test_list_misses() -> None:
    model, wall = make(list={"omit_kinds": ["video"], "newest_n": 2, "lag": 10})
    old = model.seed_job("image", {"duration": 0}, age=30)
    model.seed_job("video", age=20)
    recent = model.seed_job("image", {"duration": 1, "steps": 2})
    newest = model.seed_job("face_swap", {"duration": 600})
    listed = {i["id"]: i["status"] for i in list_page(model).body["jobs"]}
    assert listed == {recent: "queued", newest: "queued"}  # old is not among the newest 2; video never listed
    wall.advance(5)
    assert view(model, recent)["status"] == "completed"
    assert {i["id"]: i["status"] for i in list_page(model).body["jobs"]}[recent] == "running"  # lagging
    wall.advance(6.5)
    assert {i["id"]: i["status"] for i in list_page(model).body["jobs"]}[recent] == "completed"
    assert old not in {i["id"] for i in list_page(model).body["jobs"]}


@pytest.mark.parametrize(("route", "status"), [("missing", 404), ("bad_request", 400), ("forbidden", 403)])
def test_list_route_misses(route: str, status: int) -> None:
    model, _ = make(list={"route": route}, read_budget={"per_minute": 5})
    reply = list_page(model)
    assert reply.status == status and reply.header("RateLimit-Remaining") == "4"


def seed_outcomes(model: Model) -> dict[str, str]:
    """Status -> id of one job in each of these statuses."""
    ids = {"queued": model.seed_job("image", {"duration": 600}, job_id="job_queued")}
    for outcome in ("completed", "failed", "canceled", "expired"):
        ids[outcome] = model.seed_job("image", {"duration": 0, "outcome": outcome}, job_id=f"job_{outcome}")
    return ids


def listed(model: Model, query: str = "") -> dict[str, str | None]:
    reply = list_page(model, query)
    assert reply.status == 200, reply.body
    return {item["id"]: item.get("status") for item in reply.body["jobs"]}


def test_list_status_filter_honoured_ignored_and_loose() -> None:
    model, _ = make()
    ids = seed_outcomes(model)
    assert listed(model, "status=failed") == {ids["failed"]: "failed"}
    model.configure(list={"status_filter": "ignored"})
    assert set(listed(model, "status=failed")) == set(ids.values())  # the running one too
    model.configure(list={"status_filter": "loose"})
    terminal = {ids[s]: s for s in ("completed", "failed", "canceled", "expired")}
    assert listed(model, "status=failed") == terminal
    assert listed(model, "status=completed") == terminal
    assert listed(model, "status=queued") == {**terminal, ids["queued"]: "queued"}
    assert listed(model, "status=running") == terminal
    assert len(listed(model)) == 5  # no filter: every job, as always
    assert list_page(model, "status=failed,canceled").status == 400  # multi_status still decides


def test_list_loose_filter_follows_the_listed_lag() -> None:
    model, wall = make(list={"status_filter": "loose", "lag": 10})
    job_id = model.seed_job("image", {"duration": 1, "steps": 1, "outcome": "failed"})
    wall.advance(2)
    assert listed(model, "status=completed") == {}  # terminal, but the list still shows it running
    wall.advance(10)
    assert listed(model, "status=completed") == {job_id: "failed"}


def test_list_items_without_status() -> None:
    model, _ = make(list={"item_status": False, "fields": "full"})
    ids = seed_outcomes(model)
    body = list_page(model, "status=completed").body
    assert [item["id"] for item in body["jobs"]] == [ids["completed"]]  # the filter still applies
    assert set(body["jobs"][0]) == {"id", "type", "created_at", "updated_at"}
    assert all("status" not in item for item in list_page(model).body["jobs"])


def test_list_cursor_repeat_loops_on_the_second_page() -> None:
    model, _ = make(list={"cursor": True, "cursor_repeat": True, "order": "newest_created"})
    ids = seed_named(model, 5, duration=600)
    first = list_page(model, "limit=2").body
    assert [i["id"] for i in first["jobs"]] == [ids[4], ids[3]]
    cursor = first["next_cursor"]
    assert cursor is not None
    for _ in range(3):
        again = list_page(model, f"limit=2&cursor={cursor}").body
        assert again["next_cursor"] == cursor and [i["id"] for i in again["jobs"]] == [ids[2], ids[1]]
    assert list_page(model, "limit=10").body["next_cursor"] is None  # one page holds all: nothing repeats
    assert list_page(model, "limit=2&cursor=bm9wZQ").status == 400  # cursors are still checked


def test_list_faults_are_consumed_one_per_list_read() -> None:
    model, _ = make(list={"faults": ["ok", "503:2", "500", "malformed", "html", "empty", "slow:250", "429"]})
    model.seed_job("image", job_id="job_a")
    assert model.stats()["list_faults_remaining"] == ["ok", "503:2", "500", "malformed", "html", "empty",
                                                      "slow:250", "429"]
    assert listed(model) == {"job_a": "queued"}
    unavailable = list_page(model)
    assert (unavailable.status, unavailable.header("Retry-After")) == (503, "2")
    assert unavailable.body["error"]["code"] == "internal_error"
    assert list_page(model, "limit=0").status == 500  # the fault comes before the query is checked
    malformed = list_page(model)
    assert malformed.status == 200 and malformed.raw is not None and malformed.raw.startswith(b'{"jobs": [')
    with pytest.raises(ValueError):
        json.loads(malformed.raw)
    assert list_page(model).content_type.startswith("text/html")
    assert list_page(model).raw == b""
    slow = list_page(model)
    assert slow.status == 200 and slow.delay == pytest.approx(0.25) and len(slow.body["jobs"]) == 1
    limited = list_page(model)
    assert (limited.status, limited.header("Retry-After")) == (429, "1")
    assert list_page(model).status == 200 and model.stats()["list_faults_remaining"] == []
    model.configure(list={"faults": ["500"]})  # a new list mode starts its faults from the first
    assert list_page(model).status == 500 and list_page(model).status == 200
    assert model.stats()["list_reads"] == 11


def test_list_faults_skip_refused_reads() -> None:
    model, _ = make(read_budget={"per_minute": 1}, list={"faults": ["500"], "route": "missing"})
    assert list_page(model).status == 404  # the route refusal comes first
    assert list_page(model).status == 429  # and the budget
    assert model.stats()["list_faults_remaining"] == ["500"]


def test_list_foreign_items() -> None:
    model, _ = make(list={"foreign": 2, "cursor": True, "fields": "full"})
    ids = seed_outcomes(model)
    page1 = list_page(model, "limit=3").body
    own, foreign = page1["jobs"][:3], page1["jobs"][3:]
    assert {i["id"] for i in own} <= set(ids.values()) and len(foreign) == 2
    for item in foreign:
        assert re.fullmatch(r"job_foreign_[0-9a-f]{24}", item["id"])
        assert set(item) == {"id", "type", "status", "created_at", "updated_at"}
        assert item["type"] == "image_generation" and clock_of(item["created_at"]) < T0
    assert [i["status"] for i in foreign] == ["completed", "failed"]
    assert list_page(model, "limit=3").body["jobs"][3:] == foreign  # stable per page
    page2 = list_page(model, f"limit=3&cursor={page1['next_cursor']}").body
    assert len(page2["jobs"]) == 2 + 2 and not {i["id"] for i in page2["jobs"][2:]} & {i["id"] for i in foreign}
    assert page2["next_cursor"] is None
    failed = list_page(model, "status=failed&type=video_generation").body["jobs"]
    assert [(i["type"], i["status"]) for i in failed] == [("video_generation", "failed")] * 2
    assert all(i["id"].startswith("job_foreign_") for i in failed)  # no own video: only the foreign ones
    assert listed(model, "status=queued") == {ids["queued"]: "queued"}  # no terminal status named: none
    ghost = foreign[0]["id"]
    assert model.read_status(req(), ghost).status == 404 and model.unknown_reads(ghost)["status_reads"] == 1
    model.configure(list={"foreign": 3, "multi_status": True, "item_status": False})
    items = list_page(model, "status=failed,canceled,queued").body["jobs"]
    assert len(items) == 3 + 3 and all(set(i) == {"id", "type"} for i in items)
    model.configure(list={"foreign": 3, "multi_status": True})
    statuses = [i["status"] for i in list_page(model, "status=failed,canceled,queued").body["jobs"][3:]]
    assert statuses == ["canceled", "failed", "canceled"]
    model.configure(list={"foreign": 1, "status_filter": "ignored"})  # every own job, and a completed stranger
    items = list_page(model, "status=queued").body["jobs"]
    assert len(items) == 5 + 1 and items[-1]["id"].startswith("job_foreign_") and items[-1]["status"] == "completed"


def test_list_newest_created_differs_from_newest_first() -> None:
    model, wall = make(list={"fields": "full"})
    old = model.seed_job("image", {"duration": 20, "steps": 1}, job_id="job_old", age=15)
    new = model.seed_job("image", {"duration": 600, "steps": 1}, job_id="job_new", age=10)
    wall.advance(6)  # the old job completes at 5: its updated_at is newer than the new job's
    model.configure(list={"fields": "full", "order": "newest_first"})
    assert list(listed(model)) == [old, new]
    model.configure(list={"fields": "full", "order": "newest_created"})
    items = list_page(model).body["jobs"]
    assert [i["id"] for i in items] == [new, old]
    assert clock_of(items[0]["created_at"]) > clock_of(items[1]["created_at"])


@pytest.mark.parametrize(("field", "value"), [
    ("status_filter", "strict"), ("status_filter", None), ("item_status", "no"), ("item_status", 0),
    ("cursor_repeat", 1), ("faults", "503"), ("faults", ["boom"]), ("faults", [503]), ("foreign", -1),
    ("foreign", 101), ("foreign", True), ("foreign", 1.5), ("order", "oldest_first"),
])
def test_list_mode_validation(field: str, value: Any) -> None:
    model, _ = make()
    with pytest.raises(SpecError) as err:
        model.configure(list={"cursor": True, field: value})
    assert err.value.field_name == field and field in str(err.value)


def test_list_cursor_repeat_needs_a_cursor() -> None:
    with pytest.raises(SpecError) as err:
        make(list={"cursor_repeat": True})
    assert err.value.field_name == "cursor_repeat"
    model, _ = make(list={"cursor": True, "cursor_repeat": True})
    assert model.config.to_dict()["list"] == {
        "fields": "minimal", "order": "any", "cursor": True, "multi_status": False, "omit_kinds": [],
        "newest_n": None, "lag": 0.0, "route": "ok", "status_filter": "honoured", "item_status": True,
        "cursor_repeat": True, "faults": [], "foreign": 0}


# ---------------------------------------------------------------------------- webhooks


def webhook_model(**hooks: Any) -> tuple[Model, FakeWall]:
    return make(0.01, seed=11, webhooks={"kinds": ["image"], "secret": "s3cret", **hooks})


def test_webhook_url_only_for_configured_kinds() -> None:
    model, _ = webhook_model()
    refused = create(model, "video", {"webhook_url": "http://127.0.0.1:9/hook"})
    assert refused.status == 400 and refused.body["error"]["details"] == {"field": "webhook_url"}
    assert create(model, "image", {"webhook_url": "ftp://x"}).status == 400
    assert create(model, "image", {"webhook_url": "http://127.0.0.1:9/hook"}).status == 201
    assert model.stats()["webhooks"]["planned"] == 1


def test_webhook_is_due_when_the_result_is_ready_and_signed() -> None:
    model, wall = webhook_model(delay=2)
    reply = create(model, "image", {"webhook_url": "http://127.0.0.1:9/hook",
                                     "sim": {"duration": 4, "result_delay": 1}})
    job_id = reply.body["job"]["id"]
    wall.advance(6.5)
    assert model.take_due_webhooks() == []  # ready at 5, delay 2
    wall.advance(1.2)
    (delivery,) = model.take_due_webhooks()
    timestamp = int(delivery.headers["X-Sume-Timestamp"])
    assert timestamp == math.floor(T0 + 7.7)
    expected = hmac.new(b"s3cret", f"{timestamp}.".encode() + delivery.plan.body, hashlib.sha256).hexdigest()
    assert delivery.headers["X-Sume-Signature"] == f"v1={expected}" and delivery.copies == 1
    event = json.loads(delivery.plan.body)
    assert event["id"] == delivery.headers["X-Sume-Event-Id"] and event["id"].startswith("evt_")
    assert event["type"] == "image_generation.ready"
    assert event["data"] == {"job_id": job_id, "status": "completed", "type": "image_generation"}
    assert clock_of(event["created_at"]) == pytest.approx(T0 + 5, abs=0.01)
    model.record_delivery(delivery, [204])
    stats = model.stats()["webhooks"]
    assert (stats["sent"], stats["statuses"], stats["pending"]) == (1, {"204": 1}, 0)


def test_webhook_failed_event_loss_duplicate_and_bad_signature() -> None:
    model, wall = webhook_model(duplicate=1.0, bad_signature=1.0)
    model.seed_job("image", {"duration": 1, "outcome": "failed"}, webhook_url="http://127.0.0.1:9/hook")
    wall.advance(1.5)
    (delivery,) = model.take_due_webhooks()
    assert json.loads(delivery.plan.body)["type"] == "image_generation.failed" and delivery.copies == 2
    good = hmac.new(b"s3cret", f"{delivery.headers['X-Sume-Timestamp']}.".encode() + delivery.plan.body,
                    hashlib.sha256).hexdigest()
    assert delivery.headers["X-Sume-Signature"] != f"v1={good}"
    model.record_delivery(delivery, [200, 200])
    model.configure(webhooks={"kinds": ["image"], "loss": 1.0})
    model.seed_job("image", {"duration": 0}, webhook_url="http://127.0.0.1:9/hook")
    model.seed_job("image", {"duration": 0, "outcome": "mystery"}, webhook_url="http://127.0.0.1:9/hook")
    assert model.take_due_webhooks() == []
    stats = model.stats()["webhooks"]
    assert {k: stats[k] for k in ("planned", "sent", "lost", "duplicated", "bad_signature")} == {
        "planned": 2, "sent": 2, "lost": 1, "duplicated": 1, "bad_signature": 1}


def test_webhook_fates_follow_the_seed() -> None:
    def delivered(seed: int) -> list[str]:
        model, _ = make(seed=seed, webhooks={"kinds": ["image"], "loss": 0.5})
        for i in range(20):
            model.seed_job("image", {"duration": 0}, job_id=f"job_{i}", webhook_url="http://127.0.0.1:9/hook")
        return [d.plan.job_id for d in model.take_due_webhooks()]

    assert delivered(5) == delivered(5) and 0 < len(delivered(5)) < 20


# ---------------------------------------------------------------------------- config and helpers


def test_config_changes_and_time_scale_is_fixed() -> None:
    model, _ = make(0.01)
    with pytest.raises(SpecError, match="time_scale"):
        model.configure(time_scale=0.5)
    assert model.configure(time_scale=0.01)["time_scale"] == 0.01
    config = model.configure(rate_limit_per_minute=120)
    assert config["read_budget"] == {"per_minute": 120, "per_day": None} and config["rate_limit_per_minute"] == 120
    for bad in ({"bogus": 1}, {"list": {"order": "random"}}, {"webhooks": {"kinds": ["hologram"]}},
                {"read_budget": {"per_hour": 1}}, {"other_consumer_share": 2}):
        with pytest.raises(SpecError):
            model.configure(**bad)
    assert model.configure(list={"cursor": True})["list"]["fields"] == "minimal"


def test_reset_restores_everything() -> None:
    model, _ = make(read_budget={"per_minute": 1})
    job_id = model.seed_job("image")
    model.read_status(req(), job_id)
    model.configure(hints=False)
    model.reset()
    assert model.stats()["jobs"] == {} and model.config.hints is True
    assert model.budget_stats()["reads"]["60"] == []


def test_api_keys_from_headers() -> None:
    assert api_keys({"Authorization": "Bearer abc", "X-Api-Key": "def"}) == ("abc", "def")
    assert api_keys({"Authorization": "abc"}) == ()


def test_a_job_may_carry_only_some_hints() -> None:
    """``hint_fields``: the status reply carries only the named hints (Sume documents none)."""
    from tools.sume_sim.spec import SpecError, parse_spec
    from tools.sume_sim.timeline import Job

    spec = parse_spec("image", {"duration": 10, "result_delay": 60, "hint_fields": ["terminal", "result_ready"]})
    job = Job("job_h", "image", spec, created=0.0, not_found_for=0.0, result_url="u")
    view = job.view(20.0, hints=True, exact=False)
    assert view["result_ready"] is False and view["terminal"] is True and "next_poll_after_seconds" not in view
    with pytest.raises(SpecError, match="hint_fields"):
        parse_spec("image", {"hint_fields": ["eta"]})

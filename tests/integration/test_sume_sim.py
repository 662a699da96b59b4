"""Tests of the local Sume simulator (tools/sume_sim) over real HTTP with urllib3."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import urllib3

from bench.fig_budget import VirtualClock
from sume_poller.core.clock import Clock
from tools.sume_sim import SumeSimulator

pytestmark = pytest.mark.integration

KEY = "sume_test_key"
AUTH = {"Authorization": f"Bearer {KEY}"}
REPO_ROOT = Path(__file__).resolve().parents[2]
RESULT_URL_RE = re.compile(r"^https://cdn\.sume\.example/signed/[0-9a-f]+\?sig=[0-9a-f]+$")
SUME_TYPES = {"image": "image_generation", "video": "video_generation", "ad_video": "ad_video_generation",
              "face_swap": "face_swap", "reference_analysis": "reference_analysis"}
RATE_HEADERS = ("RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset", "RateLimit-Policy")


def wait_for(condition: Callable[[], Any], deadline_s: float = 5.0, what: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        threading.Event().wait(0.01)
    raise AssertionError(f"{what} not met within {deadline_s} s")


@pytest.fixture(scope="module")
def http() -> Iterator[urllib3.PoolManager]:
    pool = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(total=5))
    yield pool
    pool.clear()


class Client:
    """Tiny helper around urllib3 for the public and control APIs of one simulator."""

    def __init__(self, sim: SumeSimulator, http: urllib3.PoolManager) -> None:
        self.sim = sim
        self.http = http

    def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        auth: bool = True,
    ) -> urllib3.BaseHTTPResponse:
        hdrs = {**(AUTH if auth else {}), **(headers or {})}
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            hdrs.setdefault("Content-Type", "application/json")
        return self.http.request(method, self.sim.base_url + path, body=data, headers=hdrs)

    def ctl(self, method: str, path: str, body: Any = None) -> urllib3.BaseHTTPResponse:
        data = None if body is None else json.dumps(body).encode()
        return self.http.request(method, self.sim.control_url + path, body=data)

    def configure(self, **changes: Any) -> dict[str, Any]:
        resp = self.ctl("POST", "/config", changes)
        assert resp.status == 200, resp.data
        return dict(resp.json())

    def create(self, path: str = "/images/generations", sim: dict[str, Any] | None = None, **kw: Any) -> str:
        resp = self.api("POST", path, {"prompt": "a cat", **({"sim": sim} if sim is not None else {})}, **kw)
        assert resp.status == 201, resp.data
        payload = resp.json()
        if "job" in payload:
            return str(payload["job"]["id"])
        if "job_id" in payload:
            return str(payload["job_id"])
        return str(payload["job_ids"][0])

    def seed(self, **body: Any) -> str:
        resp = self.ctl("POST", "/jobs", body)
        assert resp.status == 201, resp.data
        return str(resp.json()["id"])

    def status(self, job_id: str) -> dict[str, Any]:
        resp = self.api("GET", f"/jobs/{job_id}")
        assert resp.status == 200, resp.data
        return dict(resp.json()["job"])

    def job_info(self, job_id: str) -> dict[str, Any]:
        resp = self.ctl("GET", f"/jobs/{job_id}")
        assert resp.status == 200, resp.data
        return dict(resp.json())

    def stats(self) -> dict[str, Any]:
        return dict(self.ctl("GET", "/stats").json())

    def poll_until_terminal(self, job_id: str, deadline_s: float = 3.0) -> list[dict[str, Any]]:
        """Read the status until terminal; waits follow the hints (clock seconds), capped at 20 ms real."""
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            job = self.status(job_id)
            seen.append(job)
            if job["terminal"]:
                return seen
            threading.Event().wait(min(self.sim.clock.to_real(float(job["next_poll_after_seconds"])), 0.02))
        raise AssertionError(f"job {job_id} not terminal before deadline; saw {[j['status'] for j in seen]}")


@pytest.fixture
def make_client(http: urllib3.PoolManager) -> Iterator[Callable[..., Client]]:
    """Start a simulator with the given options (api_key defaults to KEY) and wrap it in a Client."""
    started: list[SumeSimulator] = []

    def factory(**options: Any) -> Client:
        sim = SumeSimulator(**{"api_key": KEY, **options}).start(port=0)
        started.append(sim)
        return Client(sim, http)

    yield factory
    for sim in started:
        sim.stop()


@pytest.fixture
def client(make_client: Callable[..., Client]) -> Client:
    return make_client(hints=True, latency_ms=0, time_scale=1.0)


@pytest.fixture
def frozen(make_client: Callable[..., Client]) -> tuple[Client, VirtualClock]:
    """The ``client`` on a clock that moves only when its test moves it: what the test asserts about
    clock time (hints, read-after-create lag, a result's delay) holds however slow the machine."""
    clock = VirtualClock(1_800_000_000.0)
    return make_client(hints=True, latency_ms=0, clock=clock), clock


def assert_envelope(resp: urllib3.BaseHTTPResponse, status: int, code: str) -> dict[str, Any]:
    assert resp.status == status, resp.data
    payload = resp.json()
    assert set(payload) == {"error", "request_id"}
    assert payload["error"]["code"] == code
    assert isinstance(payload["error"]["message"], str) and payload["error"]["message"]
    assert isinstance(payload["error"]["details"], dict)
    assert payload["request_id"].startswith("req_")
    assert resp.headers["X-Request-Id"] == payload["request_id"]
    return dict(payload)


def away_from_minute_edge(sim: SumeSimulator) -> None:
    """Wait (at most about a second) so that the next few requests share one minute window."""
    wait_for(lambda: sim.clock.now() % 60 < 59, deadline_s=2, what="a fresh minute")


def assert_rate_headers(resp: urllib3.BaseHTTPResponse) -> None:
    for name in (*RATE_HEADERS, "X-Request-Id"):
        assert name in resp.headers, name
    assert 0 <= int(resp.headers["RateLimit-Remaining"]) <= int(resp.headers["RateLimit-Limit"])


# ---------------------------------------------------------------------------- auth and envelope


def test_auth_failures_return_401_envelope(client: Client) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-Api-Key": "wrong"}, {"Authorization": KEY}):
        resp = client.api("POST", "/images/generations", {"prompt": "x"}, headers=headers, auth=False)
        assert_envelope(resp, 401, "unauthorized")
        assert not any(name in resp.headers for name in RATE_HEADERS)  # no budget is enforced
    assert client.stats()["unauthorized"] == 4
    assert client.stats()["jobs_created"] == 0


def test_both_auth_headers_are_accepted(client: Client) -> None:
    assert client.create(auth=False, headers={"X-Api-Key": KEY})
    assert client.create(auth=False, headers={"Authorization": f"bearer {KEY}"})


def test_success_responses_carry_request_id(client: Client) -> None:
    resp = client.api("POST", "/videos/generations", {"prompt": "x"})
    assert resp.status == 201
    assert resp.json()["request_id"] == resp.headers["X-Request-Id"]
    job_id = resp.json()["job"]["id"]
    status = client.api("GET", f"/jobs/{job_id}")
    assert status.json()["request_id"] == status.headers["X-Request-Id"]


def test_unknown_job_and_route_are_404(client: Client) -> None:
    assert_envelope(client.api("GET", "/jobs/job_nope"), 404, "not_found")
    assert_envelope(client.api("GET", "/jobs/job_nope/result"), 404, "not_found")
    assert_envelope(client.api("GET", "/nothing/here"), 404, "not_found")
    assert_envelope(client.api("DELETE", "/jobs/job_nope"), 405, "method_not_allowed")


def test_key_forbidden_refuses_every_call(client: Client) -> None:
    job_id = client.create()
    client.configure(key_forbidden=True)
    assert_envelope(client.api("GET", f"/jobs/{job_id}"), 403, "forbidden")
    assert_envelope(client.api("POST", "/images/generations", {}), 403, "forbidden")
    assert_envelope(client.api("GET", "/jobs"), 403, "forbidden")
    assert_envelope(client.api("GET", "/jobs", auth=False, headers={"X-Api-Key": "nope"}), 401, "unauthorized")


# ---------------------------------------------------------------------------- create


@pytest.mark.parametrize(
    ("path", "directive", "kind", "shape", "count"),
    [
        ("/images/generations", None, "image", "job.id", 1),
        ("/videos/generations", {"id_shape": "job_id"}, "video", "job_id", 1),
        ("/ads/videos", {"id_shape": "job_ids", "count": 3}, "ad_video", "job_ids", 3),
        ("/face-swap", None, "face_swap", "job_ids", 2),
        ("/face-swap", {"id_shape": "job.id"}, "face_swap", "job.id", 1),
        ("/reference-analysis", {"id_shape": "job_ids"}, "reference_analysis", "job_ids", 2),
    ],
)
def test_create_id_shapes(
    client: Client, path: str, directive: dict[str, Any] | None, kind: str, shape: str, count: int
) -> None:
    body: dict[str, Any] = {"prompt": "x"} if directive is None else {"prompt": "x", "sim": directive}
    resp = client.api("POST", path, body)
    assert resp.status == 201
    payload = resp.json()
    if shape == "job.id":
        assert payload["job"] == {"id": payload["job"]["id"], "status": "queued", "type": SUME_TYPES[kind]}
        ids = [payload["job"]["id"]]
    elif shape == "job_id":
        assert payload["status"] == "queued"
        ids = [payload["job_id"]]
    else:
        ids = payload["job_ids"]
    assert len(ids) == len(set(ids)) == count
    for job_id in ids:
        assert job_id.startswith("job_")
        job = client.status(job_id)
        assert job["type"] == SUME_TYPES[kind] and job["status"] == "queued"
        info = client.job_info(job_id)
        assert info["spec"]["id_shape"] == shape and info["kind"] == kind
    stats = client.stats()
    assert stats["creates"] == 1 and stats["jobs_created"] == count


def test_idempotency_key_replays_and_bills_once(client: Client) -> None:
    headers = {"Idempotency-Key": "submission-1"}
    first = client.api("POST", "/images/generations", {"prompt": "x"}, headers=headers)
    second = client.api("POST", "/images/generations", {"prompt": "x"}, headers=headers)
    assert first.status == second.status == 201
    assert first.data == second.data
    assert second.headers["Idempotent-Replayed"] == "true"
    other = client.api("POST", "/images/generations", {"prompt": "x"}, headers={"Idempotency-Key": "s-2"})
    assert other.json()["job"]["id"] != first.json()["job"]["id"]
    stats = client.stats()
    counts = {k: stats[k] for k in ("creates", "jobs_created", "create_requests", "replays")}
    assert counts == {"creates": 2, "jobs_created": 2, "create_requests": 3, "replays": 1}


def test_idempotency_is_atomic_under_concurrency(client: Client) -> None:
    bodies: list[bytes] = []

    def submit() -> None:
        resp = client.api("POST", "/videos/generations", {"p": 1}, headers={"Idempotency-Key": "race"})
        bodies.append(resp.data)

    threads = [threading.Thread(target=submit) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(bodies)) == 1
    stats = client.stats()
    assert (stats["creates"], stats["jobs_created"], stats["replays"]) == (1, 1, 11)


def test_create_faults_then_slow_create(client: Client) -> None:
    body = {"prompt": "x", "sim": {"create_faults": ["503:2", "slow:150"]}}
    headers = {"Idempotency-Key": "flaky"}
    refused = client.api("POST", "/images/generations", body, headers=headers)
    assert_envelope(refused, 503, "internal_error")
    assert refused.headers["Retry-After"] == "2"
    started = time.monotonic()
    late = client.api("POST", "/images/generations", body, headers=headers)
    assert late.status == 201 and time.monotonic() - started >= 0.15
    replay = client.api("POST", "/images/generations", body, headers=headers)
    assert replay.data == late.data and client.stats()["jobs_created"] == 1


def test_insufficient_credits_is_final_and_replayed(client: Client) -> None:
    headers = {"Idempotency-Key": "broke"}
    body = {"prompt": "x", "sim": {"insufficient_credits": True}}
    first = client.api("POST", "/videos/generations", body, headers=headers)
    assert_envelope(first, 402, "insufficient_credits")
    # a retry with the same key (even without the directive) replays the 402
    second = client.api("POST", "/videos/generations", {"prompt": "x"}, headers=headers)
    assert second.status == 402 and second.data == first.data
    stats = client.stats()
    assert (stats["creates"], stats["jobs_created"], stats["insufficient_credits"]) == (0, 0, 1)
    assert stats["jobs"] == {}


def test_invalid_sim_directive_is_400(client: Client) -> None:
    resp = client.api("POST", "/images/generations", {"sim": {"outcom": "failed"}})
    assert assert_envelope(resp, 400, "bad_request")["error"]["details"] == {"field": "outcom"}
    assert_envelope(
        client.api("POST", "/images/generations", {"sim": {"faults": ["boom"]}}), 400, "bad_request"
    )
    raw = client.http.request("POST", client.sim.base_url + "/ads/videos", body=b"{not json", headers=AUTH)
    assert_envelope(raw, 400, "bad_request")
    assert client.stats()["jobs_created"] == 0


# ---------------------------------------------------------------------------- timeline (clock seconds)


@pytest.mark.parametrize(
    ("outcome", "error_code", "success"),
    [
        ("completed", None, True),
        ("failed", "generation_failed", False),
        ("canceled", "canceled", False),
        ("expired", "expired", False),
        ("succeeded", None, True),
        ("cancelled", "canceled", False),
        ("error", "generation_failed", False),
    ],
)
def test_status_progresses_to_each_outcome(
    make_client: Callable[..., Client], outcome: str, error_code: str | None, success: bool
) -> None:
    # On a clock that moves only by the hints each reply gives (a real one at 0.01 let a loaded CI
    # machine's first read come after the queued phase): every read lands where the hints said.
    clock = VirtualClock(1_800_000_000.0)
    client = make_client(clock=clock)
    job_id = client.create(sim={"outcome": outcome, "duration": 15, "steps": 3})
    seen = [client.status(job_id)]
    while not seen[-1]["terminal"] and len(seen) < 20:
        clock.t += float(seen[-1]["next_poll_after_seconds"])
        seen.append(client.status(job_id))
    statuses = [j["status"] for j in seen]
    active = [s for s in statuses if s != outcome]
    assert active and active[0] == "queued"
    order = {"queued": 0, "running": 1, "processing": 2}
    assert [order[s] for s in active] == sorted(order[s] for s in active)
    final = seen[-1]
    assert final["status"] == outcome and final["terminal"] is True
    assert final["next_poll_after_seconds"] == 0 or not success
    if success:
        assert final["error"] is None and final["result_ready"] is True
        assert RESULT_URL_RE.match(final["result_url"])
    else:
        assert final["error"]["code"] == error_code and final["result_url"] is None
        assert final["result_ready"] is False
    assert all(j["terminal"] is False for j in seen[:-1])
    info = client.job_info(job_id)
    assert info["status"] == outcome and info["terminal_status"] == outcome
    assert info["status_reads"] == len(seen) and info["min_reads"] == 4


def test_compressed_clock_reports_clock_seconds(make_client: Callable[..., Client]) -> None:
    client = make_client(time_scale=0.01)
    job_id = client.create(path="/videos/generations", sim={"duration": 20, "steps": 2})  # 0.2 s real
    fresh = client.status(job_id)
    # clock seconds to the next phase (10 s after creation; a busy machine may take a few of them)
    assert 0 <= fresh["next_poll_after_seconds"] <= 10
    created = datetime.fromisoformat(fresh["created_at"].replace("Z", "+00:00")).timestamp()
    assert abs(created - Clock(0.01).now()) < 100  # clock time (1 s real), far from wall time
    assert client.poll_until_terminal(job_id)[-1]["status"] == "completed"


def test_hint_values_follow_phase_boundaries(frozen: tuple[Client, VirtualClock]) -> None:
    client, _ = frozen
    spec = {"duration": 6, "steps": 2, "result_delay": 5}
    fresh = client.status(client.seed(kind="video", sim=spec, age=0))
    assert (fresh["status"], fresh["terminal"], fresh["result_ready"]) == ("queued", False, False)
    assert fresh["next_poll_after_seconds"] == 3
    mid = client.status(client.seed(kind="video", sim=spec, age=4))
    assert (mid["status"], mid["next_poll_after_seconds"]) == ("running", 2)
    done_not_ready = client.status(client.seed(kind="video", sim=spec, age=7))
    assert done_not_ready["status"] == "completed" and done_not_ready["terminal"] is True
    assert done_not_ready["result_ready"] is False and done_not_ready["result_url"] is None
    assert done_not_ready["next_poll_after_seconds"] == 4
    ready = client.status(client.seed(kind="video", sim=spec, age=12))
    assert ready["result_ready"] is True and ready["next_poll_after_seconds"] == 0
    late = client.status(client.seed(kind="image", sim={"duration": 9, "steps": 3}, age=7))
    assert (late["status"], late["next_poll_after_seconds"]) == ("processing", 2)


def test_hints_round_up_with_minimum_one_and_exact_mode(frozen: tuple[Client, VirtualClock]) -> None:
    client, clock = frozen
    job_id = client.create(sim={"duration": 2.5, "steps": 1})
    assert client.status(job_id)["next_poll_after_seconds"] == 3
    almost = client.seed(sim={"duration": 3, "steps": 1}, age=2.5)
    assert client.status(almost)["next_poll_after_seconds"] == 1
    client.configure(exact_hints=True)
    clock.t += 0.25
    assert client.status(job_id)["next_poll_after_seconds"] == 2.25
    assert client.status(almost)["next_poll_after_seconds"] == 0.25


def test_hints_global_off_and_per_job_override(client: Client) -> None:
    hint_keys = {"terminal", "result_ready", "next_poll_after_seconds"}
    plain = client.create()
    forced_off = client.create(sim={"hints": False})
    assert hint_keys <= set(client.status(plain))
    assert not hint_keys & set(client.status(forced_off))
    assert client.configure(hints=False)["hints"] is False
    forced_on = client.create(sim={"hints": True})
    job = client.status(plain)
    assert not hint_keys & set(job)
    assert set(job) == {"id", "type", "status", "error", "created_at", "updated_at", "result_url"}
    assert hint_keys <= set(client.status(forced_on))
    assert client.job_info(plain)["min_reads"] == 3


def test_status_override_and_terminal_flag(client: Client) -> None:
    job_id = client.create(sim={"status_override": {"status": "mystery", "reads": 2}, "duration": 0})
    for _ in range(2):
        job = client.status(job_id)
        assert job["status"] == "mystery" and job["terminal"] is False
        assert job["next_poll_after_seconds"] == 1 and job["result_url"] is None
    job = client.status(job_id)
    assert job["status"] == "completed" and job["terminal"] is True
    flagged = client.status(client.create(sim={"duration": 0, "terminal_flag": False}))
    assert flagged["status"] == "completed" and flagged["terminal"] is False


# ---------------------------------------------------------------------------- faults and deployment behaviours


def test_faults_are_consumed_in_order(client: Client) -> None:
    client.configure(read_budget={"per_minute": 1000})
    errors = ["429:7", "500", "503:2", "502", "404", "401", "403", "400"]
    faults = [*errors, "malformed", "html", "empty", "slow:150"]
    job_id = client.create(sim={"faults": faults, "duration": 60})
    expected = [
        (429, "rate_limit_exceeded", "7"),
        (500, "internal_error", None),
        (503, "internal_error", "2"),
        (502, "internal_error", None),
        (404, "not_found", None),
        (401, "unauthorized", None),
        (403, "forbidden", None),
        (400, "bad_request", None),
    ]
    for status, code, retry_after in expected:
        resp = client.api("GET", f"/jobs/{job_id}")
        assert_envelope(resp, status, code)
        assert_rate_headers(resp)
        assert resp.headers.get("Retry-After") == retry_after
    malformed = client.api("GET", f"/jobs/{job_id}")
    assert malformed.status == 200 and malformed.headers["Content-Type"] == "application/json"
    with pytest.raises(ValueError):
        json.loads(malformed.data)
    html = client.api("GET", f"/jobs/{job_id}")
    assert html.status == 200 and html.headers["Content-Type"].startswith("text/html")
    assert html.data.lstrip().lower().startswith(b"<!doctype html")
    empty = client.api("GET", f"/jobs/{job_id}")
    assert empty.status == 200 and empty.data == b""
    started = time.monotonic()
    slow = client.api("GET", f"/jobs/{job_id}")
    assert time.monotonic() - started >= 0.15
    assert slow.status == 200 and slow.json()["job"]["status"] == "queued"
    assert client.api("GET", f"/jobs/{job_id}").status == 200  # faults exhausted
    info = client.job_info(job_id)
    assert info["status_reads"] == len(faults) + 1 and info["faults_remaining"] == []


def test_a_proxy_fault_answers_its_own_page_with_its_status_and_none_of_sumes_headers(client: Client) -> None:
    """A gateway or proxy in front of Sume (a body too large, a header too long, a WAF's 400): its status
    and an HTML page, no Sume error envelope nor rate-limit headers; on the job and the result route."""
    client.configure(read_budget={"per_minute": 1000})
    job_id = client.create(sim={"duration": 0, "faults": ["proxy:413", "proxy:400"], "result_faults": ["proxy:431"]})
    for status, path in ((413, f"/jobs/{job_id}"), (400, f"/jobs/{job_id}"), (431, f"/jobs/{job_id}/result")):
        resp = client.api("GET", path)
        assert resp.status == status and resp.headers["Content-Type"].startswith("text/html")
        assert f"<h1>{status}</h1>".encode() in resp.data and not any(h in resp.headers for h in RATE_HEADERS)
    assert client.api("GET", f"/jobs/{job_id}").status == 200  # faults exhausted
    assert client.api("GET", f"/jobs/{job_id}/result").status == 200
    refused = client.api("POST", "/images/generations", {"prompt": "a cat", "sim": {"faults": ["proxy:4000"]}})
    assert refused.status == 400 and "unknown fault" in refused.json()["error"]["message"]


def test_result_faults_apply_to_result_reads(client: Client) -> None:
    job_id = client.create(sim={"duration": 0, "result_faults": ["503:4", "empty"]})
    resp = client.api("GET", f"/jobs/{job_id}/result")
    assert_envelope(resp, 503, "internal_error")
    assert resp.headers["Retry-After"] == "4"
    assert client.api("GET", f"/jobs/{job_id}/result").data == b""
    assert client.api("GET", f"/jobs/{job_id}/result").status == 200
    assert client.job_info(job_id)["result_reads"] == 3
    assert client.job_info(job_id)["status_reads"] == 0


def test_random_faults_from_config(client: Client) -> None:
    job_id = client.create()
    config = client.configure(malformed_rate=1.0, seed=7)
    assert config["malformed_rate"] == 1.0 and config["seed"] == 7
    resp = client.api("GET", f"/jobs/{job_id}")
    assert resp.status == 200
    with pytest.raises(ValueError):
        json.loads(resp.data)
    client.configure(malformed_rate=0.0, error_rate_5xx=1.0)
    codes = {client.api("GET", f"/jobs/{job_id}").status for _ in range(20)}
    assert codes <= {500, 503} and codes
    assert client.job_info(job_id)["status_reads"] == 21


def test_latency_applies_to_api_only(client: Client) -> None:
    client.configure(latency_ms=1500)  # far above what a busy machine adds to a local request
    started = time.monotonic()
    client.ctl("GET", "/stats")
    assert time.monotonic() - started < 1.0
    started = time.monotonic()
    assert client.api("GET", "/jobs/job_nope").status == 404
    assert time.monotonic() - started >= 1.5


def test_read_after_create_lag_and_forbidden_job(frozen: tuple[Client, VirtualClock]) -> None:
    client, clock = frozen
    lagging = client.create(sim={"not_found_for": 0.3, "duration": 0})
    assert_envelope(client.api("GET", f"/jobs/{lagging}"), 404, "not_found")
    clock.t += 0.29
    assert_envelope(client.api("GET", f"/jobs/{lagging}/result"), 404, "not_found")
    clock.t += 0.01
    assert client.api("GET", f"/jobs/{lagging}").status == 200
    assert client.api("GET", f"/jobs/{lagging}/result").status == 200
    foreign = client.create(sim={"forbidden": True})
    assert_envelope(client.api("GET", f"/jobs/{foreign}"), 403, "forbidden")
    assert_envelope(client.api("GET", f"/jobs/{foreign}/result"), 403, "forbidden")
    assert client.configure(not_found_for=60)["not_found_for"] == 60
    assert client.api("GET", f"/jobs/{client.create()}").status == 404


# ---------------------------------------------------------------------------- result


def test_result_is_409_until_ready_then_200(frozen: tuple[Client, VirtualClock]) -> None:
    client, clock = frozen
    job_id = client.create(path="/videos/generations", sim={"duration": 0, "result_delay": 0.25})
    assert_envelope(client.api("GET", f"/jobs/{job_id}/result"), 409, "result_not_ready")
    job = client.status(job_id)
    assert job["status"] == "completed" and job["result_ready"] is False
    assert job["next_poll_after_seconds"] == 1
    clock.t += 0.25
    resp = client.api("GET", f"/jobs/{job_id}/result")
    assert resp.status == 200
    payload = resp.json()
    assert payload["job_id"] == job_id and payload["type"] == "video_generation"
    assert RESULT_URL_RE.match(payload["result"]["url"])
    assert payload["result"]["width"] > 0 and payload["request_id"].startswith("req_")
    assert client.status(job_id)["result_url"] == payload["result"]["url"]
    assert client.job_info(job_id)["result_reads"] == 2


def test_result_of_failed_job_is_409(client: Client) -> None:
    job_id = client.create(sim={"duration": 0, "outcome": "failed"})
    resp = client.api("GET", f"/jobs/{job_id}/result")
    assert assert_envelope(resp, 409, "result_not_ready")["error"]["details"]["status"] == "failed"


def test_result_not_ready_status_from_config_and_directive(client: Client) -> None:
    assert client.configure(result_not_ready=425)["result_not_ready"] == 425
    early = client.create(path="/videos/generations", sim={"duration": 0, "result_delay": 600})
    assert_envelope(client.api("GET", f"/jobs/{early}/result"), 425, "result_not_ready")
    hidden = client.create(sim={"duration": 0, "result_delay": 600, "result_not_ready": 404})
    assert_envelope(client.api("GET", f"/jobs/{hidden}/result"), 404, "not_found")
    assert client.job_info(hidden)["spec"]["result_not_ready"] == 404
    failed = client.create(sim={"duration": 0, "outcome": "failed"})
    assert_envelope(client.api("GET", f"/jobs/{failed}/result"), 409, "result_not_ready")
    rejected = client.ctl("POST", "/config", {"result_not_ready": 410})
    assert rejected.status == 400 and rejected.json()["error"]["details"] == {"field": "result_not_ready"}
    bad = client.api("POST", "/images/generations", {"sim": {"result_not_ready": "404"}})
    assert assert_envelope(bad, 400, "bad_request")["error"]["details"] == {"field": "result_not_ready"}
    assert client.ctl("GET", "/config").json()["result_not_ready"] == 425


def test_status_reads_waiting_for_the_result_are_not_after_terminal(frozen: tuple[Client, VirtualClock]) -> None:
    client, clock = frozen
    job_id = client.create(path="/videos/generations", sim={"duration": 0, "result_delay": 0.3})
    first = client.status(job_id)
    assert (first["status"], first["terminal"], first["result_ready"]) == ("completed", True, False)
    assert client.status(job_id)["result_ready"] is False  # waiting for the result: not after terminal
    clock.t += 0.3
    assert client.status(job_id)["result_ready"] is True
    assert client.job_info(job_id)["status_reads_after_terminal"] == 0
    client.status(job_id)
    assert client.stats()["jobs"][job_id]["status_reads_after_terminal"] == 1
    failed = client.create(sim={"duration": 0, "outcome": "failed", "hints": False})
    client.status(failed)
    client.status(failed)
    assert client.stats()["jobs"][failed]["status_reads_after_terminal"] == 1


def test_result_shapes(client: Client) -> None:
    def result(shape: str) -> urllib3.BaseHTTPResponse:
        resp = client.api("GET", f"/jobs/{client.create(sim={'duration': 0, 'result_shape': shape})}/result")
        assert resp.status == 200 and resp.headers["X-Request-Id"].startswith("req_")
        return resp

    listed = result("list").json()
    assert isinstance(listed, list) and RESULT_URL_RE.match(listed[0]["url"])
    assert RESULT_URL_RE.match(result("string").json())
    large = result("large")
    assert len(large.data) > 400_000 and large.json()["request_id"] == large.headers["X-Request-Id"]


# ---------------------------------------------------------------------------- budgets


def test_read_budget_headers_429_and_budget_route(client: Client) -> None:
    client.configure(read_budget={"per_minute": 2, "per_day": 100})
    away_from_minute_edge(client.sim)  # both creates and every read in one minute window
    job_id = client.create()
    created = client.api("POST", "/images/generations", {})
    assert not any(name in created.headers for name in RATE_HEADERS)  # creates: no create budget
    first = client.api("GET", f"/jobs/{job_id}")
    assert_rate_headers(first)
    assert first.headers["RateLimit-Policy"] == "2;w=60, 100;w=86400"
    assert (first.headers["RateLimit-Limit"], first.headers["RateLimit-Remaining"]) == ("2", "1")
    assert client.api("GET", f"/jobs/{job_id}/result").status == 409
    limited = client.api("GET", "/jobs")
    assert_envelope(limited, 429, "rate_limit_exceeded")
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    assert limited.headers["RateLimit-Remaining"] == "0"
    stats = client.stats()
    assert (stats["rate_limited"], stats["status_reads"], stats["result_reads"], stats["list_reads"]) == (1, 1, 1, 1)
    budget = client.ctl("GET", "/budget").json()
    minute = budget["reads"]["60"][-1]
    assert (minute["attempts"], minute["served"], minute["refused"], minute["limit"]) == (3, 2, 1, 2)
    assert budget["reads"]["86400"][-1]["attempts"] == 3 and budget["creates"]["60"][-1]["attempts"] == 2
    client.configure(rate_limit_per_minute=None)
    assert client.api("GET", f"/jobs/{job_id}").headers["RateLimit-Policy"] == "100;w=86400"


def test_create_budget(client: Client) -> None:
    client.configure(create_budget={"per_minute": 1})
    away_from_minute_edge(client.sim)
    first = client.api("POST", "/images/generations", {})
    assert first.status == 201 and first.headers["RateLimit-Policy"] == "1;w=60"
    second = client.api("POST", "/images/generations", {})
    assert_envelope(second, 429, "rate_limit_exceeded")
    assert 1 <= int(second.headers["Retry-After"]) <= 60
    assert client.stats()["jobs_created"] == 1


def test_other_consumer_lowers_remaining(client: Client) -> None:
    client.configure(read_budget={"per_minute": 6000}, other_consumer_share=0.5)
    job_id = client.create(sim={"duration": 600})
    client.api("GET", f"/jobs/{job_id}")
    before = client.ctl("GET", "/budget").json()["reads"]["60"][-1]
    remaining = int(client.api("GET", f"/jobs/{job_id}").headers["RateLimit-Remaining"])
    after = client.ctl("GET", "/budget").json()["reads"]["60"][-1]
    if before["window"] == after["window"]:
        assert 6000 - 2 - after["other"] <= remaining <= 6000 - 2 - before["other"]
        assert after["other"] == after["other_served"]


@pytest.mark.parametrize("kind", ["fixed", "sliding"])
def test_a_minute_window_is_fixed_or_slides(make_client: Callable[..., Client], kind: str) -> None:
    """Three reads a minute, 20 s apart from half a second into a minute, a fourth at 59.5 refused,
    and one more once its Retry-After has passed: a fixed window lets it through at the minute's
    edge; a sliding one counts the 60 s before each attempt (refused ones too), so at 80.5."""
    wall = FakeWall()
    client = make_client(clock=Clock(1.0, wall=wall), read_budget={"per_minute": 3},
                         budget_windows={"minute": kind})
    job_id = client.create()
    replies = []
    for step in (0.0, 20.0, 20.0, 19.0):  # t = 0.5, 20.5, 40.5, 59.5 into a minute
        wall.advance(step)
        replies.append(client.api("GET", f"/jobs/{job_id}"))
    assert [r.status for r in replies] == [200, 200, 200, 429]
    assert_envelope(replies[3], 429, "rate_limit_exceeded")
    assert [int(r.headers["RateLimit-Remaining"]) for r in replies] == [2, 1, 0, 0]
    retry = int(replies[3].headers["Retry-After"])
    # Reset: a fixed window's end; a sliding one's oldest attempt leaving it (here 0.5's: the same).
    assert [int(r.headers["RateLimit-Reset"]) for r in replies] == [60, 40, 20, 1]
    assert retry == (1 if kind == "fixed" else 21)  # sliding: once 0.5 and 20.5 have left the window
    if kind == "sliding":
        wall.advance(retry - 1)
        assert client.api("GET", f"/jobs/{job_id}").status == 429  # 60.5: a fixed window would pass it
        retry = int(client.api("GET", f"/jobs/{job_id}").headers["Retry-After"])  # each attempt counts
        assert retry == 40  # 40.5 must leave too: (40.5, 100.5] holds 59.5, 60.5 (twice) and the read
        wall.advance(retry)
    else:
        wall.advance(retry)
    assert client.api("GET", f"/jobs/{job_id}").status == 200
    minute = client.ctl("GET", "/budget").json()["reads"]["60"]  # whatever the kind: per fixed minute
    assert sum(w["served"] for w in minute) == 4 and max(w["served"] for w in minute) == 3
    assert client.ctl("GET", "/config").json()["budget_windows"] == {"minute": kind, "day": "fixed"}


def test_a_sliding_day_counts_the_24_hours_before_each_read(make_client: Callable[..., Client]) -> None:
    wall = FakeWall()
    wall.advance(-(wall() % 86_400) + 23 * 3_600)  # 23:00 UTC
    client = make_client(clock=Clock(1.0, wall=wall), read_budget={"per_day": 2},
                         budget_windows={"minute": "sliding", "day": "sliding"})
    job_id = client.create()
    assert client.api("GET", f"/jobs/{job_id}").status == 200
    wall.advance(3_600)  # midnight: a fixed day would have one read left
    assert client.api("GET", f"/jobs/{job_id}").status == 200
    refused = client.api("GET", f"/jobs/{job_id}")
    assert refused.status == 429 and refused.headers["RateLimit-Policy"] == "2;w=86400"
    assert int(refused.headers["Retry-After"]) == 86_400  # until midnight's two attempts have left
    wall.advance(86_400 - 1)
    assert client.api("GET", f"/jobs/{job_id}").status == 429
    wall.advance(86_400)
    assert client.api("GET", f"/jobs/{job_id}").status == 200


def test_a_sliding_window_counts_the_other_consumer_and_rejects_unknown_kinds(
        make_client: Callable[..., Client]) -> None:
    wall = FakeWall()
    client = make_client(clock=Clock(1.0, wall=wall), read_budget={"per_minute": 10}, other_consumer_share=0.5,
                         budget_windows={"minute": "sliding"})
    job_id = client.create()
    reply = client.api("GET", f"/jobs/{job_id}")  # the other client spent 5 of the last 60 s: 12 s apart
    assert reply.status == 200 and reply.headers["RateLimit-Remaining"] == "4"
    rejected = client.ctl("POST", "/config", {"budget_windows": {"minute": "rolling"}})
    assert rejected.status == 400 and "budget_windows.minute" in rejected.json()["error"]["message"]
    assert client.ctl("POST", "/config", {"budget_windows": {"hour": "fixed"}}).status == 400
    assert client.ctl("GET", "/config").json()["budget_windows"]["minute"] == "sliding"


# ---------------------------------------------------------------------------- list


def test_list_default_mode(client: Client) -> None:
    ids = [client.create() for _ in range(3)]
    ids.append(client.create(path="/videos/generations", sim={"duration": 0}))
    body = client.api("GET", "/jobs?limit=10").json()
    assert set(body) == {"jobs", "request_id"}  # no cursor field
    assert sorted(j["id"] for j in body["jobs"]) == sorted(ids)
    assert all(set(j) == {"id", "type", "status"} for j in body["jobs"])
    assert [j["id"] for j in client.api("GET", "/jobs?type=video_generation").json()["jobs"]] == [ids[3]]
    assert [j["id"] for j in client.api("GET", "/jobs?status=Completed").json()["jobs"]] == [ids[3]]
    assert_envelope(client.api("GET", "/jobs?status=queued,completed"), 400, "bad_request")
    assert_envelope(client.api("GET", "/jobs?limit=0"), 400, "bad_request")
    assert_envelope(client.api("GET", "/jobs?type=video"), 400, "bad_request")
    assert client.stats()["status_reads"] == 0 and client.stats()["list_reads"] == 6


def test_list_paginates_newest_first_with_full_items(client: Client) -> None:
    client.configure(list={"fields": "full", "order": "newest_first", "cursor": True, "multi_status": True})
    ids = [client.create() for _ in range(3)]
    ids.append(client.create(path="/videos/generations", sim={"duration": 0}))
    page1 = client.api("GET", "/jobs?limit=3").json()
    assert [j["id"] for j in page1["jobs"]] == list(reversed(ids))[:3]
    assert {"created_at", "updated_at"} <= set(page1["jobs"][0])
    page2 = client.api("GET", f"/jobs?limit=3&cursor={page1['next_cursor']}").json()
    assert [j["id"] for j in page2["jobs"]] == [ids[0]] and page2["next_cursor"] is None
    assert len(client.api("GET", "/jobs?status=queued,completed").json()["jobs"]) == 4


@pytest.mark.parametrize(("route", "status", "code"),
                         [("missing", 404, "not_found"), ("bad_request", 400, "bad_request"),
                          ("forbidden", 403, "forbidden")])
def test_list_route_misses(client: Client, route: str, status: int, code: str) -> None:
    client.configure(list={"route": route})
    assert_envelope(client.api("GET", "/jobs"), status, code)


def test_list_faults_and_a_repeating_cursor(client: Client) -> None:
    client.configure(list={"cursor": True, "cursor_repeat": True, "order": "newest_created",
                           "faults": ["ok", "503:2", "malformed"]})
    ids = [client.create(sim={"duration": 600}) for _ in range(5)]
    page1 = client.api("GET", "/jobs?limit=2").json()
    assert [j["id"] for j in page1["jobs"]] == [ids[4], ids[3]]
    cursor = page1["next_cursor"]
    failed = client.api("GET", f"/jobs?limit=2&cursor={cursor}")
    assert_envelope(failed, 503, "internal_error")
    assert failed.headers["Retry-After"] == "2"
    garbled = client.api("GET", f"/jobs?limit=2&cursor={cursor}")
    assert garbled.status == 200 and garbled.data.startswith(b'{"jobs": [')
    with pytest.raises(ValueError):
        json.loads(garbled.data)
    for _ in range(2):
        page2 = client.api("GET", f"/jobs?limit=2&cursor={cursor}").json()
        assert [j["id"] for j in page2["jobs"]] == [ids[2], ids[1]] and page2["next_cursor"] == cursor
    stats = client.stats()
    assert stats["list_reads"] == 5 and stats["list_faults_remaining"] == []


def test_list_filters_items_and_foreign_jobs(client: Client) -> None:
    ids = {outcome: client.create(sim={"duration": 0, "outcome": outcome})
           for outcome in ("completed", "failed", "canceled", "expired")}
    ids["queued"] = client.create(sim={"duration": 600})

    def listed(query: str) -> list[dict[str, Any]]:
        resp = client.api("GET", f"/jobs?limit=50&{query}")
        assert resp.status == 200, resp.data
        return list(resp.json()["jobs"])

    client.configure(list={"status_filter": "loose"})
    loose = {j["id"]: j["status"] for j in listed("status=failed")}
    assert loose == {ids[s]: s for s in ("completed", "failed", "canceled", "expired")}
    client.configure(list={"status_filter": "ignored"})
    assert {j["id"] for j in listed("status=failed")} == set(ids.values())
    client.configure(list={"item_status": False, "foreign": 2, "fields": "full", "order": "newest_created"})
    items = listed("status=failed")
    own, foreign = items[:-2], items[-2:]
    assert [j["id"] for j in own] == [ids["failed"]]
    assert all(set(j) == {"id", "type", "created_at", "updated_at"} for j in items)
    assert all(re.fullmatch(r"job_foreign_[0-9a-f]{24}", j["id"]) for j in foreign)
    assert_envelope(client.api("GET", f"/jobs/{foreign[0]['id']}"), 404, "not_found")
    client.configure(list={"foreign": 1, "fields": "full", "order": "newest_created"})
    everything = listed("")
    assert [j["id"] for j in everything[:-1]] == list(reversed(ids.values()))  # newest created first
    stamps = [j["created_at"] for j in everything]
    assert stamps == sorted(stamps, reverse=True) and everything[-1]["status"] == "completed"


@pytest.mark.parametrize(("field", "value"), [("status_filter", "strict"), ("item_status", "no"),
                                              ("cursor_repeat", 1), ("faults", ["boom"]), ("foreign", -1),
                                              ("order", "oldest_first")])
def test_list_mode_fields_are_validated(client: Client, field: str, value: Any) -> None:
    rejected = client.ctl("POST", "/config", {"list": {"cursor": True, field: value}})
    assert rejected.status == 400 and rejected.json()["error"]["details"] == {"field": field}
    assert client.ctl("GET", "/config").json()["list"][field] != value


# ---------------------------------------------------------------------------- webhooks


class Receiver:
    """A local HTTP server recording every POST (headers, body)."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        received = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/sume"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


def test_webhook_is_delivered_signed_and_duplicated(make_client: Callable[..., Client], receiver: Receiver) -> None:
    secret = "whsec_integration"
    client = make_client(time_scale=0.01, seed=1,
                         webhooks={"kinds": ["image"], "secret": secret, "duplicate": 1.0, "delay": 5})
    refused = client.api("POST", "/videos/generations", {"webhook_url": receiver.url})
    assert assert_envelope(refused, 400, "bad_request")["error"]["details"] == {"field": "webhook_url"}
    job_id = client.create(sim={"duration": 10})  # no webhook: nothing is sent for it
    created = client.api("POST", "/images/generations", {"webhook_url": receiver.url, "sim": {"duration": 10}})
    hooked = created.json()["job"]["id"]
    wait_for(lambda: len(receiver.requests) >= 2, what="two deliveries")  # never read: the worker still sends
    assert client.job_info(hooked)["status_reads"] == 0 and job_id != hooked
    (headers, body), (headers2, body2) = receiver.requests[:2]
    assert body == body2 and headers["x-sume-event-id"] == headers2["x-sume-event-id"]
    timestamp = headers["x-sume-timestamp"]
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    assert headers["x-sume-signature"] == f"v1={expected}"
    assert abs(int(timestamp) - Clock(0.01).now()) < 1000  # clock seconds (10 s real), far from wall time
    event = json.loads(body)
    assert event["id"] == headers["x-sume-event-id"] and event["type"] == "image_generation.ready"
    assert event["data"] == {"job_id": hooked, "status": "completed", "type": "image_generation"}
    stats = wait_for(lambda: (s := client.ctl("GET", "/webhooks").json())["sent"] == 2 and s, what="stats")
    assert (stats["planned"], stats["duplicated"], stats["statuses"]) == (1, 1, {"200": 2})
    assert stats["deliveries"][0]["job_id"] == hooked and client.stats()["webhooks"]["sent"] == 2


# ---------------------------------------------------------------------------- control API


def test_control_job_and_stats_counters(client: Client) -> None:
    job_id = client.create(sim={"steps": 4, "duration": 3_600})  # queued for 15 minutes: still queued, however slow
    for _ in range(3):
        client.status(job_id)
    client.api("GET", f"/jobs/{job_id}/result")
    client.api("GET", "/jobs/job_ghost")
    client.api("GET", "/jobs/job_ghost")
    info = client.job_info(job_id)
    assert {k: info[k] for k in ("id", "kind", "status", "status_reads", "result_reads", "min_reads")} == {
        "id": job_id,
        "kind": "image",
        "status": "queued",
        "status_reads": 3,
        "result_reads": 1,
        "min_reads": 5,
    }
    assert info["terminal_status"] == "completed" and info["spec"]["steps"] == 4
    ghost = client.ctl("GET", "/jobs/job_ghost")
    assert ghost.status == 404 and ghost.json()["status_reads"] == 2 and ghost.json()["exists"] is False
    stats = client.stats()
    assert stats["status_reads"] == 5 and stats["result_reads"] == 1
    assert stats["creates"] == 1 and stats["create_requests"] == 1 and stats["replays"] == 0
    assert 0 <= stats["jobs"][job_id].pop("first_any_read_age") <= stats["jobs"][job_id].pop("first_read_age") < 60
    assert stats["jobs"][job_id] == {"status_reads": 3, "result_reads": 1, "min_reads": 5, "status": "queued",
                                     "status_reads_after_terminal": 0}
    assert stats["jobs"]["job_ghost"]["status_reads"] == 2


def test_seed_job_with_explicit_id(client: Client) -> None:
    resp = client.ctl(
        "POST", "/jobs", {"id": "job_existing", "kind": "face_swap", "sim": {"outcome": "expired"}}
    )
    assert resp.status == 201 and resp.json() == {"id": "job_existing"}
    assert client.status("job_existing")["type"] == "face_swap"
    assert client.ctl("POST", "/jobs", {"id": "job_existing"}).status == 400
    assert client.ctl("POST", "/jobs", {"kind": "hologram"}).status == 400
    stats = client.stats()
    assert stats["creates"] == 0 and stats["jobs_created"] == 1


def test_config_endpoint_validates_and_changes_api_key(client: Client) -> None:
    config = client.ctl("GET", "/config").json()
    assert config["hints"] is True and config["api_key"] == KEY and config["rate_limit_per_minute"] is None
    assert config["read_budget"] == {"per_minute": None, "per_day": None} and config["list"]["cursor"] is False
    assert client.ctl("POST", "/config", {"time_scale": 0}).status == 400
    rejected = client.ctl("POST", "/config", {"time_scale": 0.5})
    assert rejected.status == 400 and "time_scale" in rejected.json()["error"]["message"]
    assert client.ctl("POST", "/config", {"bogus": 1}).status == 400
    assert client.ctl("POST", "/config", {"list": {"fields": "everything"}}).status == 400
    updated = client.configure(api_key="sume_other")
    assert updated["api_key"] == "sume_other" and updated["time_scale"] == 1.0
    assert_envelope(client.api("GET", "/jobs"), 401, "unauthorized")
    assert client.api("GET", "/jobs", auth=False, headers={"X-Api-Key": "sume_other"}).status == 200


def test_reset_clears_everything(client: Client) -> None:
    headers = {"Idempotency-Key": "k1"}
    first = client.api("POST", "/images/generations", {"p": 1}, headers=headers).json()["job"]["id"]
    client.status(first)
    client.configure(hints=False, latency_ms=5)
    assert client.ctl("POST", "/reset").status == 200
    stats = client.stats()
    assert stats["jobs"] == {} and stats["status_reads"] == 0 and stats["creates"] == 0
    config = client.ctl("GET", "/config").json()
    assert config["hints"] is True and config["latency_ms"] == 0
    assert client.ctl("GET", "/budget").json()["reads"]["60"] == []
    assert_envelope(client.api("GET", f"/jobs/{first}"), 404, "not_found")
    again = client.api("POST", "/images/generations", {"p": 1}, headers=headers)
    assert again.json()["job"]["id"] != first and "Idempotent-Replayed" not in again.headers


def test_python_api_and_context_manager(http: urllib3.PoolManager) -> None:
    with SumeSimulator(api_key="k2", hints=False, time_scale=0.5, rate_limit_per_minute=50) as sim:
        assert re.match(r"^http://127\.0\.0\.1:\d+/api/v1$", sim.base_url)
        assert sim.control_url == sim.root_url + "/_sim" and sim.config["read_budget"]["per_minute"] == 50
        job_id = sim.seed_job("video", {"duration": 0})
        resp = http.request("GET", f"{sim.base_url}/jobs/{job_id}", headers={"Authorization": "Bearer k2"})
        assert resp.json()["job"]["status"] == "completed" and "terminal" not in resp.json()["job"]
        info = sim.job_info(job_id)
        assert info is not None and info["status_reads"] == 1
        assert sim.configure(hints=True)["hints"] is True and sim.stats()["status_reads"] == 1
        assert sim.budget_stats()["reads"]["60"][-1]["served"] == 1
        assert sim.webhook_stats()["planned"] == 0
        port = sim.port
    with pytest.raises(urllib3.exceptions.HTTPError):
        http.request("GET", f"http://127.0.0.1:{port}/_sim/stats", retries=False)


# ---------------------------------------------------------------------------- API keys

KEY_A = "sume_live_acme_0123456789"
KEY_B = "sume_live_globex_9876543"


class FakeWall:
    """A wall clock the test moves: the simulator's clock at scale 1 without waiting."""

    def __init__(self) -> None:
        self.t = float(int(time.time()) // 60 * 60) + 0.5  # half a second into a minute window

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def as_key(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def keyed(make_client: Callable[..., Client]) -> tuple[Client, FakeWall]:
    """A simulator on a fake wall clock with the default key, A ("acme", 2 reads a minute) and B
    ("globex", 3 reads a minute, its own webhook secret)."""
    wall = FakeWall()
    keys = {KEY_A: {"workspace": "acme", "read_budget": {"per_minute": 2}},
            KEY_B: {"workspace": "globex", "read_budget": {"per_minute": 3}, "webhook_secret": "whsec_globex"}}
    client = make_client(clock=Clock(1.0, wall=wall), keys=keys,
                         webhooks={"kinds": ["image"], "secret": "whsec_top"})
    return client, wall


def test_keys_have_their_own_budgets_workspaces_and_lists(keyed: tuple[Client, FakeWall]) -> None:
    client, _ = keyed
    mine = client.create(auth=False, headers=as_key(KEY_A))
    theirs = client.create(auth=False, headers={"X-Api-Key": KEY_B})
    reads = [client.api("GET", f"/jobs/{mine}", auth=False, headers=as_key(KEY_A)) for _ in range(3)]
    assert [r.status for r in reads] == [200, 200, 429]
    assert_envelope(reads[2], 429, "rate_limit_exceeded")
    assert (reads[2].headers["Retry-After"], reads[2].headers["RateLimit-Policy"]) == ("60", "2;w=60")
    foreign = client.api("GET", f"/jobs/{mine}", auth=False, headers=as_key(KEY_B))
    assert_envelope(foreign, 403, "forbidden")  # B's read budget pays for it: 1 of 3 spent
    assert foreign.headers["RateLimit-Remaining"] == "2"
    listing = client.api("GET", "/jobs", auth=False, headers={"Authorization": "Bearer wrong", "X-Api-Key": KEY_B})
    assert [item["id"] for item in listing.json()["jobs"]] == [theirs]
    assert client.api("GET", f"/jobs/{theirs}", auth=False, headers=as_key(KEY_B)).status == 200
    assert client.api("GET", f"/jobs/{theirs}", auth=False, headers=as_key(KEY_B)).status == 429
    assert client.api("GET", "/jobs").json()["jobs"] == [] and client.status(client.create())["status"] == "queued"
    stats = client.stats()["keys"]
    assert stats["acme"]["reads"] == {"attempts": 3, "served": 2, "rate_limited": 1}
    assert stats["globex"]["reads"] == {"attempts": 4, "served": 3, "rate_limited": 1}
    assert stats["globex"]["forbidden"] == 1 and stats["default"]["jobs_created"] == 1
    budget = client.ctl("GET", "/budget").json()
    assert budget["keys"]["globex"]["reads"]["60"][-1]["attempts"] == 4
    assert budget["reads"]["60"][-1]["attempts"] == 2  # the top level is the default key's, as before
    for answer in (client.ctl("GET", "/stats"), client.ctl("GET", "/budget")):
        assert all(key.encode() not in answer.data for key in (KEY, KEY_A, KEY_B))


def test_key_control_routes_rotate_remove_and_add(keyed: tuple[Client, FakeWall]) -> None:
    client, wall = keyed
    job_id = client.create(auth=False, headers=as_key(KEY_A), sim={"duration": 600})
    assert client.api("GET", f"/jobs/{job_id}", auth=False, headers=as_key(KEY_A)).status == 200
    rotated = client.ctl("POST", "/keys/rotate", {"old": KEY_A, "new": "sume_live_acme_rotated"})
    assert rotated.status == 200 and rotated.json() == {"workspace": "acme", "key": "sume_liv..."}
    assert_envelope(client.api("GET", f"/jobs/{job_id}", auth=False, headers=as_key(KEY_A)), 401, "unauthorized")
    kept = client.api("GET", f"/jobs/{job_id}", auth=False, headers=as_key("sume_live_acme_rotated"))
    assert (kept.status, kept.headers["RateLimit-Remaining"]) == (200, "0")  # the same minute window
    removed = client.ctl("POST", "/keys/remove", {"key": KEY_B})
    assert removed.status == 200 and removed.json()["workspace"] == "globex"
    assert_envelope(client.api("GET", "/jobs", auth=False, headers=as_key(KEY_B)), 401, "unauthorized")
    added = client.ctl("POST", "/keys/add", {"key": "sume_live_initech_1", "workspace": "initech",
                                             "create_budget": {"per_minute": 1}})
    assert added.status == 201 and added.json() == {"workspace": "initech", "key": "sume_liv..."}
    initech = as_key("sume_live_initech_1")
    assert client.create(auth=False, headers=initech)
    assert client.api("POST", "/images/generations", {}, auth=False, headers=initech).status == 429
    for path, body, field in (("/keys/rotate", {"old": "nope", "new": "x"}, "old"),
                              ("/keys/rotate", {"old": KEY, "new": "sume_live_initech_1"}, "new"),
                              ("/keys/remove", {"key": KEY_B}, "key"),
                              ("/keys/remove", {"key": KEY, "extra": 1}, "extra"),
                              ("/keys/add", {"key": "k3", "workspace": "initech"}, "workspace")):
        refused = client.ctl("POST", path, body)
        assert refused.status == 400 and refused.json()["error"]["details"] == {"field": field}, (path, body)
    keys = client.ctl("GET", "/config").json()["keys"]
    assert set(keys) == {"sume_live_acme_rotated", "sume_live_initech_1"} and keys["sume_live_acme_rotated"] == {
        "workspace": "acme", "read_budget": {"per_minute": 2, "per_day": None}}
    sim = client.sim  # the same calls on the Python wrapper
    assert sim.rotate_key("sume_live_acme_rotated", KEY_A) == {"workspace": "acme", "key": "sume_liv..."}
    assert sim.add_key(KEY_B, "globex", read_budget={"per_minute": 5}, webhook_secret="s2")["workspace"] == "globex"
    assert sim.remove_key("sume_live_initech_1")["workspace"] == "initech"
    wall.advance(60)
    assert client.api("GET", f"/jobs/{job_id}", auth=False, headers=as_key(KEY_A)).status == 200
    assert client.api("GET", "/jobs", auth=False, headers=as_key("sume_live_initech_1")).status == 401
    assert sim.stats()["keys"]["initech"]["key"] is None and sim.stats()["keys"]["globex"]["read_budget"] == {
        "per_minute": 5, "per_day": None}


def test_webhook_is_signed_with_the_workspace_keys_secret(keyed: tuple[Client, FakeWall], receiver: Receiver) -> None:
    client, wall = keyed
    theirs = client.seed(kind="image", key=KEY_B, webhook_url=receiver.url, sim={"duration": 1})
    default = client.seed(kind="image", webhook_url=receiver.url, sim={"duration": 1})
    assert client.job_info(theirs)["workspace"] == "globex" and client.job_info(default)["workspace"] == "default"
    wall.advance(2)
    wait_for(lambda: len(receiver.requests) >= 2, what="two deliveries")
    signed_with = {}
    for headers, body in receiver.requests:
        for secret in ("whsec_globex", "whsec_top"):
            digest = hmac.new(secret.encode(), f"{headers['x-sume-timestamp']}.".encode() + body,
                              hashlib.sha256).hexdigest()
            if headers["x-sume-signature"] == f"v1={digest}":
                signed_with[json.loads(body)["data"]["job_id"]] = secret
    assert signed_with == {theirs: "whsec_globex", default: "whsec_top"}


# ---------------------------------------------------------------------------- CLI


def test_cli_starts_serves_and_exits_on_sigterm(http: urllib3.PoolManager) -> None:
    command = [sys.executable, "-m", "tools.sume_sim", "--port", "0", "--api-key", "sume_cli_key", "--no-hints",
               "--time-scale", "0.01", "--read-per-minute", "100", "--list", '{"cursor": true}',
               "--keys", '{"sume_cli_key_b": {"workspace": "b", "read_budget": {"per_minute": 7}}}']
    proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline() if proc.stdout else ""))
        reader.start()
        reader.join(timeout=10)
        assert lines, "no listening line within 10 s"
        match = re.fullmatch(r"sume-sim listening on (http://127\.0\.0\.1:\d+/api/v1)\n", lines[0])
        assert match, lines[0]
        base = match.group(1)
        created = http.request(
            "POST", f"{base}/images/generations", body=b"{}", headers={"Authorization": "Bearer sume_cli_key"}
        )
        assert created.status == 201
        job = http.request(
            "GET", f"{base}/jobs/{created.json()['job']['id']}", headers={"X-Api-Key": "sume_cli_key"}
        )
        assert job.status == 200 and "next_poll_after_seconds" not in job.json()["job"]
        assert job.headers["RateLimit-Policy"] == "100;w=60"
        listing = http.request("GET", f"{base}/jobs", headers={"X-Api-Key": "sume_cli_key_b"})
        assert listing.json()["jobs"] == [] and listing.headers["RateLimit-Policy"] == "7;w=60"
        config = http.request("GET", base.replace("/api/v1", "/_sim/config")).json()
        assert config["time_scale"] == 0.01 and config["list"]["cursor"] is True
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()

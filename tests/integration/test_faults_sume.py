"""The fault suite, Sume's answers: transient fault storms, read-after-create 404s, jobs of another
workspace, a rejected key and its rotation, results of every shape, an explicit ``terminal: false``,
messages of the previous release, and secrets that never reach a log - on the whole system,
compressed clock (TimeScale 0.02)."""

from __future__ import annotations

import json
import random
import time
import uuid

import pytest
import redis
from invariants import check
from scenario import FAULT_JOBS, FAULT_SCALE, fault_suite_fixtures, run, status_reads, submit

from sume_poller.limits.lease import new_token
from tools.stack.inprocess import InProcessStack

pytestmark = pytest.mark.integration

SCALE, JOBS = FAULT_SCALE, FAULT_JOBS
module_stack, stack = fault_suite_fixtures()


# == Sume's answers ===============================================================================
def test_a_storm_of_transient_faults_never_reaches_the_dlq(stack: InProcessStack) -> None:
    rng = random.Random(7)
    faults = ["429:1", "503:1", "500", "malformed", "html", "empty", "slow:1500"]
    plan = {i: rng.sample(faults, 2) for i in range(JOBS)}
    ids = submit(stack, JOBS, lambda i: {"duration": 150, "steps": 2, "faults": plan[i]})
    run(stack, ids, timeout=90)
    check(stack, ids, scenario="transient Sume faults (429, 5xx, garbage, timeouts)", allowance=2,
          expected="completed", notes="2 faults per job")
    assert stack.dlq_depth() == 0


def test_a_404_in_the_first_minute_after_create_is_lag_and_later_final(stack: InProcessStack) -> None:
    lagged = submit(stack, 6, {"duration": 150, "steps": 2, "not_found_for": 60})
    gone = submit(stack, 2, {"duration": 150, "steps": 2, "not_found_for": 10**6})
    run(stack, lagged + gone, timeout=60)
    check(stack, lagged, scenario="404 for the first minute after create", expected="completed", allowance=4)
    check(stack, gone, scenario="404 past the grace window", expected="failed", allowance=20)
    assert all(stack.record(j)["error"]["code"] == "not_found" for j in gone)  # type: ignore[index]


def test_a_job_of_another_workspace_fails_alone(stack: InProcessStack) -> None:
    healthy = submit(stack, 18, {"duration": 200, "steps": 3})
    foreign = submit(stack, 6, {"duration": 200, "forbidden": True})
    run(stack, healthy + foreign)
    check(stack, healthy, scenario="healthy jobs beside foreign-workspace ones", expected="completed")
    check(stack, foreign, scenario="foreign-workspace jobs (403)", expected="failed")
    assert stack.metric_totals()["KeyPaused"] == 0 and stack.metric_totals()["SumeAuthFailed"] == 0


def test_a_rejected_key_pauses_every_read_then_rotation_resumes(stack: InProcessStack) -> None:
    ids = submit(stack, 10, {"duration": 600, "steps": 4})
    stack.drive(lambda: status_reads(stack, ids) >= 10, 30)
    new_key = "sume_rotated_" + uuid.uuid4().hex
    stack.sim.configure(api_key=new_key)
    refused_before = stack.sim.stats()["unauthorized"]
    stack.drive(lambda: stack.metric_totals()["SumeAuthFailed"] > 0, 30)
    pause_end = time.monotonic() + stack.clock.to_real(250)
    stack.drive(lambda: time.monotonic() >= pause_end, 30)
    refused = stack.sim.stats()["unauthorized"] - refused_before
    stack.client("ssm").put_parameter(Name="/sume-poller/api-key", Value=new_key, Type="SecureString", Overwrite=True)
    run(stack, ids, timeout=90)
    check(stack, ids, scenario="rejected key, then rotation", expected="completed", allowance=2,
          notes=f"{refused} rejected reads during the pause")
    assert refused <= 10  # at most what was in flight: the pause stops every reader


def test_results_of_every_shape_are_stored_whole(stack: InProcessStack) -> None:
    shapes = {"object": {}, "list": {}, "string": {}, "large": {"result_bytes": 250_000}}
    ids = {shape: submit(stack, 1, {"duration": 100, "result_shape": shape, **extra})[0]
           for shape, extra in shapes.items()}
    run(stack, list(ids.values()))
    check(stack, list(ids.values()), scenario="results of every shape", expected="completed")
    assert isinstance(json.loads(stack.record(ids["list"])["result_json"]), list)  # type: ignore[index]
    assert isinstance(json.loads(stack.record(ids["string"])["result_json"]), str)  # type: ignore[index]
    large = stack.record(ids["large"])
    assert large is not None and "result_s3_key" in large
    body = stack.client("s3").get_object(Bucket=stack.outputs["ResultBucketName"], Key=large["result_s3_key"])
    assert len(body["Body"].read()) == large["result_bytes"]


def test_an_explicit_terminal_false_beside_a_terminal_status_ends_the_job(stack: InProcessStack) -> None:
    ids = submit(stack, 3, {"duration": 100, "terminal_flag": False})
    run(stack, ids)
    check(stack, ids, scenario="terminal: false beside a terminal status", expected="completed")


# == deploys ===========================================================================================
def test_messages_of_the_previous_version_are_still_processed(stack: InProcessStack) -> None:
    """Poll messages queued by the previous release (v1, with and without a chain token)."""
    ids = submit(stack, 4, {"duration": 100})
    stack.drive(lambda: stack.queue_depth() == 0 or all(
        s["status_reads"] > 0 for j, s in stack.sim.stats()["jobs"].items() if j in ids), 20)
    redis.Redis.from_url(stack.redis_url).flushall()  # the chains of the old release are gone
    for n, job_id in enumerate(ids):
        body = {"v": 1, "job_id": job_id, "kind": "image", "deadline_at": 4_102_444_800, "due_at": 0,
                "token": None if n % 2 else new_token(), "seq": 0, "attempt": 1, "errors": 0}
        stack.send(json.dumps(body))
    run(stack, ids)
    check(stack, ids, scenario="v1 messages replayed through the new code", allowance=1)


# == secrets ===========================================================================================
def test_no_key_and_no_result_url_in_any_log_line(stack: InProcessStack) -> None:
    ids = submit(stack, 6, {"duration": 100, "faults": ["503:1"]})
    run(stack, ids)
    text = stack.log_path.read_text(errors="replace")
    assert stack.api_key not in text
    assert "cdn.sume.example/signed" not in text  # the simulator's signed result URLs
    records = "".join(json.dumps(stack.record(j)) for j in ids)
    assert stack.api_key not in records

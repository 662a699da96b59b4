"""The fault suite, Sume's answers: transient fault storms, read-after-create 404s, jobs of another
workspace, a rejected key and its rotation, results of every shape, an explicit ``terminal: false``,
messages of the previous release, and secrets that never reach a log - on the whole system,
compressed clock (TimeScale 0.02)."""

from __future__ import annotations

import json
import random
import uuid

import pytest
import redis
from invariants import LeaseLapses, check
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


def test_a_key_check_without_an_answer_records_nothing_and_keeps_nothing(stack: InProcessStack) -> None:
    """The key check's list read answers 503, 429, then nothing in time (the simulator's list faults):
    no evidence either way, so no foreign-workspace job is recorded before the list answered (before:
    such a read meant "the key is fine", the job was failed and the verdict kept for a minute)."""
    stack.sim.configure(list={"faults": ["503", "429:1", "slow:1500", "503"]})
    early: list[str] = []

    def no_outcome_before_an_answer(name: str, job_id: str) -> None:
        if name == "written" and job_id in foreign and stack.sim.stats()["list_faults_remaining"]:
            early.append(job_id)

    foreign: list[str] = []
    stack.step_hook = no_outcome_before_an_answer
    foreign += submit(stack, 4, {"duration": 200, "forbidden": True})
    healthy = submit(stack, 4, {"duration": 200, "steps": 2})
    run(stack, healthy + foreign, timeout=90)
    assert early == [], f"recorded before the key check had an answer: {early}"
    assert stack.sim.stats()["list_faults_remaining"] == []
    check(stack, foreign, scenario="foreign-workspace jobs while the key check gets no answer", expected="failed",
          allowance=4)
    check(stack, healthy, scenario="healthy jobs beside them", expected="completed")
    assert all(stack.record(j)["evidence"] == "status_read" for j in foreign)  # type: ignore[index]
    assert stack.metric_totals()["SumeAuthFailed"] == 0


def test_a_job_route_refusal_the_contract_does_not_name_is_retried_and_recorded_only_over_the_window(
        stack: InProcessStack) -> None:
    """400, 410, 413, 422, 431 from GET /jobs/{id} - Sume's own, or a proxy's page in front of it: only
    401/403/404 end a job read. Refused a few times, the jobs complete; refused on every read, they are
    recorded failed once the refusals repeated over RefusalWindowSeconds (300 clock s here). Before: one
    such answer failed a running job at first sight."""
    passing = ["400", "proxy:413", "422", "proxy:431", "410"]
    # Two refusals a job, all five kinds among the four jobs: one re-queue (about a real second) between a
    # job's first and last refusal, far inside the 300 clock s window (6 real s here). Five on one job
    # spanned four re-queues, which a loaded machine can stretch past the window.
    faults = [[passing[i % 5], passing[(i + 1) % 5]] for i in range(4)]
    blips = submit(stack, 4, lambda i: {"duration": 150, "steps": 2, "faults": faults[i]})
    # Still running at Sume (a sweep's list or a result read would rightly finish a job Sume completed):
    refused_for_good = submit(stack, 2, {"duration": 100_000, "faults": ["proxy:400"] * 40})
    run(stack, blips + refused_for_good, timeout=90)
    check(stack, blips, scenario="job route refusals the contract does not name (a proxy's too), 2 per job",
          expected="completed", allowance=2)
    assert all(stack.record(j)["result_json"] for j in blips)  # type: ignore[index]
    for job_id in refused_for_good:
        record = stack.record(job_id)
        assert record is not None and (record["status"], record["evidence"]) == ("failed", "status_read")
        assert record["terminal_at"] - record["submitted_at"] >= 300  # the refusal window, not the first answer
    # Every refusal Sume served is counted (how many a job met before a sweep or its result finished it
    # is the machine's speed: a loaded CI run served 17 of the 20 when each job had five).
    served = sum(2 - len(stack.sim.job_info(j)["faults_remaining"]) for j in blips)  # type: ignore[index]
    assert served > 0 and stack.metric_totals()["SumeReadRefused"] >= served, served


def test_a_result_refused_after_the_status_said_completed_is_never_a_failure_nor_recorded_without_saying_so(
        stack: InProcessStack) -> None:
    """The result route refuses (410, 400, 422; a 403 while the key is fine) after the job's own status
    route said completed: retried; the result that comes is recorded; refused over the whole window, the
    job is recorded completed with ``result_refused``. Before: completed without the result at the first
    410/400/422, and ``failed`` at a 403 (the key check cleared the key, so it blamed the job)."""
    with LeaseLapses(stack) as lapses:
        refused_then_served = submit(stack, 3, {"duration": 100, "result_faults": ["410", "400", "422"]})
        forbidden_then_served = submit(stack, 2, {"duration": 100, "result_faults": ["403"]})
        never = submit(stack, 1, {"duration": 100, "result_faults": ["410"] * 40})
        run(stack, refused_then_served + forbidden_then_served + never, timeout=90)
        lapsed = lapses.collect()
    served = refused_then_served + forbidden_then_served
    # Re-queues on 1 s lease margins (up to three for a served job, eight over the window for the one
    # never served): a step's message that comes back after its lease lapsed (a busy machine) lets fan-out
    # restart the chain from its record, whose first step reads the status of a job Sume finished - one
    # status read per lapse, the documented exception; exactly the lapses measured are allowed, no more.
    check(stack, served, scenario="result route refusals after a completed status", expected="completed",
          allowance={j: lapsed[j] for j in served}, notes=f"{sum(lapsed[j] for j in served)} lease lapses")
    assert all(stack.record(j)["result_json"] and stack.record(j)["evidence"] == "result_read"  # type: ignore[index]
               for j in served)
    check(stack, never, scenario="a result refused over the whole refusal window", expected="completed",
          allowance={j: lapsed[j] for j in never}, notes=f"{lapsed[never[0]]} lease lapses")
    record = stack.record(never[0])
    assert record is not None and (record["error"]["code"], record["evidence"]) == ("result_refused", "status_read")
    assert "HTTP 410" in record["error"]["message"] and "result_json" not in record


def test_an_unknown_status_with_terminal_true_is_not_an_outcome(stack: InProcessStack) -> None:
    """Sume's contract: an unknown status is not terminal (keep reading, report it loudly): ``terminal:
    true`` beside one is not an outcome either. Before: recorded failed (its result not ready) at once."""
    ids = submit(stack, 3, {"duration": 150, "steps": 2, "terminal_flag": True,
                            "status_override": {"status": "finalizing", "reads": 2}})
    run(stack, ids)
    check(stack, ids, scenario="an unknown status with terminal: true, twice per job", expected="completed",
          allowance=2)
    assert all(stack.record(j)["result_json"] for j in ids)  # type: ignore[index]
    assert stack.metric_totals()["UnknownStatus"] >= 3


def test_a_rejected_key_pauses_every_read_then_rotation_resumes(stack: InProcessStack) -> None:
    ids = submit(stack, 10, {"duration": 600, "steps": 4})
    stack.drive(lambda: status_reads(stack, ids) >= 10, 30)
    new_key = "sume_rotated_" + uuid.uuid4().hex
    stack.sim.configure(api_key=new_key)
    refused_before = stack.sim.stats()["unauthorized"]
    stack.drive(lambda: stack.metric_totals()["SumeAuthFailed"] > 0, 30)
    # Counted until two real seconds before the pause ends (the limiter grants no read before it): where the
    # pause ends, not how soon this thread saw it start - a loaded machine sees the 401's metric late.
    paused_until = stack.budget_state()["key_pause_until"] / 1000
    stack.drive(lambda: stack.clock.now() >= paused_until - stack.clock.from_real(2.0), 30)
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

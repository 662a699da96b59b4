"""template.yaml deployed into ministack: wired as the template says, jobs end in every terminal
status with exactly one event each, and every custom-metric alarm watches a metric the deployed
functions really emit.

Expected values come from the template itself, created with the parameters the stack was deployed
with in moto's CloudFormation (tools.template.resolve), so these tests follow the template rather
than restate it: two CloudFormation implementations must agree.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any

import pytest
import redis

from sume_poller.creates.createqueue import DrainMessage, drain_lease
from sume_poller.limits.lease import new_token
from sume_poller.store.records import stats_slot
from sume_poller.store.submissions import queue_item, queued_record
from tools import ops
from tools.stack.base import queue_depth
from tools.stack.deployed import DeployedStack
from tools.template import Created, resolve

pytestmark = pytest.mark.e2e

NAMESPACE = "SumePoller"
SERVICE = {"Name": "service", "Value": "sume-poller"}
OUTCOMES = ("completed", "failed", "canceled", "expired")


@pytest.fixture(scope="module")
def expected(deployed_stack: DeployedStack) -> Created:
    """The template with the deployed stack's parameters, created in moto's CloudFormation."""
    return resolve(deployed_stack.parameters)


def resources_of(expected: Created, resource_type: str) -> dict[str, dict[str, Any]]:
    """Logical id -> resolved properties, for the resources of a type whose Condition holds."""
    return {lid: expected.properties[lid] for lid in expected.of_type(resource_type)}


def prop(expected: Created, logical_id: str, *path: str) -> Any:
    value: Any = expected.properties[logical_id]
    for key in path:
        value = value[key]
    return value


def submit(stack: DeployedStack, sim: dict[str, Any], kind: str = "image") -> str:
    """A new job (its own prompt: the same params would replay one job by their idempotency key)."""
    reply = stack.submit({"kind": kind, "params": {"prompt": f"e2e {uuid.uuid4().hex}", "sim": sim}})
    assert reply["status"] == "submitted", reply
    (job_id,) = reply["job_ids"]
    return str(job_id)


def schedule_period(stack: DeployedStack) -> float:
    """Real seconds between runs of the scheduled functions (fan-out, sweeps) as their schedules have it on
    the stack's clock: once a clock minute (the deployed schedule fires once a real minute, 20 clock minutes)."""
    return stack.clock.to_real(60)


def alarm_metrics(expected: Created) -> dict[str, set[str]]:
    """Alarm logical id -> the SumePoller metrics (service=sume-poller) it watches, metric math included."""
    watched: dict[str, set[str]] = {}
    for lid, props in resources_of(expected, "AWS::CloudWatch::Alarm").items():
        metrics = [props] + [(m.get("MetricStat") or {}).get("Metric", {}) for m in props.get("Metrics", [])]
        names = {m["MetricName"] for m in metrics if m.get("Namespace") == NAMESPACE}
        for m in metrics:
            if m.get("Namespace") == NAMESPACE:
                assert m.get("Dimensions") == [SERVICE], f"{lid} watches {m['MetricName']} without service=sume-poller"
        if names:
            watched[lid] = names
    return watched


# -- wiring -------------------------------------------------------------------------------------------

def test_functions_layer_and_event_source_are_deployed_as_the_template_says(
        deployed_stack: DeployedStack, expected: Created) -> None:
    lam = deployed_stack.client("lambda")
    functions = expected.functions
    assert set(deployed_stack.functions) == set(functions)
    for lid, spec in functions.items():
        config = lam.get_function_configuration(FunctionName=deployed_stack.functions[lid])
        assert (config["Runtime"], config["Handler"], config["Timeout"], config["MemorySize"]) == (
            spec.runtime, spec.handler, spec.timeout, spec.memory), lid
        assert config["Architectures"] == spec.architectures, lid
        assert [layer["Arn"] for layer in config["Layers"]] == [deployed_stack.outputs["SharedLayerArn"]], lid
        variables = config["Environment"]["Variables"]
        assert set(variables) == set(spec.environment), lid
        for name in ("TIME_SCALE", "LOCAL_ENDPOINTS", "REDIS_URL", "JOBS_TABLE", "POLL_QUEUE_URL"):
            assert variables[name] == {"JOBS_TABLE": deployed_stack.outputs["JobsTableName"],
                                       "POLL_QUEUE_URL": deployed_stack.queue_url}.get(name, spec.environment[name])

    poll_queue_arn = deployed_stack.client("sqs").get_queue_attributes(
        QueueUrl=deployed_stack.queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    event = prop(expected, "PollFunctionPollQueue")  # SAM's event source mapping of the poll function
    (mapping,) = lam.list_event_source_mappings(FunctionName=deployed_stack.functions["PollFunction"])[
        "EventSourceMappings"]
    assert mapping["EventSourceArn"] == poll_queue_arn
    assert mapping["BatchSize"] == int(event["BatchSize"])
    assert mapping["ScalingConfig"]["MaximumConcurrency"] == int(event["ScalingConfig"]["MaximumConcurrency"])
    assert mapping["FunctionResponseTypes"] == event["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert mapping["State"] == "Enabled"


def test_schedules_queues_table_bucket_and_alarms_are_deployed(
        deployed_stack: DeployedStack, expected: Created) -> None:
    c = deployed_stack.client
    for lid in deployed_stack.schedules:
        arn = c("lambda").get_function_configuration(FunctionName=deployed_stack.functions[lid])["FunctionArn"]
        (rule,) = c("events").list_rule_names_by_target(TargetArn=arn)["RuleNames"]
        described = c("events").describe_rule(Name=rule)
        assert (described["ScheduleExpression"], described["State"]) == (expected.schedules[lid], "ENABLED"), lid
    assert deployed_stack.schedules[0] == "FanOutFunction"

    sqs = c("sqs")
    queue = sqs.get_queue_attributes(QueueUrl=deployed_stack.queue_url, AttributeNames=["All"])["Attributes"]
    dlq = sqs.get_queue_attributes(QueueUrl=deployed_stack.dlq_url, AttributeNames=["All"])["Attributes"]
    assert queue["VisibilityTimeout"] == str(prop(expected, "PollQueue", "VisibilityTimeout"))
    assert json.loads(queue["RedrivePolicy"]) == {
        "deadLetterTargetArn": dlq["QueueArn"],
        "maxReceiveCount": int(prop(expected, "PollQueue", "RedrivePolicy", "maxReceiveCount"))}
    assert json.loads(dlq["RedriveAllowPolicy"])["redrivePermission"] == "allowAll"

    table = c("dynamodb").describe_table(TableName=deployed_stack.outputs["JobsTableName"])["Table"]
    assert table["KeySchema"] == prop(expected, "JobsTable", "KeySchema")
    assert table["BillingModeSummary"]["BillingMode"] == prop(expected, "JobsTable", "BillingMode")
    assert {(g["IndexName"], json.dumps(g["KeySchema"])) for g in table["GlobalSecondaryIndexes"]} == {
        (g["IndexName"], json.dumps(g["KeySchema"])) for g in prop(expected, "JobsTable", "GlobalSecondaryIndexes")}
    c("s3").head_bucket(Bucket=deployed_stack.outputs["ResultBucketName"])

    physical = {r["LogicalResourceId"]: r["PhysicalResourceId"] for r in c("cloudformation").describe_stack_resources(
        StackName=deployed_stack.stack_name)["StackResources"]}
    deployed = {a["AlarmName"]: a for a in c("cloudwatch").describe_alarms()["MetricAlarms"]}
    alarms = resources_of(expected, "AWS::CloudWatch::Alarm")
    for lid, alarm in alarms.items():
        found = deployed[physical[lid]]
        assert (found["Namespace"], found["MetricName"]) == (alarm["Namespace"], alarm["MetricName"]), lid
    assert set(expected.outputs) <= set(deployed_stack.outputs)


# -- jobs -------------------------------------------------------------------------------------------

def test_a_sume_stricter_than_the_read_budget_parameter_is_learned_from_its_replies(stack: DeployedStack) -> None:
    """Sume enforces 20 reads a minute where the stack was deployed with ReadsPerMinute=30: the
    RateLimit-* headers of its replies teach the shared limiter the stricter limit (the read
    budget's hash in Redis, which every poller's take reads), under a burst of 30 short jobs.
    Whatever the machine's speed, each job ends once - completed with its result, or timed_out
    at its deadline naming why - and a job seen terminal is never read for status again (the
    livelock this prevents: each retry re-read the status and lost its result fetch to a 429).

    How many 429s the learned limit leaves, and that the burst binds the budget, depend on how
    fast this machine runs the Lambdas on a 20x clock (a read granted at a window's end reaches
    Sume in the next one; a job whose read slot came after its deadline on a busy machine times
    out): those rates are bench figure 8's, on a virtual clock (``make bench``, docs/benchmarks.md).
    """
    warm = submit(stack, {"duration": 1})  # ministack's first Lambda start takes minutes of a 20x clock
    stack.drive(lambda: stack.settled([warm]), timeout=60)
    stack.reset()
    stack.sim.configure(read_budget={"per_minute": 20})
    # One at a time: concurrent submits make ministack start a Lambda container each, and each
    # cold start costs clock minutes on a 20x clock.
    jobs = [submit(stack, {"duration": 1}) for _ in range(30)]

    stack.drive(lambda: stack.settled(jobs) and set(jobs) <= {e["job_id"] for e in stack.events()}, timeout=240)

    budget = stack.budget_state()
    assert (budget["learned_minute"], stack.parameters["ReadsPerMinute"]) == (20, "30"), budget
    records = {r["job_id"]: r for r in stack.records(jobs)}
    by_status = Counter(r["status"] for r in records.values())
    assert set(by_status) <= {"completed", "timed_out"}, by_status
    for r in records.values():
        if r["status"] == "completed":
            assert (r["evidence"], bool(r.get("result_json"))) == ("result_read", True), r
        else:  # its deadline came without a read slot, or before Sume's result was read
            assert r["evidence"] == "deadline" and r["error"]["code"] in ("deadline_exceeded", "result_not_ready"), r
    assert Counter(e["job_id"] for e in stack.events()) == Counter(jobs)  # exactly one terminal event each
    per_job = stack.sim.stats()["jobs"]
    assert {j: per_job[j]["status_reads_after_terminal"] for j in jobs} == dict.fromkeys(jobs, 0)


@pytest.fixture(scope="module")
def every_ending(deployed_stack: DeployedStack) -> tuple[dict[str, str], list[str]]:
    """One run shared by the two tests that follow it (each of its waits is half a minute): a job
    for each terminal status Sume reports, and a burst of 24 videos that outlive JobMaxAgeSeconds
    (30 real seconds): fan-out counts them pending, so sweeps run over them; their reads bind the
    small read budget; they time out. ``(job by outcome, burst)``, once every one is terminal."""
    stack = deployed_stack
    stack.reset()
    jobs = {outcome: submit(stack, {"outcome": outcome, "duration": 3}) for outcome in OUTCOMES}
    # The first video's first read is refused by a proxy's 413 (retried: SumeReadRefused), the next
    # reports a status this project does not know, with terminal: true (not an outcome: read on,
    # UnknownStatus): the metrics of their alarms. A video that never ends, so both are status reads
    # of its own chain whatever the machine's speed (on a job that ends, a sweep may find it finished
    # first and hand it to a result read: neither status read happens).
    odd = {"faults": ["proxy:413"], "status_override": {"status": "finalizing", "reads": 1}, "terminal_flag": True}
    burst = [submit(stack, {"duration": 100_000, **(odd if i == 0 else {})}, kind="video") for i in range(24)]
    stack.drive(lambda: stack.settled([*jobs.values(), *burst]), timeout=120, fanout_every=schedule_period(stack))
    return jobs, burst


def test_jobs_end_in_every_terminal_status_with_exactly_one_event_each(
        deployed_stack: DeployedStack, every_ending: tuple[dict[str, str], list[str]]) -> None:
    stack, (jobs, burst) = deployed_stack, every_ending
    every = [*jobs.values(), *burst]
    stack.drive(lambda: len(stack.events()) >= len(every) and stack.queue_depth() == 0, timeout=30)

    records = {r["job_id"]: r for r in stack.records(every)}
    assert {status: records[job]["status"] for status, job in jobs.items()} == {s: s for s in jobs}
    assert {records[job]["status"] for job in burst} == {"timed_out"}
    assert Counter(e["job_id"] for e in stack.events()) == Counter(every)
    for event in stack.events():
        assert event["status"] == records[event["job_id"]]["status"]
    assert records[jobs["completed"]]["result_json"]
    assert stack.dlq_depth() == 0


def test_every_custom_metric_alarm_watches_a_metric_the_functions_emit(
        deployed_stack: DeployedStack, every_ending: tuple[dict[str, str], list[str]], expected: Created) -> None:
    stack = deployed_stack
    watched = alarm_metrics(expected)
    assert watched, "no alarm on a SumePoller metric: the template changed, update this test"

    def seen() -> set[str]:
        return set(stack.metric_totals())

    def wait_for(names: set[str]) -> None:
        try:
            stack.drive(lambda: names <= seen(), timeout=120, fanout_every=schedule_period(stack))
        except TimeoutError as error:
            raise AssertionError(f"{error}; metrics not emitted: {sorted(names - seen())}; {drain()}; "
                                 f"queue item left: {stack.table.get(item['job_id']) is not None}") from error

    # A deployed key configuration from before the split (format 1: secrets inline) still loads where
    # the functions read it, counted KeyConfigLegacy (each re-reads the list within a minute); the next
    # test's reset stores format 2 again.
    stack.client("secretsmanager").put_secret_value(SecretId=stack.parameters["SumeKeysSecretName"],
                                                    SecretString=json.dumps(stack.key_config(inline=True)))

    # A queued submission past its deadline (this stack's creates are not limited, so none queues by
    # itself), queued as submit queues one - its item and its record in one transaction: a drain that
    # found the item without its record would take it for settled and drop it uncounted - and a drain
    # message: the submit function, through the create queue's event source, records it rejected and
    # counts SubmissionsExpired (the step whose delete removes the queue item counts it: one that settled it
    # and then lost DynamoDB's reply, or its time, leaves the count to the next). Whichever drain takes the
    # key's drain lease runs it - this message's chain, or the one fan-out starts for a queue that holds
    # submissions while the lease is free (a message that finds the lease held is dropped); a drain whose
    # step failed is restarted by fan-out once its claim expires (ClaimTtlSeconds, 60 s: within the wait),
    # where this message would come back only after the create queue's visibility timeout (180 s).
    now = stack.clock.now()
    item = queue_item("default", kind="image", params={"prompt": "e2e expired"}, derived=False,
                      idempotency_key=f"e2e-expired-{uuid.uuid4().hex[:8]}", arrived=now - 120, deadline_at=now - 60)
    assert stack.table.enqueue(item, queued_record(item))
    stack.client("sqs").send_message(QueueUrl=stack.outputs["CreateQueueUrl"],
                                     MessageBody=DrainMessage(new_token(), 0).to_json())

    def settled() -> dict[str, Any] | None:
        record = stack.table.submission("default", item["idempotency_key"])
        return record if record is not None and record["status"] != "queued" else None

    def drain() -> str:
        with redis.Redis.from_url(stack.redis_url) as client:
            lease = client.get(stack.parameters.get("LeaseKeyPrefix", "sume:poll:") + drain_lease("default"))
        depth = queue_depth(stack.client("sqs"), stack.outputs["CreateQueueUrl"])
        return f"drain lease {lease!r}, create queue {depth}"

    try:  # the drain's own record first: a timeout tells a drain that did not run from a metric not seen
        stack.drive(lambda: settled() is not None, timeout=120, fanout_every=schedule_period(stack))
    except TimeoutError as error:
        raise AssertionError(f"the expired submission was not settled ({drain()}): {error}") from error
    expired = settled()
    assert expired is not None and expired["status"] == "rejected", expired
    assert expired["error"]["code"] == "create_budget_exhausted"
    wait_for(set().union(*watched.values()) - {"SumeAuthFailed", "KeyConfigInvalid"})  # the shared run's metrics

    # Last, as it pauses every read: Sume refuses the key for a job registered after the switch, and
    # the key configuration no longer parses where it is read again - by the container the 401 came to,
    # on its next use of the list (after the key's pause: 300 clock s, 15 real s), or by any function
    # whose copy is a minute old - (the last good one is kept; the next test's reset stores it again).
    stack.client("secretsmanager").put_secret_value(SecretId=stack.parameters["SumeKeysSecretName"],
                                                    SecretString='{"keys": {"acme": {"api_key": ""}}}')
    job_id = stack.sim.seed_job("image", {"duration": 100_000})
    stack.sim.configure(api_key="sume_not_the_stored_key")
    assert stack.submit({"kind": "image", "job_id": job_id})["status"] == "registered"
    wait_for({"SumeAuthFailed", "KeyConfigInvalid"} & set().union(*watched.values()))

    emitted = seen()
    missing = {lid: sorted(names - emitted) for lid, names in watched.items() if names - emitted}
    assert not missing, f"alarms on metrics no deployed function emitted: {missing}"


# -- operator commands --------------------------------------------------------------------------------

def test_make_status_reads_the_deployed_stack(stack: DeployedStack, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    done = [submit(stack, {"duration": 2}), submit(stack, {"outcome": "failed", "duration": 2})]
    stack.drive(lambda: stack.settled(done), timeout=60)
    # Submitted once those are settled: pending when status runs, however long they took (submitted before
    # them, a slow machine could pass its JobMaxAgeSeconds, 30 real s here, and record it timed out).
    waiting = submit(stack, {"duration": 100_000})
    monkeypatch.setenv("AWS_ENDPOINT_URL", stack.endpoint_url)
    for name in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)

    assert ops.main(["status", "--stack", stack.stack_name]) == 0

    lines = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
    assert "pending 1" in lines and "terminal 2" in lines
    assert "completed 1" in lines and "failed 1" in lines
    assert any(line.startswith(f"oldest {waiting} (image)") for line in lines), lines
    assert "dead-letter queue 0" in lines

    # make models: each finished job's observation is in its profile's statistics item before its event is
    # cleared, one slot a job (two jobs share one 1 time in 200: the newer wins). Asked again until it shows them
    # (a CI run with one core busy once saw one of the two; each ask is a scan of the deployed table).
    expected = f"static schedule ({len({stats_slot(j) for j in done})} completions"
    shown: list[str] = []

    def image_model() -> bool:
        assert ops.main(["models", "--stack", stack.stack_name]) == 0
        shown[:] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("image ")]
        return any(expected in line for line in shown)

    try:
        stack.drive(image_model, timeout=30)
    except TimeoutError:
        records = [{k: r.get(k) for k in ("status", "submitted_at", "seen_terminal_at")}
                   for r in stack.table.get_many(done).values()]
        raise AssertionError(f"make models never showed {expected!r}: {shown}; records: {records}") from None


def test_redrive_starts_a_message_move_task_from_the_dlq_to_the_poll_queue(deployed_stack: DeployedStack) -> None:
    # Neither moto nor ministack implements StartMessageMoveTask: the request is checked against
    # botocore's Stubber, and the emulator's refusal is turned into a clear error.
    import boto3
    from botocore.stub import Stubber

    sqs = boto3.session.Session(aws_access_key_id="x", aws_secret_access_key="x", region_name="us-east-1").client("sqs")
    dlq_arn, queue_arn = "arn:aws:sqs:us-east-1:123456789012:dlq", "arn:aws:sqs:us-east-1:123456789012:poll"
    with Stubber(sqs) as stub:
        for url, arn in (("https://sqs/dlq", dlq_arn), ("https://sqs/poll", queue_arn)):
            stub.add_response("get_queue_attributes", {"Attributes": {"QueueArn": arn}},
                              {"QueueUrl": url, "AttributeNames": ["QueueArn"]})
        stub.add_response("start_message_move_task", {"TaskHandle": "task-1"},
                          {"SourceArn": dlq_arn, "DestinationArn": queue_arn, "MaxNumberOfMessagesPerSecond": 50})
        assert ops.redrive(sqs, "https://sqs/dlq", "https://sqs/poll", max_per_second=50) == "task-1"
        stub.assert_no_pending_responses()

    with pytest.raises(ops.OpsError, match="does not implement SQS StartMessageMoveTask"):
        ops.redrive(deployed_stack.client("sqs"), deployed_stack.dlq_url, deployed_stack.queue_url)

"""template.yaml's wiring, checked directly (sam validate --lint does not catch everything)."""

from __future__ import annotations

from typing import Any

import pytest

from tools.template import Resolver, function_spec, functions, load_template

T = load_template()
R = T["Resources"]


def props(logical_id: str) -> dict[str, Any]:
    return R[logical_id]["Properties"]


def test_functions_are_python311_arm64_with_the_shared_layer() -> None:
    globals_ = T["Globals"]["Function"]
    assert globals_["Runtime"] == "python3.11" and globals_["Architectures"] == ["arm64"]
    assert R["SharedLayer"]["Metadata"] == {"BuildMethod": "python3.11", "BuildArchitecture": "arm64"}
    resolver = Resolver(T)
    assert sorted(functions(T)) == ["FanOutFunction", "PollFunction", "SubmitFunction"]
    for lid in functions(T):
        spec = function_spec(T, lid, resolver)
        assert spec.handler == "app.lambda_handler" and (spec.code_dir / "app.py").exists()
        assert [d.name for d in spec.layer_dirs] == ["sume_poller"]
        for var in ("JOBS_TABLE", "POLL_QUEUE_URL", "SUME_BASE_URL", "SUME_API_KEY_NAME", "REDIS_URL"):
            assert spec.environment[var]


def test_poll_queue_visibility_is_at_least_six_times_the_poll_timeout_with_a_dlq() -> None:
    queue = props("PollQueue")
    assert queue["VisibilityTimeout"] >= 6 * props("PollFunction")["Timeout"]
    assert queue["RedrivePolicy"]["deadLetterTargetArn"] == {"Fn::GetAtt": ["PollDeadLetterQueue", "Arn"]}
    assert queue["RedrivePolicy"]["maxReceiveCount"] >= 3
    assert queue["MessageRetentionPeriod"] >= 4 * 86400  # chains hop up to 900 s per message


def test_claim_ttl_outlasts_the_poll_function_timeout() -> None:
    params = T["Parameters"]
    assert int(params["ClaimTtlSeconds"]["Default"]) > props("PollFunction")["Timeout"]


def test_poll_function_reads_the_queue_with_partial_batch_responses() -> None:
    event = props("PollFunction")["Events"]["PollQueue"]
    assert event["Type"] == "SQS"
    p = event["Properties"]
    assert p["Queue"] == {"Fn::GetAtt": ["PollQueue", "Arn"]}
    assert p["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert p["BatchSize"] == {"Ref": "PollBatchSize"}
    assert p["ScalingConfig"]["MaximumConcurrency"] == {"Ref": "PollMaxConcurrency"}


def test_fanout_runs_on_a_schedule_from_a_parameter_one_at_a_time() -> None:
    tick = props("FanOutFunction")["Events"]["Tick"]
    assert tick["Type"] == "Schedule" and tick["Properties"]["Schedule"] == {"Ref": "FanOutSchedule"}
    assert props("FanOutFunction")["ReservedConcurrentExecutions"] == 1


def test_jobs_table_is_on_demand_with_pitr_and_a_sparse_pending_index() -> None:
    table = props("JobsTable")
    assert table["BillingMode"] == "PAY_PER_REQUEST"
    assert table["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
    (gsi,) = table["GlobalSecondaryIndexes"]
    assert gsi["IndexName"] == "pending"
    assert [k["AttributeName"] for k in gsi["KeySchema"]] == ["pending_shard", "job_id"]
    # Sparse: pending_shard is not a table key, so items without it are not indexed.
    assert [k["AttributeName"] for k in table["KeySchema"]] == ["job_id"]
    assert set(gsi["Projection"]["NonKeyAttributes"]) == {"kind", "deadline_at"}


def _statements(lid: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for policy in props(lid)["Policies"]:
        out.extend(policy.get("Statement", []))
    return out


@pytest.mark.parametrize("lid,actions,templates", [
    ("FanOutFunction", {"dynamodb:Query"}, {"SQSSendMessagePolicy"}),
    ("PollFunction", {"dynamodb:GetItem", "dynamodb:UpdateItem", "ssm:GetParameter",
                      "secretsmanager:GetSecretValue"}, {"SQSSendMessagePolicy", "EventBridgePutEventsPolicy"}),
    ("SubmitFunction", {"dynamodb:PutItem", "ssm:GetParameter", "secretsmanager:GetSecretValue"},
     {"SQSSendMessagePolicy"}),
])
def test_each_function_gets_only_what_it_uses(lid: str, actions: set[str], templates: set[str]) -> None:
    granted: set[str] = set()
    for statement in _statements(lid):
        acts = statement["Action"]
        granted.update([acts] if isinstance(acts, str) else acts)
        assert "*" not in str(statement["Resource"])  # scoped to named resources
    assert granted == actions
    names = {k for policy in props(lid)["Policies"] for k in policy if k != "Statement"}
    assert names == templates


def test_outputs_name_the_table_queues_and_functions() -> None:
    assert set(T["Outputs"]) >= {"JobsTableName", "PollQueueUrl", "PollDeadLetterQueueUrl", "FanOutFunctionName",
                                 "PollFunctionName", "SubmitFunctionName"}


def test_parameters_cover_the_deployment_knobs() -> None:
    params = T["Parameters"]
    for name in ("SumeBaseUrl", "SumeApiKeyName", "SumeApiKeySource", "RedisUrl", "FanOutSchedule",
                 "PollBatchSize", "PollMaxConcurrency", "SubnetIds", "SecurityGroupIds"):
        assert name in params
    assert params["RedisUrl"]["AllowedPattern"].startswith("^rediss?://")

"""What a production account needs of template.yaml that no emulator checks (round three): alarm
windows AWS accepts, each role reading only the secrets its function uses, the secrets' own KMS
key, terminal events that are retried and dead-lettered instead of dropped, failures that alarm,
Lambda's own log lines, results that fit the poll function's time, data kept on purpose, the VPC's
way to S3 and DynamoDB. Each value is pinned to the AWS documentation page cited beside it.

Read through tests/unit/test_template_real_account.py's helpers (the template created in moto's
CloudFormation, the SAM translation). ``SUME_TEMPLATE=.scratch/old_template.yaml`` points them at
another template, e.g. the one before these fixes (``git show <commit>:template.yaml``).
"""

from __future__ import annotations

import fnmatch
import json
from typing import Any

import pytest
from unit.test_template_real_account import (
    EVERYTHING_ON,
    KEY,
    PARAMETERS,
    REQUIRED,
    RESOURCES,
    TEMPLATE,
    TEMPLATE_PATH,
    TRANSLATED,
    VPC,
    deployed,
    function_props,
    possible_values,
    resolver,
    role_statements,
    violations,
)

from sume_poller.config import settings
from sume_poller.config.keys import API_KEYS, WEBHOOK_SECRETS
from sume_poller.store.records import EXPIRES_AT, UPLOAD_STREAMS
from tools.template import resolve

ACCOUNT, REGION = "123456789012", "us-east-1"  # moto's
FUNCTIONS = ("SubmitFunction", "PollFunction", "FanOutFunction", "SweepFunction", "WebhookFunction", "JobsFunction")


def listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def alarms() -> dict[str, dict[str, Any]]:
    return {lid: r["Properties"] for lid, r in TRANSLATED.items() if r["Type"] == "AWS::CloudWatch::Alarm"}


# -- item 1: every alarm's window is one CloudWatch accepts for its kind ----------------------------------

#: https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/alarm-limits.html - "Only the latest 3
#: hours of data can be used for evaluating the alarm's conditions" (alarms on Metrics Insights queries).
METRICS_INSIGHTS_WINDOW = 3 * 3600
#: https://docs.aws.amazon.com/AmazonCloudWatch/latest/APIReference/API_PutMetricAlarm.html - Period x
#: EvaluationPeriods at most 7 days, and at most one day for periods under an hour.
SHORT_PERIOD_WINDOW, LONG_PERIOD_WINDOW = 86_400, 604_800


def window_problems(lid: str, alarm: dict[str, Any]) -> list[str]:
    queries = [m for m in alarm.get("Metrics", []) if "SELECT" in str(m.get("Expression", ""))]
    periods = [m["Period"] for m in queries] or [alarm.get("Period")]
    problems = []
    for period in periods:
        for evaluations in possible_values(alarm["EvaluationPeriods"]):
            same = alarm.get("DatapointsToAlarm", alarm["EvaluationPeriods"]) == alarm["EvaluationPeriods"]
            for to_alarm in [evaluations] if same else possible_values(alarm["DatapointsToAlarm"]):
                window = int(period) * int(evaluations)
                limit = (METRICS_INSIGHTS_WINDOW if queries else
                         SHORT_PERIOD_WINDOW if int(period) < 3600 else LONG_PERIOD_WINDOW)
                if window > limit or int(to_alarm) > int(evaluations):
                    problems.append(f"{lid}: {period} s x {evaluations} = {window} s > {limit} s")
    return problems


def test_every_alarm_window_is_one_cloudwatch_accepts_for_every_parameter_value() -> None:
    assert "KeyBudgetExhaustedAlarm" in alarms() and "BudgetExhaustedAlarm" in alarms()
    problems = [p for lid, alarm in alarms().items() for p in window_problems(lid, alarm)]
    assert not problems, "\n".join(problems)
    assert PARAMETERS["BudgetAlarmMinutes"]["MaxValue"] * 60 == METRICS_INSIGHTS_WINDOW  # the whole of it, no less


# -- item 2: each role reads only the secrets its function uses ---------------------------------------------

KEYS = "sume/keys"
SECRETS = {"SumeKeysSecretName": KEYS, "RedisSecretName": "redis-user", "Webhooks": "true",
           "SumeApiKeySource": "secretsmanager", "WebhookSecretSource": "secretsmanager",
           "SumeApiKeyName": "/sume-poller/api-key", "WebhookSecretName": "/sume-poller/webhook-secret"}
SSM_SECRETS = {**SECRETS, "SumeApiKeySource": "ssm", "WebhookSecretSource": "ssm"}


def secret_arn(name: str) -> str:
    return f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:{name}-AbCdEf"  # Secrets Manager's 6-character suffix


def parameter_arn(name: str) -> str:
    return f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter{name}"


#: One secret of each kind a function may read, as ARNs (where keys.py and the parameters put them).
KINDS: dict[str, list[tuple[str, str]]] = {
    "key list": [("secretsmanager:GetSecretValue", secret_arn(KEYS))],
    "API keys": [("secretsmanager:GetSecretValue", secret_arn(f"{KEYS}/{API_KEYS}/acme")),
                 ("ssm:GetParameter", parameter_arn(f"/{KEYS}/{API_KEYS}/acme"))],
    "webhook secrets": [("secretsmanager:GetSecretValue", secret_arn(f"{KEYS}/{WEBHOOK_SECRETS}/acme")),
                        ("ssm:GetParameter", parameter_arn(f"/{KEYS}/{WEBHOOK_SECRETS}/acme"))],
    "default API key": [("secretsmanager:GetSecretValue", secret_arn("/sume-poller/api-key")),
                        ("ssm:GetParameter", parameter_arn("/sume-poller/api-key"))],
    "default webhook secret": [("secretsmanager:GetSecretValue", secret_arn("/sume-poller/webhook-secret")),
                               ("ssm:GetParameter", parameter_arn("/sume-poller/webhook-secret"))],
    "Redis user": [("secretsmanager:GetSecretValue", secret_arn("redis-user"))],
    # A secret next to the key list that no function uses (format 1's api_key_from could point there).
    "elsewhere under the key list": [("secretsmanager:GetSecretValue", secret_arn(f"{KEYS}/acme")),
                                     ("ssm:GetParameter", parameter_arn(f"/{KEYS}/acme"))],
}
CALLS_SUME = {"key list", "API keys", "default API key", "Redis user"}
#: What each function uses (keys.py: a secret is read only by the function that calls it).
USES: dict[str, set[str]] = {
    "SubmitFunction": CALLS_SUME, "PollFunction": CALLS_SUME, "SweepFunction": CALLS_SUME,
    "FanOutFunction": {"key list", "Redis user"},  # ids and limits: no Sume call
    "WebhookFunction": {"key list", "webhook secrets", "default webhook secret", "Redis user"},
    "JobsFunction": set(),
}


def readable(statements: list[dict[str, Any]]) -> set[str]:
    """The kinds of secret a role's statements let it read (any of a kind's ARNs), as IAM matches them."""
    allowed = [(action, resource) for s in statements if s["Effect"] == "Allow"
               for action in listed(s["Action"]) for resource in listed(s["Resource"])]
    return {kind for kind, arns in KINDS.items()
            if any(action == wanted and fnmatch.fnmatchcase(arn, resource.replace("?", "[!/]") if "?" in resource
                                                            else resource)
                   for wanted, arn in arns for action, resource in allowed)}


@pytest.mark.parametrize("overrides", [SECRETS, SSM_SECRETS], ids=["secretsmanager", "ssm"])
def test_each_role_reads_only_the_secrets_its_function_uses(overrides: dict[str, str]) -> None:
    """The internet-facing webhook function and fan-out never read an API key; only the webhook
    function reads webhook signing secrets (docs/ or README "Many keys": the key list's format 2)."""
    r = resolver(**overrides)
    assert set(r.functions) == set(FUNCTIONS)
    can = {function: readable(role_statements(r, function)) for function in FUNCTIONS}
    assert can == USES


# -- item 3: the secrets' own KMS key --------------------------------------------------------------------

SECRETS_KEY = "arn:aws:kms:us-east-1:123456789012:key/abcd1234-ab12-cd34-ef56-abcdef123456"


def test_with_a_secrets_key_every_function_that_reads_a_secret_may_decrypt_it_through_those_services_only() -> None:
    """A secret under a customer-managed key needs kms:Decrypt by the reader, through the service
    (https://docs.aws.amazon.com/secretsmanager/latest/userguide/security-encryption.html)."""
    spec = PARAMETERS["SecretsKmsKeyArn"]
    assert spec["Default"] == "" and "AllowedPattern" in spec
    r = resolver(**SECRETS, SecretsKmsKeyArn=SECRETS_KEY, KmsKeyArn=KEY)
    for function in FUNCTIONS:
        decrypts = [s for s in role_statements(r, function) if SECRETS_KEY in listed(s["Resource"])]
        if not USES[function]:
            assert not decrypts, function
            continue
        (statement,) = decrypts
        assert listed(statement["Action"]) == ["kms:Decrypt"], function
        assert statement["Condition"] == {"StringEquals": {"kms:ViaService": [
            f"secretsmanager.{REGION}.amazonaws.com", f"ssm.{REGION}.amazonaws.com"]}}, function
    assert not any(SECRETS_KEY in json.dumps(role_statements(resolver(**SECRETS), f)) for f in FUNCTIONS)


# -- item 4: terminal events retried for a day, then dead-lettered per rule --------------------------------

TARGET = "arn:aws:lambda:us-east-1:123456789012:function:consumer"
#: https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-rule-retry-policy.html - retries for 24 hours
#: and up to 185 times, then the event is dropped unless the target has a dead-letter queue
#: (https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-rule-dlq.html); MaximumEventAgeInSeconds
#: 60..86400, MaximumRetryAttempts 0..185 (API RetryPolicy).
MAX_EVENT_AGE, MAX_RETRIES = 86_400, 185
RULES = {"TerminalEventsToQueueRule": ("TerminalEventsQueueDeadLetterQueue", "TerminalEventsQueueDeadLetterAlarm",
                                       "TerminalEventsQueueFailedAlarm"),
         "TerminalEventsToTargetRule": ("TerminalEventsTargetDeadLetterQueue", "TerminalEventsTargetDeadLetterAlarm",
                                        "TerminalEventsTargetFailedAlarm")}


@pytest.mark.parametrize("role", ["", "arn:aws:iam::123456789012:role/their-delivery-role"], ids=["own", "given"])
def test_each_terminal_event_rule_retries_a_day_then_dead_letters_to_its_own_alarmed_queue(role: str) -> None:
    outputs = {f"{lid}Arn": {"Fn::GetAtt": [lid, "Arn"]} for lid in RULES}
    outputs |= {f"{queue}Arn": {"Fn::GetAtt": [queue, "Arn"]} for queue, _, _ in RULES.values()}
    outputs |= {f"{queue}Name": {"Fn::GetAtt": [queue, "QueueName"]} for queue, _, _ in RULES.values()}
    r = resolve({**REQUIRED, **EVERYTHING_ON, "TerminalEventsTargetArn": TARGET, "TerminalEventsTargetRoleArn": role},
                TEMPLATE_PATH, outputs=outputs)
    policies = deployed(r, "AWS::SQS::QueuePolicy")
    queues = set()
    for rule, (queue, depth_alarm, failed_alarm) in RULES.items():
        (target,) = r.properties[rule]["Targets"]
        assert target["RetryPolicy"] == {"MaximumEventAgeInSeconds": MAX_EVENT_AGE, "MaximumRetryAttempts": MAX_RETRIES}
        dlq = r.outputs[f"{queue}Arn"]
        assert target["DeadLetterConfig"] == {"Arn": dlq}, rule
        queues.add(dlq)
        # EventBridge sends to the DLQ as events.amazonaws.com, only for this rule (the DLQ page's policy).
        (statement,) = [s for p in policies.values() for s in p["PolicyDocument"]["Statement"] if s["Resource"] == dlq]
        assert (statement["Principal"], statement["Action"]) == ({"Service": "events.amazonaws.com"}, "sqs:SendMessage")
        assert statement["Condition"] == {"ArnEquals": {"aws:SourceArn": r.outputs[f"{rule}Arn"]}}
        assert int(r.properties[queue]["MessageRetentionPeriod"]) == 14 * 86400
        alarm = RESOURCES[depth_alarm]["Properties"]
        assert alarm["MetricName"] == "ApproximateNumberOfMessagesVisible"
        assert alarm["Dimensions"] == [{"Name": "QueueName", "Value": {"Fn::GetAtt": [queue, "QueueName"]}}]
        failed = RESOURCES[failed_alarm]["Properties"]
        assert (failed["Namespace"], failed["MetricName"]) == ("AWS/Events", "FailedInvocations")
        assert RESOURCES[failed_alarm]["Condition"] == RESOURCES[rule]["Condition"] == RESOURCES[queue]["Condition"]
    assert len(queues) == 2  # a redrive of one rule's DLQ reaches that rule's target alone
    (target,) = r.properties["TerminalEventsToTargetRule"]["Targets"]
    if role:
        assert target["RoleArn"] == role and "TerminalEventsTargetRole" not in r.properties
    else:
        # https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-use-resource-based.html: EventBridge may
        # deliver to Lambda, SNS and SQS with an execution role, and needs one for the other types here.
        own = r.properties["TerminalEventsTargetRole"]
        assert target["RoleArn"].endswith(f":role/{r['TerminalEventsTargetRole']}")
        (trust,) = own["AssumeRolePolicyDocument"]["Statement"]
        assert trust["Principal"] == {"Service": "events.amazonaws.com"}
        (deliver,) = own["Policies"][0]["PolicyDocument"]["Statement"]
        assert deliver["Resource"] == TARGET  # that one target, nothing else
        assert {"lambda:InvokeFunction", "sqs:SendMessage", "sns:Publish"} <= set(deliver["Action"])
    stack_outputs = TEMPLATE["Outputs"]
    assert {"TerminalEventsQueueDeadLetterQueueUrl", "TerminalEventsTargetDeadLetterQueueUrl",
            "TerminalEventsTargetArn", "TerminalEventsQueueUrl"} <= set(stack_outputs)  # what make redrive reads


def test_a_rule_on_a_custom_bus_is_watched_by_its_bus_and_rule_name() -> None:
    """AWS/Events metrics of a rule on a custom bus carry EventBusName and RuleName; its Ref is
    "<bus>|<rule>" (https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-monitoring.html)."""
    alarm = RESOURCES["TerminalEventsTargetFailedAlarm"]["Properties"]
    default_bus, custom_bus = alarm["Dimensions"]["Fn::If"][1:]
    assert alarm["Dimensions"]["Fn::If"][0] == "DefaultBus"
    assert default_bus == [{"Name": "RuleName", "Value": {"Ref": "TerminalEventsToTargetRule"}}]
    assert custom_bus == [{"Name": "EventBusName", "Value": {"Ref": "EventBusName"}},
                          {"Name": "RuleName", "Value": {"Fn::Select": [1, {"Fn::Split": [
                              "|", {"Ref": "TerminalEventsToTargetRule"}]}]}}]


# -- item 5: failures an operator must act on alarm; what needs no one does not ------------------------------

def test_every_function_alarms_on_its_errors_and_throttles() -> None:
    watched = {(a["MetricName"], a["Dimensions"][0]["Value"]["Ref"]) for a in alarms().values()
               if a.get("Namespace") == "AWS/Lambda"}
    missing = {(metric, f) for f in FUNCTIONS for metric in ("Errors", "Throttles")} - watched
    assert not missing, sorted(missing)
    for lid in ("SweepErrorsAlarm", "WebhookErrorsAlarm"):  # created with their function
        function = RESOURCES[lid]["Properties"]["Dimensions"][0]["Value"]["Ref"]
        assert RESOURCES[lid]["Condition"] == RESOURCES[function]["Condition"]


def test_a_failed_submit_is_alarmed_and_a_stale_tick_is_kept_a_day_unalarmed() -> None:
    submit = function_props("SubmitFunction")["DeadLetterConfig"]["TargetArn"]
    assert submit == {"Fn::GetAtt": ["FailedSubmitsQueue", "Arn"]}  # a lost submission is not a stale tick
    for function in ("FanOutFunction", "SweepFunction"):
        assert function_props(function)["DeadLetterConfig"]["TargetArn"] == {"Fn::GetAtt": ["FailedInvocationsQueue",
                                                                                            "Arn"]}
    depth = {a["Dimensions"][0]["Value"]["Fn::GetAtt"][0] for a in alarms().values()
             if a.get("MetricName") == "ApproximateNumberOfMessagesVisible"}
    assert "FailedSubmitsQueue" in depth and "FailedInvocationsQueue" not in depth
    retention = RESOURCES["FailedInvocationsQueue"]["Properties"]["MessageRetentionPeriod"]
    assert retention == 86_400


# -- item 6: Lambda's START and REPORT lines ----------------------------------------------------------------

def test_every_function_keeps_lambdas_start_and_report_lines() -> None:
    """START and REPORT (duration, billed duration, max memory, init duration) are INFO-level system
    logs; WARN drops them (https://docs.aws.amazon.com/lambda/latest/dg/monitoring-cloudwatchlogs-log-level.html)."""
    for lid in FUNCTIONS:
        assert function_props(lid)["LoggingConfig"]["SystemLogLevel"] == "INFO", lid


# -- item 7: a result the poll function can stream in its time ------------------------------------------------

def test_the_largest_result_streams_within_the_poll_functions_timeout_at_the_stated_throughput() -> None:
    spec = PARAMETERS["ResultMaxMegabytes"]
    timeout = int(function_props("PollFunction")["Timeout"])
    assert timeout == settings.POLL_FUNCTION_TIMEOUT_SECONDS
    assert UPLOAD_STREAMS == settings.RESULT_UPLOAD_STREAMS
    # a fresh invocation's time less the batch's safety margin (3 s) and the time after a read (3 s)
    assert timeout - 3 - 3 >= settings.RESULT_STREAM_SECONDS
    assert spec["MaxValue"] == settings.RESULT_MAX_MEGABYTES_MAX == (
        settings.RESULT_STREAM_SECONDS * settings.RESULT_STREAM_MB_PER_SECOND // UPLOAD_STREAMS)
    assert spec["MinValue"] <= spec["Default"] <= spec["MaxValue"]
    assert f"{settings.RESULT_STREAM_MB_PER_SECOND} MB/s" in spec["Description"]


# -- items 8 and 9: data kept on purpose ----------------------------------------------------------------------

def test_the_table_refuses_a_delete_from_outside_cloudformation_too() -> None:
    """DeletionPolicy Retain covers the stack's delete only; deletion protection refuses any DeleteTable
    (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/WorkingWithTables.Basics.html#WorkingWithTables.Basics.DeletionProtection)."""
    table = RESOURCES["JobsTable"]
    assert table["Properties"]["DeletionProtectionEnabled"] is True and table["DeletionPolicy"] == "Retain"


@pytest.mark.parametrize("days", ["0", "1", "90", "3650"])
def test_finished_jobs_and_their_results_expire_after_the_retention(days: str) -> None:
    """TTL on the attribute the store sets once a record's outbox is clear (a record still owing its
    event never has it); S3 expires results, and noncurrent versions a day later: in a versioned bucket
    an expiration only adds a delete marker
    (https://docs.aws.amazon.com/AmazonS3/latest/userguide/lifecycle-expire-general-considerations.html)."""
    spec = PARAMETERS["RetentionDays"]
    assert (spec["Default"], spec["MinValue"], spec["MaxValue"]) == (0, 0, settings.RETENTION_DAYS_MAX)
    r = resolver(RetentionDays=days)
    ttl = r.properties["JobsTable"]["TimeToLiveSpecification"]
    assert ttl == {"AttributeName": EXPIRES_AT, "Enabled": True}  # items without it never expire
    for lid, function in r.functions.items():
        assert function.environment["RETENTION_DAYS"] == days, lid
    rules = [rule for rule in r.properties["ResultBucket"]["LifecycleConfiguration"]["Rules"] if rule]
    expiring = [rule for rule in rules if "ExpirationInDays" in rule and not rule.get("TagFilters")]
    if days == "0":
        assert not expiring  # kept forever
    else:
        (rule,) = expiring
        assert rule["Status"] == "Enabled" and rule["Prefix"] == "results/"
        assert int(rule["ExpirationInDays"]) == int(days)
        assert rule["NoncurrentVersionExpiration"] == {"NoncurrentDays": 1}


# -- item 10: S3 and DynamoDB from inside the VPC without the NAT --------------------------------------------

ROUTES = {"VpcId": "vpc-0123456789abcdef0", "S3EndpointRouteTableIds": "rtb-11111111,rtb-22222222",
          "DynamoDbEndpointRouteTableIds": "rtb-22222222"}


def test_gateway_endpoints_are_made_where_asked_and_the_jobs_function_stays_out_of_the_vpc() -> None:
    """Gateway endpoints route S3 and DynamoDB through the route tables, not the NAT gateway
    (https://docs.aws.amazon.com/vpc/latest/privatelink/gateway-endpoints.html); a route table takes
    one per service, so each service has its own list (one already routed is left out of it). Read
    from the template: moto creates an endpoint only in a VPC it made."""
    conditions = TEMPLATE["Conditions"]
    for lid, service, routes in (("S3GatewayEndpoint", "s3", "S3EndpointRouteTableIds"),
                                 ("DynamoDbGatewayEndpoint", "dynamodb", "DynamoDbEndpointRouteTableIds")):
        resource = RESOURCES[lid]
        props = resource["Properties"]
        assert resource["Type"] == "AWS::EC2::VPCEndpoint" and props["VpcEndpointType"] == "Gateway"
        assert props["ServiceName"] == {"Fn::Sub": f"com.amazonaws.${{AWS::Region}}.{service}"}
        assert (props["VpcId"], props["RouteTableIds"]) == ({"Ref": "VpcId"}, {"Ref": routes})
        # made only with a VPC and route tables for that service
        assert conditions[resource["Condition"]] == {"Fn::And": [
            {"Fn::Not": [{"Fn::Equals": [{"Ref": "VpcId"}, ""]}]},
            {"Fn::Not": [{"Fn::Equals": [{"Fn::Join": ["", {"Ref": routes}]}, ""]}]}]}
        assert "AllowedPattern" in PARAMETERS[routes]
    # the jobs function reads the table and the bucket, never Redis: no VPC, no ENI, no NAT
    assert "VpcConfig" not in function_props("JobsFunction") and "VpcConfig" not in TEMPLATE["Globals"]["Function"]
    assert all("VpcConfig" in function_props(f) for f in FUNCTIONS if f != "JobsFunction")
    jobs_role = resolver(**VPC).properties["JobsFunctionRole"]
    assert not [arn for arn in jobs_role.get("ManagedPolicyArns", []) if "VPCAccess" in arn]


@pytest.mark.parametrize("empty", [[], [""]], ids=["empty-is-no-members", "empty-is-one-empty-member"])
def test_route_tables_need_the_vpc_and_the_vpc_needs_the_subnets(empty: list[str]) -> None:
    assert [v.split(":")[0] for v in violations({**VPC, "S3EndpointRouteTableIds": "rtb-11111111"}, empty)] == [
        "GatewayEndpointsInTheVpc"]
    assert [v.split(":")[0] for v in violations({"VpcId": "vpc-0123456789abcdef0"}, empty)] == [
        "GatewayEndpointsInTheVpc"]
    assert violations({**VPC, **ROUTES}, empty) == []


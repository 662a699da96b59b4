"""What a real AWS account requires of template.yaml that the emulators and linters let through
(issue "Real-account truth, round two"): enumerated properties within what AWS documents, for
every value their parameters allow; queue encryption a service can send to; the template's Rules;
the roles SAM would generate; the bucket, table and queue settings an operator of a paid pipeline
wants. Everything is read from the template (and samconfig.toml): what it resolves to from the
stack moto's CloudFormation creates of it (tools.template.resolve: every resource's properties,
the functions' configuration, outputs added for a value to resolve); the shape of what SAM makes of
it from the translated template.

``SUME_TEMPLATE`` and ``SUME_SAMCONFIG`` (paths) point these tests at another template or
samconfig.toml, e.g. older ones: ``git show HEAD~5:template.yaml > /tmp/old.yaml;
SUME_TEMPLATE=/tmp/old.yaml pytest ...``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from sume_poller.config import settings
from sume_poller.creates.submit import SubmitSettings
from tools.template import Created, load, resolve

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE_PATH = Path(os.environ.get("SUME_TEMPLATE") or ROOT / "template.yaml")
SAMCONFIG_PATH = Path(os.environ.get("SUME_SAMCONFIG") or ROOT / "samconfig.toml")
TEMPLATE = load(TEMPLATE_PATH)
PARAMETERS: dict[str, Any] = TEMPLATE["Parameters"]
RESOURCES: dict[str, Any] = TEMPLATE["Resources"]
REQUIRED = {"RedisUrl": "rediss://cache.example:6379"}  # the one parameter without a default
KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
VPC = {"SubnetIds": "subnet-a,subnet-b", "SecurityGroupIds": "sg-1"}
EVERYTHING_ON = {"Webhooks": "true", "Sweeps": "true", "CreateTerminalEventsQueue": "true"}
NO_VALUE = object()


#: Values the tests compare with, added to the template's outputs: moto resolves them in the same stack.
EXPRESSIONS: dict[str, Any] = {
    "StackName": {"Ref": "AWS::StackName"},
    "ResultBucketArn": {"Fn::GetAtt": ["ResultBucket", "Arn"]},
    "ResultsArn": {"Fn::Sub": "${ResultBucket.Arn}/results/*"},
    "FailedInvocationsQueueArn": {"Fn::GetAtt": ["FailedInvocationsQueue", "Arn"]},
    # (a template from before the submit function's own dead-letter queue has none: SUME_TEMPLATE)
    **({"FailedSubmitsQueueArn": {"Fn::GetAtt": ["FailedSubmitsQueue", "Arn"]}} if "FailedSubmitsQueue" in RESOURCES
       else {}),
    **{f"{group}Arn": {"Fn::GetAtt": [group, "Arn"]}
       for group in ("SubmitLogGroup", "PollLogGroup", "FanOutLogGroup", "SweepLogGroup", "WebhookLogGroup",
                     "JobsLogGroup")},
    **{f"{function}Arn": {"Fn::GetAtt": [function, "Arn"]} for function in ("SubmitFunction", "JobsFunction")},
    "JobsTableArn": {"Fn::GetAtt": ["JobsTable", "Arn"]},
}


def resolver(**overrides: str) -> Created:
    """The template created in moto's in-memory CloudFormation with these parameters (everything on)."""
    return resolve({**REQUIRED, **EVERYTHING_ON, **overrides}, TEMPLATE_PATH, outputs=EXPRESSIONS)


#: The template after the SAM transform (Globals merged into each AWS::Lambda::Function), unresolved.
TRANSLATED: dict[str, Any] = resolver().translated["Resources"]


def function_props(lid: str) -> dict[str, Any]:
    """A function's properties as SAM makes them (Globals merged), unresolved."""
    props: dict[str, Any] = TRANSLATED[lid]["Properties"]
    return props


def deployed(r: Created, resource_type: str) -> dict[str, Any]:
    """Logical id -> resolved properties, for the resources of a type whose Condition holds."""
    if resource_type == "AWS::Serverless::Function":
        return {lid: r.properties[lid] for lid in r.functions}
    return {lid: r.properties[lid] for lid in r.of_type(resource_type)}


def at(value: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return NO_VALUE
        value = value[key]
    return value


# -- which parameters feed a value, and every value each allows ---------------------------------------

def allowed_values(name: str) -> list[str]:
    """Every value a parameter allows (AllowedValues), or its bounds and default (numbers), or its
    default (patterns and lists): what an enumerated property must hold for."""
    spec = PARAMETERS[name]
    if "AllowedValues" in spec:
        return [str(v) for v in spec["AllowedValues"]]
    values = [spec.get("MinValue"), spec.get("Default"), spec.get("MaxValue")]
    if name in REQUIRED:
        values.append(REQUIRED[name])
    return sorted({str(v) for v in values if v is not None})


def possible_values(value: Any) -> Iterator[Any]:
    """Every value an enumerated property can take - a literal, each value its parameter allows, or
    either branch of an Fn::If (more than the conditions let through, never less). Anything else
    comes out as it is, and fails its check."""
    if isinstance(value, dict) and set(value) == {"Ref"} and value["Ref"] in PARAMETERS:
        yield from allowed_values(value["Ref"])
    elif isinstance(value, dict) and value == {"Ref": "AWS::NoValue"}:
        yield NO_VALUE
    elif isinstance(value, dict) and set(value) == {"Fn::If"}:
        yield from possible_values(value["Fn::If"][1])
        yield from possible_values(value["Fn::If"][2])
    else:
        yield value


# -- item 11: enumerated properties hold what AWS documents -------------------------------------------

LAMBDA_LOG_LEVELS = ["TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL"]  # ApplicationLogLevel, in order
# Lambda's Python runtimes not deprecated by 2026-12 (3.10's deprecation date is 2026-06-30).
PYTHON_RUNTIMES = {"python3.11", "python3.12", "python3.13", "python3.14"}
ARCHITECTURES = {"x86_64", "arm64"}
LOG_RETENTION_DAYS = {1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922,
                      3288, 3653}


def between(low: int, high: int) -> Any:
    return lambda v: low <= int(v) <= high


#: Lambda properties (Globals merged, as SAM makes them) -> what AWS accepts. Every
#: ApplicationLogLevel above INFO drops the EMF metric lines (they carry no level): INFO at most.
FUNCTION_CHECKS: dict[tuple[str, ...], Any] = {
    ("LoggingConfig", "ApplicationLogLevel"):
        lambda v: v in LAMBDA_LOG_LEVELS and LAMBDA_LOG_LEVELS.index(v) <= LAMBDA_LOG_LEVELS.index("INFO"),
    ("LoggingConfig", "SystemLogLevel"): lambda v: v in {"DEBUG", "INFO", "WARN"},
    ("LoggingConfig", "LogFormat"): lambda v: v in {"Text", "JSON"},
    ("Runtime",): lambda v: v in PYTHON_RUNTIMES,
    ("Architectures",): lambda v: isinstance(v, list) and len(v) == 1 and v[0] in ARCHITECTURES,
    ("TracingConfig", "Mode"): lambda v: v in {"Active", "PassThrough", "Disabled"},
    ("Timeout",): between(1, 900),
    ("MemorySize",): between(128, 10240),
    ("ReservedConcurrentExecutions",): between(0, 100_000),
}
#: What SAM makes of a function's EventInvokeConfig and SQS event: resources of their own.
INVOKE_CONFIG_CHECKS: dict[tuple[str, ...], Any] = {
    ("MaximumEventAgeInSeconds",): between(60, 21600),
    ("MaximumRetryAttempts",): between(0, 2),
}
MAPPING_CHECKS: dict[tuple[str, ...], Any] = {
    ("BatchSize",): between(1, 10),  # 10: no batching window
    ("ScalingConfig", "MaximumConcurrency"): between(2, 1000),
}
QUEUE_CHECKS: dict[tuple[str, ...], Any] = {
    ("MessageRetentionPeriod",): between(60, 1_209_600),
    ("VisibilityTimeout",): between(0, 43_200),
    ("RedrivePolicy", "maxReceiveCount"): between(1, 1000),
    ("SqsManagedSseEnabled",): lambda v: v in (True, "true"),
}
LOG_GROUP_CHECKS: dict[tuple[str, ...], Any] = {("RetentionInDays",): lambda v: int(v) in LOG_RETENTION_DAYS}
LAYER_CHECKS: dict[tuple[str, ...], Any] = {
    ("CompatibleRuntimes",): lambda v: set(v) <= PYTHON_RUNTIMES,
    ("CompatibleArchitectures",): lambda v: set(v) <= ARCHITECTURES,
}
ALARM_CHECKS: dict[tuple[str, ...], Any] = {
    ("Period",): lambda v: int(v) in (10, 30) or int(v) % 60 == 0,
    ("EvaluationPeriods",): between(1, 100_000),
}


def checked_values() -> Iterator[tuple[str, tuple[str, ...], Any, Any]]:
    """(where, path, raw value, check) for every enumerated property the template sets (as SAM
    translates it: Globals merged, a function's events and invoke config resources of their own)."""
    table = {"AWS::Lambda::Function": FUNCTION_CHECKS, "AWS::SQS::Queue": QUEUE_CHECKS,
             "AWS::Logs::LogGroup": LOG_GROUP_CHECKS, "AWS::Lambda::LayerVersion": LAYER_CHECKS,
             "AWS::CloudWatch::Alarm": ALARM_CHECKS, "AWS::Lambda::EventInvokeConfig": INVOKE_CONFIG_CHECKS,
             "AWS::Lambda::EventSourceMapping": MAPPING_CHECKS}
    for lid, resource in TRANSLATED.items():
        for path, check in table.get(resource["Type"], {}).items():
            yield lid, path, at(resource.get("Properties") or {}, path), check


def test_every_enumerated_property_holds_what_aws_documents_for_every_parameter_value() -> None:
    bad = []
    count = 0
    for lid, path, raw, check in checked_values():
        if raw is NO_VALUE:
            continue
        for value in possible_values(raw):
            count += 1
            if value is not NO_VALUE and not check(value):
                bad.append(f"{lid}.{'.'.join(path)} = {value!r}")
    assert count > 50
    assert not bad, "\n".join(sorted(set(bad)))


def test_log_level_is_one_name_lambda_powertools_and_python_share() -> None:
    assert PARAMETERS["LogLevel"]["AllowedValues"] == ["DEBUG", "INFO", "WARN", "ERROR"]
    for value in PARAMETERS["LogLevel"]["AllowedValues"]:
        r = resolver(LogLevel=value)
        for lid, function in r.functions.items():
            assert function.environment["POWERTOOLS_LOG_LEVEL"] == value, lid  # applied inside the functions
            application = r.properties[lid]["LoggingConfig"]["ApplicationLogLevel"]
            assert application == ("DEBUG" if value == "DEBUG" else "INFO"), lid  # never filters a metric line
        assert value in logging.getLevelNamesMapping()


# -- item 12: every queue can be sent to; the key's users are granted -----------------------------------

QUEUES = ("PollQueue", "PollDeadLetterQueue", "CreateQueue", "CreateDeadLetterQueue", "FailedInvocationsQueue",
          "FailedSubmitsQueue", "TerminalEventsQueue", "TerminalEventsQueueDeadLetterQueue")


@pytest.mark.parametrize("key", ["", KEY], ids=["sse-sqs", "cmk"])
def test_no_queue_uses_the_aws_managed_sqs_key_and_without_a_key_every_queue_has_sse_sqs(key: str) -> None:
    r = resolver(KmsKeyArn=key)
    queues = deployed(r, "AWS::SQS::Queue")
    assert set(queues) == set(QUEUES)
    for lid, props in queues.items():
        assert "alias/aws/sqs" not in json.dumps(props), lid
        if key:
            assert props.get("KmsMasterKeyId") == key and "SqsManagedSseEnabled" not in props, lid
        else:
            assert props.get("SqsManagedSseEnabled") in (True, "true") and "KmsMasterKeyId" not in props, lid


def role_statements(r: Created, function: str) -> list[dict[str, Any]]:
    """The inline statements of a function's role, resolved (the template's own roles)."""
    role = function_props(function).get("Role")
    assert role == {"Fn::GetAtt": [f"{function}Role", "Arn"]}, f"{function} has no role of the template's own"
    props = r.properties[f"{function}Role"]
    return [s for policy in props.get("Policies", []) for s in policy["PolicyDocument"]["Statement"]]


def grants(statements: list[dict[str, Any]], action: str, resource: str) -> bool:
    def listed(value: Any) -> list[str]:
        return value if isinstance(value, list) else [value]

    return any(s["Effect"] == "Allow" and action in listed(s["Action"]) and resource in listed(s["Resource"])
               for s in statements)


def test_with_a_key_every_function_may_use_it_for_its_queues_and_dead_letters() -> None:
    r = resolver(KmsKeyArn=KEY)
    for function in deployed(r, "AWS::Serverless::Function"):
        statements = role_statements(r, function)
        assert grants(statements, "kms:GenerateDataKey", KEY), function  # sends (Lambda's DLQ sends as the role)
        assert grants(statements, "kms:Decrypt", KEY), function
        # each function's asynchronous-invocation dead-letter queue (a failed submit has its own)
        failed = r.outputs["FailedSubmitsQueueArn" if function == "SubmitFunction" else "FailedInvocationsQueueArn"]
        assert grants(statements, "sqs:SendMessage", failed), function
    without = resolver()
    assert not any("kms:" in json.dumps(role_statements(without, f))
                   for f in deployed(without, "AWS::Serverless::Function"))


# -- item 13 and 10(d): the Rules ---------------------------------------------------------------------

RULE_FUNCTIONS = {"Ref", "Fn::And", "Fn::Contains", "Fn::EachMemberEquals", "Fn::EachMemberIn", "Fn::Equals",
                  "Fn::Not", "Fn::Or", "Fn::RefAll", "Fn::ValueOf", "Fn::ValueOfAll"}


def rule_parameters(overrides: Mapping[str, str], empty_list: list[str]) -> dict[str, Any]:
    """Parameter values as a rule sees them: lists for CommaDelimitedList (``empty_list`` for "")."""
    values: dict[str, Any] = {}
    for name, spec in PARAMETERS.items():
        raw = str(overrides.get(name, spec.get("Default", "")))
        if spec["Type"] == "CommaDelimitedList":
            values[name] = [m.strip() for m in raw.split(",")] if raw else list(empty_list)
        else:
            values[name] = raw
    return values


def evaluate(node: Any, values: Mapping[str, Any]) -> Any:
    """The rule functions this template uses, as CloudFormation documents them."""
    if isinstance(node, list):
        return [evaluate(item, values) for item in node]
    if not isinstance(node, dict):
        return str(node)
    ((function, args),) = node.items()
    if function == "Ref":
        return values[args]
    if function == "Fn::Equals":
        return evaluate(args[0], values) == evaluate(args[1], values)
    if function == "Fn::Not":
        return not evaluate(args[0], values)
    if function == "Fn::And":
        return all(evaluate(a, values) for a in args)
    if function == "Fn::Or":
        return any(evaluate(a, values) for a in args)
    if function == "Fn::Contains":
        return evaluate(args[1], values) in evaluate(args[0], values)
    if function == "Fn::EachMemberEquals":
        return all(m == evaluate(args[1], values) for m in evaluate(args[0], values))
    raise AssertionError(f"{function} is not evaluated here")


def violations(overrides: Mapping[str, str], empty_list: list[str]) -> list[str]:
    values = rule_parameters({**REQUIRED, **overrides}, empty_list)
    found = []
    for name, rule in (TEMPLATE.get("Rules") or {}).items():
        if "RuleCondition" in rule and not evaluate(rule["RuleCondition"], values):
            continue
        found += [f"{name}: {a.get('AssertDescription')}" for a in rule["Assertions"]
                  if not evaluate(a["Assert"], values)]
    return found


def functions_used(node: Any) -> set[str]:
    if isinstance(node, list):
        return set().union(*(functions_used(n) for n in node)) if node else set()
    if isinstance(node, dict):
        return {k for k in node if k == "Ref" or k.startswith("Fn::")} | functions_used(list(node.values()))
    return set()


def samconfig_parameters(env: str) -> dict[str, str]:
    """``parameter_overrides`` of a samconfig.toml environment, where every command reads them."""
    config = tomllib.loads(SAMCONFIG_PATH.read_text())[env]
    overrides = config["global"]["parameters"]["parameter_overrides"]
    assert "parameter_overrides" not in config.get("deploy", {}).get("parameters", {}), env
    return dict(item.split("=", 1) for item in overrides)


#: samconfig.toml's dev environment before this fix: a VPC-only Redis without the VPC.
OLD_DEV = {"RedisUrl": "rediss://REPLACE-ME-dev-redis-endpoint:6379", "RedisMode": "cluster",
           "SumeApiKeyName": "/sume-poller/dev/api-key", "LogRetentionDays": "14"}
EMPTY_LISTS = pytest.mark.parametrize("empty", [[], [""]], ids=["empty-is-no-members", "empty-is-one-empty-member"])


def test_the_rules_use_only_rule_functions() -> None:
    rules = TEMPLATE.get("Rules") or {}
    assert {"VpcPair", "ClusterRedisInVpc", "TimeScaleLocalOnly"} <= set(rules)
    assert functions_used(rules) <= RULE_FUNCTIONS


@EMPTY_LISTS
def test_a_cluster_redis_on_aws_needs_subnets_and_security_groups(empty: list[str]) -> None:
    assert any(v.startswith("ClusterRedisInVpc") for v in violations(OLD_DEV, empty))
    assert violations({**OLD_DEV, **VPC}, empty) == []
    assert violations({**OLD_DEV, "LocalEndpoints": "true"}, empty) == []  # a local cluster (tests)
    assert violations({"RedisMode": "standalone"}, empty) == []
    assert any(v.startswith("ClusterRedisInVpc") for v in violations({**OLD_DEV, "SubnetIds": "subnet-a"}, empty))


@EMPTY_LISTS
def test_subnets_and_security_groups_need_each_other(empty: list[str]) -> None:
    assert [v.split(":")[0] for v in violations({"SubnetIds": "subnet-a"}, empty)] == ["VpcPair"]
    assert [v.split(":")[0] for v in violations({"SecurityGroupIds": "sg-1"}, empty)] == ["VpcPair"]
    assert violations(VPC, empty) == []
    assert violations({**VPC, "LocalEndpoints": "true"}, empty) == []


@EMPTY_LISTS
def test_a_compressed_clock_is_refused_unless_local(empty: list[str]) -> None:
    assert any(v.startswith("TimeScaleLocalOnly") for v in violations({"TimeScale": "0.05"}, empty))
    assert violations({"TimeScale": "0.05", "LocalEndpoints": "true"}, empty) == []
    assert violations({"TimeScale": "1"}, empty) == violations({}, empty) == []


@EMPTY_LISTS
@pytest.mark.parametrize("env", ["default", "dev", "prod"])
def test_every_samconfig_environment_passes_the_rules_where_sync_reads_it_too(env: str, empty: list[str]) -> None:
    parameters = samconfig_parameters(env)
    assert violations(parameters, empty) == []
    if env != "default":
        assert parameters.get("RedisMode") == "cluster" and {"SubnetIds", "SecurityGroupIds"} <= set(parameters)


def test_every_function_knows_whether_it_runs_in_a_vpc() -> None:
    for overrides, expected in (({}, "false"), (VPC, "true")):
        r = resolver(**overrides)
        for lid, function in r.functions.items():
            in_vpc = "false" if lid == "JobsFunction" else expected  # it needs no Redis: never in the VPC
            assert function.environment["IN_VPC"] == in_vpc, lid
            assert ("VpcConfig" in function_props(lid)) is (lid != "JobsFunction"), lid


# -- item 14: costs and exposure -------------------------------------------------------------------------

def test_the_public_webhook_url_cannot_take_the_accounts_concurrency() -> None:
    spec = PARAMETERS["WebhookReservedConcurrency"]
    assert spec["Type"] == "Number" and 1 <= spec["MinValue"] <= spec["Default"] <= spec["MaxValue"] <= 100
    assert TRANSLATED["WebhookFunctionUrl"]["Properties"]["AuthType"] == "NONE"
    assert resolver(WebhookReservedConcurrency="7").properties["WebhookFunction"]["ReservedConcurrentExecutions"] == 7


def test_the_jobs_url_is_iam_authorised_and_its_role_reads_and_forwards_only() -> None:
    """GetJob and POST /jobs: AWS_IAM on the URL (SAM adds no public permission), and a role that
    may read one item, fetch result objects (what its pre-signed URLs grant), invoke the submit
    function and nothing else - no Sume key, no queue but Lambda's dead letters, no Redis secret."""
    assert TRANSLATED["JobsFunctionUrl"]["Properties"]["AuthType"] == "AWS_IAM"
    assert not [lid for lid, r in TRANSLATED.items() if r["Type"] == "AWS::Lambda::Permission"
                and json.dumps(r["Properties"]["FunctionName"]).count("JobsFunction")]
    for overrides in ({}, {"KmsKeyArn": KEY, "RedisSecretName": "redis-user", "SumeApiKeySource": "secretsmanager"}):
        r = resolver(**overrides)
        statements = role_statements(r, "JobsFunction")
        allowed = {(action, resource) for s in statements
                   for action in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])
                   for resource in (s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]])}
        logs = r.outputs["JobsLogGroupArn"]
        expected = {("logs:CreateLogStream", logs), ("logs:PutLogEvents", logs),
                    ("sqs:SendMessage", r.outputs["FailedInvocationsQueueArn"]),
                    ("dynamodb:GetItem", r.outputs["JobsTableArn"]), ("s3:GetObject", r.outputs["ResultsArn"]),
                    ("lambda:InvokeFunction", r.outputs["SubmitFunctionArn"])}
        if overrides:
            expected |= {("kms:Decrypt", KEY), ("kms:GenerateDataKey", KEY)}
        assert allowed == expected, overrides
        environment = r.functions["JobsFunction"].environment
        assert environment["SUBMIT_FUNCTION_NAME"] == r["SubmitFunction"]
        assert environment["RESULT_BUCKET"] == r["ResultBucket"]
        assert not {"SUME_API_KEY_NAME", "SUME_BASE_URL", "WEBHOOK_SECRET_NAME"} & set(environment)  # no Sume key


def test_post_jobs_outwaits_the_submit_function_within_its_own_timeout() -> None:
    from sume_poller.wiring.jobs import INVOKE_CONFIG, INVOKE_READ_TIMEOUT_S

    r = resolver()
    submit, jobs = r.functions["SubmitFunction"].timeout, r.functions["JobsFunction"].timeout
    assert submit < INVOKE_READ_TIMEOUT_S == INVOKE_CONFIG.read_timeout < jobs
    assert INVOKE_CONFIG.retries == {"mode": "standard", "total_max_attempts": 1}  # a retried Invoke submits again
    spec = PARAMETERS["ResultUrlExpirySeconds"]
    assert (spec["MinValue"], spec["Default"], spec["MaxValue"]) == (30, 300, 3600)
    assert resolver(ResultUrlExpirySeconds="45").functions["JobsFunction"].environment[
        "RESULT_URL_EXPIRY_SECONDS"] == "45"


def test_a_stale_schedule_tick_is_dropped_not_retried() -> None:
    for lid in ("FanOutFunction", "SweepFunction"):
        config = TRANSLATED[f"{lid}EventInvokeConfig"]["Properties"]
        assert config["FunctionName"] == {"Ref": lid}, lid
        assert (config["MaximumEventAgeInSeconds"], config["MaximumRetryAttempts"]) == (60, 0), lid


@pytest.mark.parametrize("key", ["", KEY], ids=["sse-s3", "cmk"])
def test_the_result_bucket_refuses_plain_http_and_expires_what_nobody_reads(key: str) -> None:
    r = resolver(KmsKeyArn=key)
    (policy,) = [p for p in deployed(r, "AWS::S3::BucketPolicy").values() if p["Bucket"] == r["ResultBucket"]]
    bucket_arn = r.outputs["ResultBucketArn"]
    assert bucket_arn.endswith(f":::{r['ResultBucket']}")
    (deny,) = [s for s in policy["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
    assert deny["Principal"] == "*" and deny["Action"] == "s3:*"
    assert set(deny["Resource"]) == {bucket_arn, f"{bucket_arn}/*"}
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}

    bucket = r.properties["ResultBucket"]
    rules = [rule for rule in bucket["LifecycleConfiguration"]["Rules"] if rule["Status"] == "Enabled"]
    assert any(rule.get("NoncurrentVersionExpiration") == {"NoncurrentDays": 30} for rule in rules)
    assert any(rule.get("AbortIncompleteMultipartUpload") == {"DaysAfterInitiation": 1} for rule in rules)
    (unclaimed,) = [rule for rule in rules if rule.get("TagFilters")]
    assert unclaimed["TagFilters"] == [{"Key": "sume-poller-attempt", "Value": "unclaimed"}]
    assert unclaimed["ExpirationInDays"] == 1 and unclaimed["Prefix"] == "results/"
    (encryption,) = bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert encryption.get("BucketKeyEnabled") is (True if key else None)


def test_the_table_uses_the_free_aws_owned_key_unless_a_key_is_given() -> None:
    assert resolver().properties["JobsTable"]["SSESpecification"] == {"SSEEnabled": False}
    assert resolver(KmsKeyArn=KEY).properties["JobsTable"]["SSESpecification"] == {
        "SSEEnabled": True, "SSEType": "KMS", "KMSMasterKeyId": KEY}


def test_dead_letters_outlive_the_messages_they_were() -> None:
    r = resolver()
    retention = {q: int(r.properties[q]["MessageRetentionPeriod"]) for q in QUEUES}
    assert retention["PollQueue"] == 4 * 86400
    assert retention["PollDeadLetterQueue"] == retention["FailedSubmitsQueue"] == 14 * 86400
    assert retention["FailedInvocationsQueue"] == 86400  # stale schedule ticks only: nothing to act on
    # A message keeps its first enqueue time in the DLQ: it must have time left there.
    assert retention["PollDeadLetterQueue"] - retention["PollQueue"] >= 7 * 86400
    assert (retention["CreateQueue"], retention["CreateDeadLetterQueue"]) == (retention["PollQueue"],
                                                                              retention["PollDeadLetterQueue"])
    for queue, dead_letters in (("PollQueue", "PollDeadLetterQueue"), ("CreateQueue", "CreateDeadLetterQueue")):
        redrive = RESOURCES[queue]["Properties"]["RedrivePolicy"]
        assert redrive["deadLetterTargetArn"] == {"Fn::GetAtt": [dead_letters, "Arn"]}
        assert redrive["maxReceiveCount"] > 1
    # The queue-age alarm can fire only on a message still retained.
    assert PARAMETERS["QueueAgeAlarmSeconds"]["MaxValue"] < retention["PollQueue"]


SSM_NAMES = ("SumeApiKeyName", "WebhookSecretName")


@pytest.mark.parametrize("name", SSM_NAMES)
def test_ssm_parameter_names_need_their_leading_slash(name: str) -> None:
    pattern = re.compile(PARAMETERS[name]["AllowedPattern"])
    assert pattern.fullmatch(PARAMETERS[name]["Default"])
    assert pattern.fullmatch("/sume-poller/prod/api-key")
    assert not pattern.fullmatch("sume-poller/api-key")  # the IAM grant would be "parametersume-poller/..."
    r = resolver(**{name: "/team/key", "WebhookSecretSource": "ssm"})
    function = "PollFunction" if name == "SumeApiKeyName" else "WebhookFunction"
    assert grants(role_statements(r, function), "ssm:GetParameter",
                  "arn:aws:ssm:us-east-1:123456789012:parameter/team/key")  # moto's account and region


def test_every_function_logs_into_its_own_log_group_created_first() -> None:
    r = resolver()
    groups = deployed(r, "AWS::Logs::LogGroup")
    stack = r.outputs["StackName"]
    for lid in deployed(r, "AWS::Serverless::Function"):
        bound = function_props(lid)["LoggingConfig"].get("LogGroup")
        assert isinstance(bound, dict) and set(bound) == {"Ref"} and bound["Ref"] in groups, lid
        assert lid not in json.dumps(RESOURCES[bound["Ref"]]["Properties"]["LogGroupName"]), \
            f"{lid}'s log group refers back to it"
        assert groups[bound["Ref"]]["LogGroupName"].startswith(f"/aws/lambda/{stack}-")  # the stack's name
        log_group_arn = r.outputs[f"{bound['Ref']}Arn"]
        assert grants(role_statements(r, lid), "logs:PutLogEvents", log_group_arn), lid
    names = [g["LogGroupName"] for g in groups.values()]
    assert len(set(names)) == len(names)


# -- roles: what SAM makes of the template ----------------------------------------------------------------

#: Managed policies whose statements take Resource "*", and the feature that needs each.
WILDCARD_POLICIES = {
    "AWSLambdaVPCAccessExecutionRole": "vpc",
    "AWSXrayWriteOnlyAccess": "tracing",
    "AWSXRayDaemonWriteAccess": "tracing",
    "AWSLambdaSQSQueueExecutionRole": None,  # replaced by statements on the poll queue
    "AWSLambdaBasicExecutionRole": None,  # replaced by statements on each function's log group
}
TRANSLATIONS = {
    "defaults": {},
    "everything-on": {**EVERYTHING_ON, "KmsKeyArn": KEY, "RedisSecretName": "redis-user",
                      "SumeApiKeySource": "secretsmanager", "WebhookSecretSource": "secretsmanager"},
    "vpc": {**VPC, "RedisMode": "cluster"},
    "tracing": {"Tracing": "Active"},
    "vpc-tracing-webhooks": {**VPC, "Tracing": "Active", **EVERYTHING_ON},
}


@pytest.mark.parametrize("case", sorted(TRANSLATIONS))
def test_no_role_gets_a_wildcard_policy_its_feature_does_not_need(case: str) -> None:
    parameters = {**REQUIRED, **TRANSLATIONS[case]}
    r = resolve(parameters, TEMPLATE_PATH, outputs={"UseVpc": {"Fn::If": ["UseVpc", "yes", "no"]}})
    features = {"vpc": r.outputs["UseVpc"] == "yes", "tracing": parameters.get("Tracing") == "Active"}
    roles = r.of_type("AWS::IAM::Role")  # everything SAM made of the template: none of its own roles
    assert {r.translated["Resources"][lid]["Properties"]["Role"]["Fn::GetAtt"][0] for lid in r.functions} <= set(roles)
    for lid in roles:
        props = r.properties[lid]
        for arn in props.get("ManagedPolicyArns", []):
            name = arn.rsplit("/", 1)[-1]
            assert name in WILDCARD_POLICIES, f"{lid}: unknown managed policy {arn}"
            feature = WILDCARD_POLICIES[name]
            assert feature is not None and features[feature], f"{lid}: {name} attached with its feature off"
        for policy in props.get("Policies", []):
            for statement in policy["PolicyDocument"]["Statement"]:
                resource = statement["Resource"]
                assert "*" not in (resource if isinstance(resource, list) else [resource]), f"{lid}: {statement}"

    for function in ("PollFunction", "SubmitFunction"):  # each consumes its queue and sends its next steps to it
        statements = role_statements(r, function)
        queue = r.mappings[function]["EventSourceArn"]
        for action in ("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes",
                       "sqs:ChangeMessageVisibility", "sqs:SendMessage"):
            assert grants(statements, action, queue), (function, action)


def test_the_create_queue_is_drained_by_submit_alone_and_fan_out_may_restart_its_drains() -> None:
    r = resolver()
    create_queue = r.mappings["SubmitFunction"]["EventSourceArn"]
    assert int(r.mappings["SubmitFunction"]["BatchSize"]) == 1  # one drain step (at most one create) per invocation
    assert grants(role_statements(r, "FanOutFunction"), "sqs:SendMessage", create_queue)  # restarts dead drains
    assert not any(grants(role_statements(r, f), "sqs:ReceiveMessage", create_queue) for f in r.functions
                   if f != "SubmitFunction")
    submit = role_statements(r, "SubmitFunction")
    table = r.outputs["JobsTableArn"]
    for action in ("dynamodb:PutItem", "dynamodb:DeleteItem", "dynamodb:UpdateItem", "dynamodb:GetItem"):
        assert grants(submit, action, table), action  # enqueue's TransactWriteItems is Puts: PutItem
    assert grants(submit, "dynamodb:Query", f"{table}/index/pending")


# -- what the layer needs from the template (item 10 and the result stream) --------------------------------

def test_the_claim_ttl_fits_between_the_poll_timeout_and_the_queues_visibility_timeout() -> None:
    visibility = int(RESOURCES["PollQueue"]["Properties"]["VisibilityTimeout"])
    timeout = int(function_props("PollFunction")["Timeout"])
    assert (visibility, timeout) == (settings.POLL_QUEUE_VISIBILITY_TIMEOUT_SECONDS,
                                     settings.POLL_FUNCTION_TIMEOUT_SECONDS)
    assert PARAMETERS["ClaimTtlSeconds"]["MaxValue"] == visibility - timeout == settings.CLAIM_TTL_MAX_SECONDS
    assert PARAMETERS["ClaimTtlSeconds"]["MinValue"] > timeout
    assert str(visibility - timeout) in PARAMETERS["ClaimTtlSeconds"]["Description"]
    # The drains of the create queue use the same claim: the same visibility, the submit function's timeout.
    assert int(RESOURCES["CreateQueue"]["Properties"]["VisibilityTimeout"]) == visibility
    assert int(function_props("SubmitFunction").get("Timeout", TEMPLATE["Globals"]["Function"]["Timeout"])) <= timeout
    variables = function_props("SubmitFunction")["Environment"]["Variables"]
    assert variables["CLAIM_TTL_SECONDS"] == {"Ref": "ClaimTtlSeconds"}


def test_the_queue_deadline_parameter_is_what_the_submit_function_accepts() -> None:
    parameter = PARAMETERS["SubmitQueueDeadlineSeconds"]
    variables = function_props("SubmitFunction")["Environment"]["Variables"]
    assert variables["SUBMIT_QUEUE_DEADLINE_SECONDS"] == {"Ref": "SubmitQueueDeadlineSeconds"}
    assert variables["CREATE_QUEUE_URL"] == {"Ref": "CreateQueue"}
    assert function_props("FanOutFunction")["Environment"]["Variables"]["CREATE_QUEUE_URL"] == {"Ref": "CreateQueue"}
    field = next(f for f in dataclasses.fields(SubmitSettings) if f.name == "queue_deadline")
    assert (parameter["MinValue"], parameter["MaxValue"], parameter["Default"]) == (
        field.metadata["low"], field.metadata["high"], field.default)
    alarms = {lid: r["Properties"] for lid, r in RESOURCES.items() if r["Type"] == "AWS::CloudWatch::Alarm"}
    assert alarms["SubmissionsExpiredAlarm"]["MetricName"] == "SubmissionsExpired"
    assert alarms["CreateDeadLetterAlarm"]["Dimensions"] == [
        {"Name": "QueueName", "Value": {"Fn::GetAtt": ["CreateDeadLetterQueue", "QueueName"]}}]
    handler = (ROOT / "functions" / "submit" / "app.py").read_text()
    assert '"SubmissionsExpired"' in handler and '"SubmissionsQueued"' in handler
    body = json.loads(resolver().properties["Dashboard"]["DashboardBody"])
    (line,) = [w for w in body["widgets"] if '"SubmissionsExpired"' in json.dumps(w)]
    assert all(f'"{name}"' in json.dumps(line) for name in ("SubmissionsQueued", "SubmissionsCreatedFromQueue",
                                                              "SubmissionsRejectedFromQueue"))


def test_the_poll_function_may_stream_results_and_is_told_their_limit() -> None:
    spec = PARAMETERS["ResultMaxMegabytes"]
    assert (spec["Default"], spec["MinValue"], spec["MaxValue"]) == (50, 1, 50)
    r = resolver(ResultMaxMegabytes="7")
    assert r.functions["PollFunction"].environment["RESULT_MAX_MEGABYTES"] == "7"
    results = r.outputs["ResultsArn"]
    statements = role_statements(r, "PollFunction")
    for action in ("s3:PutObject", "s3:PutObjectTagging", "s3:DeleteObjectTagging", "s3:DeleteObject",
                   "s3:AbortMultipartUpload"):
        assert grants(statements, action, results), action


def test_a_misconfigured_redis_alarms_on_its_first_datapoint() -> None:
    alarm = RESOURCES["RedisMisconfiguredAlarm"]["Properties"]
    assert (alarm["Namespace"], alarm["MetricName"], alarm["Dimensions"]) == (
        "SumePoller", "RedisMisconfigured", [{"Name": "service", "Value": "sume-poller"}])
    assert (alarm["Period"], alarm["EvaluationPeriods"], alarm["Threshold"], alarm["ComparisonOperator"]) == (
        60, 1, 0, "GreaterThanThreshold")
    body = json.loads(resolver().properties["Dashboard"]["DashboardBody"])
    (redis_line,) = [w for w in body["widgets"] if '"RedisUnavailable"' in json.dumps(w)]
    assert '"RedisMisconfigured"' in json.dumps(redis_line)
    assert "`RedisMisconfigured`" in (ROOT / "docs" / "operating.md").read_text()

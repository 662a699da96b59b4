"""Unit tests of the local tooling: template reading and resolution, provisioning requests, local invoke.

No network here: an autouse fixture makes any socket connection fail. Tests that need moto server
or redis-server are in tests/integration/test_services.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import boto3
import pytest

from tools.local_invoke import (
    TIMEOUT_EXIT_CODE,
    apply_env_vars,
    invoke_subprocess,
    make_context,
    parse_parameter_overrides,
    prepare_environment,
)
from tools.template import (
    SUPPORTED_INTRINSICS,
    Resolver,
    Template,
    UnsupportedIntrinsic,
    function_spec,
    functions,
    load_template,
    provision,
)

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE_PATH = ROOT / "template.yaml"
#: RedisUrl has no Default in the project's template.
PROJECT_PARAMETERS = {"RedisUrl": "redis://cache.local:6379/0"}


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: socket.socket, address: Any) -> None:
        raise AssertionError(f"a unit test tried to connect to {address!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


def write_template(tmp_path: Path, text: str) -> Template:
    path = tmp_path / "template.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return load_template(path)


@pytest.fixture(scope="module")
def template() -> Template:
    return load_template(TEMPLATE_PATH)


# --------------------------------------------------------------------------------------------
# The project's template
# --------------------------------------------------------------------------------------------


def test_template_loads_with_short_form_tags(template: Template) -> None:
    assert template.path == TEMPLATE_PATH
    resources = template["Resources"]
    redrive = resources["PollQueue"]["Properties"]["RedrivePolicy"]
    assert redrive["deadLetterTargetArn"] == {"Fn::GetAtt": ["PollDeadLetterQueue", "Arn"]}
    assert template["Globals"]["Function"]["Layers"] == [{"Ref": "SharedLayer"}]
    assert template["Conditions"]["UseVpc"] == {
        "Fn::Not": [{"Fn::Equals": [{"Fn::Join": ["", {"Ref": "SubnetIds"}]}, ""]}]
    }
    assert template["AWSTemplateFormatVersion"] == "2010-09-09"


@pytest.mark.parametrize(
    "parameters",
    [
        PROJECT_PARAMETERS,
        {
            **PROJECT_PARAMETERS,
            "SubnetIds": "subnet-a,subnet-b",
            "SecurityGroupIds": "sg-1",
            "KmsKeyArn": "arn:aws:kms:us-east-1:123456789012:key/k-1",
            "AlarmTopicArn": "arn:aws:sns:us-east-1:123456789012:alarms",
        },
    ],
    ids=["defaults", "vpc-kms-alarms"],
)
def test_the_whole_project_template_uses_only_supported_intrinsics(
    template: Template, parameters: dict[str, str]
) -> None:
    resolver = Resolver(template, parameters=parameters)
    for name in template.get("Conditions") or {}:
        assert isinstance(resolver.condition(name), bool)
    for section in ("Globals", "Resources", "Outputs"):
        resolver.resolve(template.get(section), section)  # raises UnsupportedIntrinsic otherwise


def test_functions_lists_serverless_functions(template: Template) -> None:
    names = functions(template)
    assert {"FanOutFunction", "PollFunction", "SubmitFunction"} <= set(names)
    assert all(template["Resources"][n]["Type"] == "AWS::Serverless::Function" for n in names)


@pytest.mark.parametrize("logical_id", functions(load_template(TEMPLATE_PATH)))
def test_every_function_resolves(template: Template, logical_id: str) -> None:
    props = template["Resources"][logical_id]["Properties"]
    globals_ = template["Globals"]["Function"]
    resolver = Resolver(template, parameters=PROJECT_PARAMETERS)
    spec = function_spec(template, logical_id, resolver)
    code_uri = props["CodeUri"].rstrip("/")
    assert code_uri.startswith("functions/")
    assert spec.code_dir == ROOT / code_uri
    assert spec.handler == "app.lambda_handler"
    assert spec.layer_dirs == [ROOT / "layers" / "sume_poller"]
    assert spec.timeout == props.get("Timeout", globals_.get("Timeout"))
    assert spec.memory == int(resolver.resolve(globals_["MemorySize"]))
    assert spec.runtime == globals_["Runtime"]
    assert spec.function_name == logical_id
    env = spec.environment
    assert env["JOBS_TABLE"] == "JobsTable"  # sam local's Ref to a resource: its logical id
    assert env["POLL_QUEUE_URL"] == "PollQueue"
    assert env["REDIS_URL"] == PROJECT_PARAMETERS["RedisUrl"]
    shards = template["Parameters"]["PendingShards"]["Default"]
    assert env["PENDING_SHARDS"] == str(shards)  # numbers become strings
    assert env["POWERTOOLS_SERVICE_NAME"] == "sume-poller"
    assert all(isinstance(v, str) for v in env.values())


def test_project_parameters_and_vpc_condition(template: Template) -> None:
    vpc = template["Globals"]["Function"]["VpcConfig"]
    assert Resolver(template, parameters=PROJECT_PARAMETERS).resolve(vpc) is None  # UseVpc false: NoValue
    resolver = Resolver(
        template, parameters={**PROJECT_PARAMETERS, "SubnetIds": "subnet-a,subnet-b", "SecurityGroupIds": "sg-1"}
    )
    assert resolver.condition("UseVpc") is True
    assert resolver.resolve(vpc) == {"SubnetIds": ["subnet-a", "subnet-b"], "SecurityGroupIds": ["sg-1"]}
    spec = function_spec(template, "PollFunction", Resolver(template, {**PROJECT_PARAMETERS, "PendingShards": "16"}))
    assert spec.environment["PENDING_SHARDS"] == "16"


def test_project_sub_with_pseudo_parameters(template: Template) -> None:
    resolver = Resolver(template, parameters=PROJECT_PARAMETERS, region="eu-west-1", account_id="111122223333")
    policies = resolver.resolve(template["Resources"]["PollFunctionRole"]["Properties"]["Policies"])
    statements = [s for policy in policies for s in policy["PolicyDocument"]["Statement"]]
    (ssm,) = [s for s in statements if s["Action"] == ["ssm:GetParameter"]]
    assert ssm["Resource"] == "arn:aws:ssm:eu-west-1:111122223333:parameter/sume-poller/api-key"


# --------------------------------------------------------------------------------------------
# Intrinsics on small inline templates
# --------------------------------------------------------------------------------------------

INTRINSICS_TEMPLATE = """\
Parameters:
  Env: {Type: String, Default: dev}
  Size: {Type: Number, Default: 3}
  Subnets: {Type: CommaDelimitedList, Default: "a,b,c"}
  NoDefault: {Type: String}
Conditions:
  IsProd: !Equals [!Ref Env, prod]
  NotProd: !Not [!Condition IsProd]
  ProdAndBig: !And [!Condition IsProd, !Equals [!Ref Size, 3]]
  ProdOrBig: !Or [!Condition IsProd, !Equals [3, !Ref Size]]
Resources:
  Queue:
    Type: AWS::SQS::Queue
  Table:
    Type: AWS::DynamoDB::Table
  Bucket:
    Type: AWS::S3::Bucket
  Topic:
    Type: AWS::SNS::Topic
  Values:
    Type: Custom::Values
    Properties:
      Sub: !Sub "${Env}-${AWS::Region}-${AWS::AccountId}-${AWS::Partition}-${AWS::StackName}-${AWS::URLSuffix}"
      SubAttr: !Sub "${Queue.Arn}|${Table.Arn}/index/x|${!Literal}"
      SubList: !Sub
        - "${Name}:${Env}:${Other}"
        - Name: !Ref Queue
          Other: !GetAtt Queue.QueueName
      GetAttDot: !GetAtt Queue.Arn
      GetAttList: !GetAtt [Table, Arn]
      GetAttTopic: !GetAtt Topic.TopicArn
      BucketRef: !Ref Bucket
      BucketArn: !GetAtt Bucket.Arn
      Join: !Join [",", !Ref Subnets]
      JoinMixed: !Join ["-", [!Ref Env, !Ref Size, x]]
      IfProd: !If [IsProd, big, small]
      IfNotProd: !If [NotProd, yes-not-prod, "no"]
      And: !If [ProdAndBig, 1, 0]
      Or: !If [ProdOrBig, 1, 0]
      Select: !Select [1, !Ref Subnets]
      SelectSplit: !Select ["2", !Split ["/", "x/y/z"]]
      Dropped: !If [IsProd, kept, !Ref AWS::NoValue]
      List: [a, !If [IsProd, b, !Ref AWS::NoValue], c]
      Nested: {Deep: [{Ref: Env}]}
      Date: 2024-01-02
"""


def resolve_values(tmp_path: Path, **kwargs: Any) -> dict[str, Any]:
    template = write_template(tmp_path, INTRINSICS_TEMPLATE)
    resolver = Resolver(template, **kwargs)
    result: dict[str, Any] = resolver.resolve(template["Resources"]["Values"]["Properties"])
    return result


def test_intrinsics_with_defaults(tmp_path: Path) -> None:
    values = resolve_values(tmp_path)
    assert values["Sub"] == "dev-us-east-1-123456789012-aws-sume-poller-amazonaws.com"
    assert values["SubAttr"] == (
        "arn:aws:sqs:us-east-1:123456789012:Queue|arn:aws:dynamodb:us-east-1:123456789012:table/Table"
        "/index/x|${Literal}"
    )
    assert values["SubList"] == "Queue:dev:Queue"
    assert values["GetAttDot"] == "arn:aws:sqs:us-east-1:123456789012:Queue"
    assert values["GetAttList"] == "arn:aws:dynamodb:us-east-1:123456789012:table/Table"
    assert values["GetAttTopic"] == "arn:aws:sns:us-east-1:123456789012:Topic"
    assert values["BucketRef"] == "Bucket"
    assert values["BucketArn"] == "arn:aws:s3:::Bucket"
    assert values["Join"] == "a,b,c"
    assert values["JoinMixed"] == "dev-3-x"
    assert values["IfProd"] == "small"
    assert values["IfNotProd"] == "yes-not-prod"
    assert values["And"] == 0
    assert values["Or"] == 1
    assert values["Select"] == "b"
    assert values["SelectSplit"] == "z"
    assert "Dropped" not in values
    assert values["List"] == ["a", "c"]
    assert values["Nested"] == {"Deep": ["dev"]}
    assert values["Date"] == "2024-01-02"


def test_intrinsics_with_overrides_and_bound_resources(tmp_path: Path) -> None:
    values = resolve_values(
        tmp_path,
        parameters={"Env": "prod", "Size": "5", "Subnets": "x, y"},
        resources={"Queue": "https://sqs.local/123/real-queue", "Bucket": "real-bucket"},
        attributes={"Queue.Arn": "arn:real:queue", "Queue.QueueName": "real-queue"},
        region="eu-central-1",
    )
    assert values["Sub"].startswith("prod-eu-central-1-")
    assert values["SubAttr"].startswith("arn:real:queue|arn:aws:dynamodb:eu-central-1:")
    assert values["SubList"] == "https://sqs.local/123/real-queue:prod:real-queue"
    assert values["BucketArn"] == "arn:aws:s3:::real-bucket"
    assert values["Join"] == "x,y"
    assert values["IfProd"] == "big"
    assert values["IfNotProd"] == "no"
    assert values["And"] == 0  # Size is 5
    assert values["Or"] == 1
    assert values["Dropped"] == "kept"
    assert values["List"] == ["a", "b", "c"]


def test_resolver_bind_and_errors(tmp_path: Path) -> None:
    template = write_template(tmp_path, INTRINSICS_TEMPLATE)
    resolver = Resolver(template)
    resolver.bind("Queue", "http://q/url", {"Arn": "arn:q", "QueueName": "q"})
    assert resolver.resolve({"Ref": "Queue"}) == "http://q/url"
    assert resolver.resolve({"Fn::GetAtt": ["Queue", "Arn"]}) == "arn:q"
    assert resolver.resolve({"Ref": "AWS::NoValue"}) is None
    with pytest.raises(ValueError, match="NoDefault"):
        resolver.resolve({"Ref": "NoDefault"})
    with pytest.raises(ValueError, match="Missing"):
        resolver.resolve({"Ref": "Missing"})
    with pytest.raises(ValueError, match="not declared"):
        Resolver(template, parameters={"Unknown": "x"})
    with pytest.raises(ValueError, match=r"^Out: Fn::Join needs \[delimiter, \[values\]\]"):
        resolver.resolve({"Fn::Join": ["-", "not-a-list"]}, "Out")


def test_getatt_dotted_attribute_and_sub_escape(tmp_path: Path) -> None:
    template = write_template(
        tmp_path,
        """\
        Resources:
          Cache:
            Type: AWS::ElastiCache::CacheCluster
            Properties:
              Endpoint: !GetAtt Cache.RedisEndpoint.Address
        """,
    )
    assert template["Resources"]["Cache"]["Properties"]["Endpoint"] == {
        "Fn::GetAtt": ["Cache", "RedisEndpoint.Address"]
    }
    resolver = Resolver(template, attributes={"Cache.RedisEndpoint.Address": "cache.local"})
    assert resolver.resolve({"Fn::Sub": "redis://${Cache.RedisEndpoint.Address}:6379"}) == "redis://cache.local:6379"


# --------------------------------------------------------------------------------------------
# Intrinsics this module does not implement: one clear error
# --------------------------------------------------------------------------------------------

SUPPORTED_LIST = ", ".join(SUPPORTED_INTRINSICS)


@pytest.mark.parametrize(
    ("yaml_value", "function"),
    [
        ("!FindInMap [Sizes, dev, Memory]", "Fn::FindInMap"),
        ("!Base64 hi", "Fn::Base64"),
        ("!GetAZs ''", "Fn::GetAZs"),
        ("!ImportValue shared-thing", "Fn::ImportValue"),
        ('!Cidr ["10.0.0.0/16", 2, 8]', "Fn::Cidr"),
        ("!Length [a, b]", "Fn::Length"),
        ("!ToJsonString {a: 1}", "Fn::ToJsonString"),
        ('{"Fn::Transform": {Name: "AWS::Include"}}', "Fn::Transform"),
        ("!NoSuchFunction x", "Fn::NoSuchFunction"),
    ],
)
def test_unsupported_intrinsic_names_the_function_and_the_place(tmp_path: Path, yaml_value: str, function: str) -> None:
    template = write_template(
        tmp_path,
        f"""\
        Resources:
          Thing:
            Type: AWS::SNS::Topic
            Properties:
              Value: {yaml_value}
        """,
    )
    resolver = Resolver(template)
    with pytest.raises(UnsupportedIntrinsic) as info:
        resolver.resolve(template["Resources"], "Resources")
    assert str(info.value) == (
        f"{function} at Resources.Thing.Properties.Value is not supported by tools.template "
        f"(supported: {SUPPORTED_LIST})"
    )
    assert (info.value.name, info.value.where) == (function, "Resources.Thing.Properties.Value")
    assert isinstance(info.value, ValueError)


def test_unsupported_intrinsic_nested_in_supported_ones_and_in_conditions(tmp_path: Path) -> None:
    template = write_template(
        tmp_path,
        """\
        Parameters:
          Env: {Type: String, Default: dev}
        Conditions:
          FromMap: !Equals [!FindInMap [M, !Ref Env, on], "yes"]
        Resources:
          Fn:
            Type: AWS::Serverless::Function
            Properties:
              CodeUri: src/
              Environment:
                Variables:
                  ENCODED: !Join ["", ["x", !Base64 hi]]
                  STACK: !Sub ["${Id}", {Id: !Ref AWS::StackId}]
        """,
    )
    resolver = Resolver(template)
    with pytest.raises(UnsupportedIntrinsic, match=r"^Fn::FindInMap at Conditions\.FromMap\.Fn::Equals\[0\] "):
        resolver.condition("FromMap")
    with pytest.raises(
        UnsupportedIntrinsic, match=r"^Fn::Base64 at Resources\.Fn\.Properties\.Environment\.Variables\.ENCODED"
    ):
        function_spec(template, "Fn", resolver)
    with pytest.raises(UnsupportedIntrinsic) as info:
        resolver.resolve(template["Resources"]["Fn"]["Properties"]["Environment"]["Variables"]["STACK"], "STACK")
    assert str(info.value).startswith("Ref AWS::StackId at STACK.Fn::Sub[1].Id is not supported")
    assert "(supported: AWS::Region, AWS::AccountId, AWS::Partition, AWS::StackName" in str(info.value)


def test_unsupported_intrinsics_only_fail_where_resolved(tmp_path: Path) -> None:
    template = write_template(
        tmp_path,
        """\
        Resources:
          Fn:
            Type: AWS::Serverless::Function
            Properties: {CodeUri: src/, Environment: {Variables: {A: !Ref AWS::Region}}}
          Alarm:
            Type: AWS::CloudWatch::Alarm
            Properties: {AlarmDescription: !Base64 "not needed locally"}
        """,
    )
    spec = function_spec(template, "Fn", Resolver(template))
    assert spec.environment == {"A": "us-east-1"}


GLOBALS_TEMPLATE = """\
Parameters:
  Level: {Type: String, Default: INFO}
Globals:
  Function:
    Runtime: python3.11
    Handler: app.lambda_handler
    Timeout: 10
    MemorySize: 512
    Layers: [!Ref LayerA]
    Environment:
      Variables:
        SHARED: from-globals
        LEVEL: !Ref Level
        FLAG: true
Resources:
  LayerA:
    Type: AWS::Serverless::LayerVersion
    Properties: {ContentUri: layers/a/}
  LayerB:
    Type: AWS::Serverless::LayerVersion
    Properties: {ContentUri: layers/b}
  Plain:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: src/plain/
  Custom:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: src/custom
      FunctionName: !Sub "custom-${Level}"
      Handler: main.handle
      Timeout: 42
      Layers:
        - !Ref LayerB
        - arn:aws:lambda:us-east-1:123456789012:layer:external:1
      Environment:
        Variables:
          SHARED: overridden
          OWN: 7
"""


def test_globals_merge_rules(tmp_path: Path) -> None:
    template = write_template(tmp_path, GLOBALS_TEMPLATE)
    resolver = Resolver(template, parameters={"Level": "DEBUG"})
    assert functions(template) == ["Plain", "Custom"]

    plain = function_spec(template, "Plain", resolver)
    assert plain.handler == "app.lambda_handler"
    assert plain.code_dir == tmp_path / "src" / "plain"
    assert plain.layer_dirs == [tmp_path / "layers" / "a"]
    assert (plain.timeout, plain.memory) == (10, 512)
    assert plain.environment == {"SHARED": "from-globals", "LEVEL": "DEBUG", "FLAG": "true"}

    custom = function_spec(template, "Custom", resolver)
    assert custom.function_name == "custom-DEBUG"
    assert custom.handler == "main.handle"
    assert custom.timeout == 42
    assert custom.layer_dirs == [tmp_path / "layers" / "a", tmp_path / "layers" / "b"]  # Globals first
    assert custom.environment == {"SHARED": "overridden", "LEVEL": "DEBUG", "FLAG": "true", "OWN": "7"}


# --------------------------------------------------------------------------------------------
# What provision asks AWS for (a recording fake instead of an endpoint)
# --------------------------------------------------------------------------------------------


class FakeClient:
    """Records the requests of one boto3 client and answers like moto would."""

    def __init__(self, service: str, calls: list[tuple[str, str, dict[str, Any]]]) -> None:
        self.service = service
        self.calls = calls

    def _record(self, method: str, request: dict[str, Any]) -> None:
        self.calls.append((self.service, method, request))

    def create_table(self, **request: Any) -> dict[str, Any]:
        self._record("create_table", request)
        return {"TableDescription": {"TableArn": f"arn:fake:table/{request['TableName']}"}}

    def get_waiter(self, name: str) -> Any:
        client = self

        class Waiter:
            def wait(self, **request: Any) -> None:
                client._record(f"wait:{name}", request)

        return Waiter()

    def create_queue(self, **request: Any) -> dict[str, Any]:
        self._record("create_queue", request)
        return {"QueueUrl": f"http://fake/123/{request['QueueName']}"}

    def get_queue_attributes(self, **request: Any) -> dict[str, Any]:
        return {"Attributes": {"QueueArn": f"arn:fake:sqs:{request['QueueUrl'].rsplit('/', 1)[1]}"}}

    def create_bucket(self, **request: Any) -> None:
        self._record("create_bucket", request)


@pytest.fixture
def aws_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, dict[str, Any]]]:
    calls: list[tuple[str, str, dict[str, Any]]] = []

    class FakeSession:
        def __init__(self, **kwargs: Any) -> None:
            self.region = kwargs["region_name"]

        def client(self, service: str, endpoint_url: str) -> FakeClient:
            assert endpoint_url == "http://aws.invalid"
            return FakeClient(service, calls)

    monkeypatch.setattr(boto3.session, "Session", FakeSession)
    return calls


PROVISION_TEMPLATE = """\
Parameters:
  Extra: {Type: String, Default: "no"}
Conditions:
  WithExtra: !Equals [!Ref Extra, "yes"]
Resources:
  Table:
    Type: AWS::DynamoDB::Table
    DeletionPolicy: Retain
    Properties:
      BillingMode: PAY_PER_REQUEST
      AttributeDefinitions: [{AttributeName: id, AttributeType: S}, {AttributeName: shard, AttributeType: S}]
      KeySchema: [{AttributeName: id, KeyType: HASH}]
      GlobalSecondaryIndexes:
        - IndexName: by-shard
          KeySchema: [{AttributeName: shard, KeyType: HASH}]
          Projection: {ProjectionType: KEYS_ONLY}
      PointInTimeRecoverySpecification: {PointInTimeRecoveryEnabled: true}
      SSESpecification: {SSEEnabled: true}
  Work:
    Type: AWS::SQS::Queue
    Properties:
      VisibilityTimeout: 180
      RedrivePolicy: {deadLetterTargetArn: !GetAtt Dead.Arn, maxReceiveCount: 5}
  Dead:
    Type: AWS::SQS::Queue
    Properties: {SqsManagedSseEnabled: true}
  Ordered:
    Type: AWS::SQS::Queue
    Properties: {FifoQueue: true, ContentBasedDeduplication: true}
  Results:
    Type: AWS::S3::Bucket
    Properties:
      VersioningConfiguration: {Status: Enabled}
  OnlyWithExtra:
    Type: AWS::SQS::Queue
    Condition: WithExtra
  Logs:
    Type: AWS::Logs::LogGroup
    Properties: {RetentionInDays: !Ref AWS::NoValue}
  Alarm:
    Type: AWS::CloudWatch::Alarm
    Properties: {AlarmDescription: !Base64 "never resolved"}
"""


def test_provision_requests_tables_queues_and_buckets(
    tmp_path: Path, aws_calls: list[tuple[str, str, dict[str, Any]]]
) -> None:
    template = write_template(tmp_path, PROVISION_TEMPLATE)
    resolver = Resolver(template)
    created = provision(template, resolver, "http://aws.invalid", region="eu-west-1", names={"Table": "jobs"})

    assert list(created) == ["Table", "Dead", "Work", "Ordered", "Results"]  # the DLQ before its user
    assert created.skipped == {"Logs": "AWS::Logs::LogGroup", "Alarm": "AWS::CloudWatch::Alarm"}
    requests = {(service, method): request for service, method, request in aws_calls}
    assert requests["dynamodb", "create_table"] == {
        "TableName": "jobs",
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": "id", "AttributeType": "S"},
            {"AttributeName": "shard", "AttributeType": "S"},
        ],
        "KeySchema": [{"AttributeName": "id", "KeyType": "HASH"}],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": "by-shard",
                "KeySchema": [{"AttributeName": "shard", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
    }  # PITR and SSE are not asked for
    assert requests["dynamodb", "wait:table_exists"]["TableName"] == "jobs"

    queues = {r["QueueName"]: r["Attributes"] for s, m, r in aws_calls if m == "create_queue"}
    dead = next(name for name in queues if name.startswith("sume-poller-Dead-"))
    work = next(name for name in queues if name.startswith("sume-poller-Work-"))
    ordered = next(name for name in queues if name.startswith("sume-poller-Ordered-"))
    assert queues[dead] == {"SqsManagedSseEnabled": "true"}
    assert queues[work]["VisibilityTimeout"] == "180"
    assert json.loads(queues[work]["RedrivePolicy"]) == {
        "deadLetterTargetArn": f"arn:fake:sqs:{dead}",
        "maxReceiveCount": 5,
    }
    assert ordered.endswith(".fifo")
    assert queues[ordered] == {"FifoQueue": "true", "ContentBasedDeduplication": "true"}

    bucket = requests["s3", "create_bucket"]
    assert bucket["Bucket"].startswith("sume-poller-results-") and bucket["Bucket"] == bucket["Bucket"].lower()
    assert bucket["CreateBucketConfiguration"] == {"LocationConstraint": "eu-west-1"}
    assert created["Results"] == bucket["Bucket"]

    # The resolver now gives the created names.
    assert resolver.resolve({"Ref": "Table"}) == "jobs"
    assert resolver.resolve({"Fn::GetAtt": ["Table", "Arn"]}) == "arn:fake:table/jobs"
    assert resolver.resolve({"Ref": "Work"}) == f"http://fake/123/{work}"
    assert resolver.resolve({"Fn::GetAtt": ["Dead", "QueueName"]}) == dead
    assert resolver.resolve({"Fn::GetAtt": ["Results", "Arn"]}) == f"arn:aws:s3:::{bucket['Bucket']}"


def test_provision_with_a_true_condition_and_us_east_1_bucket(
    tmp_path: Path, aws_calls: list[tuple[str, str, dict[str, Any]]]
) -> None:
    template = write_template(tmp_path, PROVISION_TEMPLATE)
    created = provision(template, Resolver(template, parameters={"Extra": "yes"}), "http://aws.invalid")
    assert "OnlyWithExtra" in created
    (bucket,) = [r for s, m, r in aws_calls if m == "create_bucket"]
    assert set(bucket) == {"Bucket"}  # us-east-1 takes no LocationConstraint


def test_provision_reports_a_dependency_cycle(tmp_path: Path, aws_calls: list[Any]) -> None:
    template = write_template(
        tmp_path,
        """\
        Resources:
          A: {Type: "AWS::SQS::Queue", Properties: {RedrivePolicy: {deadLetterTargetArn: !GetAtt B.Arn}}}
          B: {Type: "AWS::SQS::Queue", DependsOn: A}
        """,
    )
    with pytest.raises(ValueError, match="circular dependency: A -> B -> A"):
        provision(template, Resolver(template), "http://aws.invalid")
    assert aws_calls == []


# --------------------------------------------------------------------------------------------
# Local invoke
# --------------------------------------------------------------------------------------------

HANDLER = """\
import dataclasses
import json
import os
import sys
import time

import helper  # from the layer

print("print goes to stderr")


def lambda_handler(event, context):
    if event.get("raise"):
        raise RuntimeError("handler failed on purpose")
    if event.get("loop"):
        while True:  # until the function's Timeout kills it
            time.sleep(0.01)
    return {
        "event": event,
        "greeting": os.environ["GREETING"],
        "mode": os.environ["MODE"],
        "table": os.environ["TABLE"],
        "from_parent": os.environ.get("PARENT_ONLY"),
        "helper": helper.VALUE,
        "function_name": context.function_name,
        "lambda_name": os.environ["AWS_LAMBDA_FUNCTION_NAME"],
        "memory": context.memory_limit_in_mb,
        "remaining_ms": context.get_remaining_time_in_millis(),
        "request_id": context.aws_request_id,
        "sys_path0": sys.path[0],
        "cwd": os.getcwd(),
    }
"""

INVOKE_TEMPLATE = """\
Transform: AWS::Serverless-2016-10-31
Parameters:
  Greeting: {Type: String, Default: hello}
  FnTimeout: {Type: Number, Default: 5}
Globals:
  Function:
    Runtime: python3.11
    Handler: app.lambda_handler
    MemorySize: 192
    Timeout: !Ref FnTimeout
    Layers: [!Ref Helpers]
    Environment:
      Variables:
        GREETING: !Ref Greeting
        TABLE: !Ref Table
Resources:
  Helpers:
    Type: AWS::Serverless::LayerVersion
    Properties: {ContentUri: layer/}
  Table:
    Type: AWS::DynamoDB::Table
  Fn:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: fn/
      Environment:
        Variables:
          MODE: !Sub "${Greeting}-${AWS::Region}"
  Slow:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: fn/
      Timeout: 1
      Environment:
        Variables:
          MODE: slow
"""


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "fn").mkdir()
    (tmp_path / "fn" / "app.py").write_text(HANDLER, encoding="utf-8")
    (tmp_path / "layer").mkdir()
    (tmp_path / "layer" / "helper.py").write_text("VALUE = 'from-layer'\n", encoding="utf-8")
    (tmp_path / "template.yaml").write_text(INVOKE_TEMPLATE, encoding="utf-8")
    return tmp_path


def run_cli(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.local_invoke", *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_cli_returns_payload(app_dir: Path) -> None:
    event_file = app_dir / "event.json"
    event_file.write_text(json.dumps({"job_id": "j-1"}), encoding="utf-8")
    result = run_cli(
        "Fn", "-e", str(event_file), "--template", str(app_dir / "template.yaml"),
        env={"PARENT_ONLY": "inherited", "AWS_REGION": "eu-west-3", "GREETING": "shell-loses"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["event"] == {"job_id": "j-1"}
    assert payload["greeting"] == "hello"  # the function's variable wins over the parent's
    assert payload["mode"] == "hello-eu-west-3"  # AWS::Region follows AWS_REGION, like sam
    assert payload["table"] == "Table"
    assert payload["from_parent"] == "inherited"
    assert payload["helper"] == "from-layer"
    assert payload["function_name"] == payload["lambda_name"] == "Fn"
    assert payload["memory"] == 192
    assert 0 < payload["remaining_ms"] <= 5000
    assert payload["sys_path0"] == str(app_dir / "fn")
    assert payload["cwd"] == str(app_dir / "fn")
    assert "print goes to stderr" in result.stderr
    assert "print goes to stderr" not in result.stdout


def test_cli_env_vars_parameter_overrides_and_stdin_event(app_dir: Path) -> None:
    env_file = app_dir / "env.json"
    env_file.write_text(
        json.dumps({"Parameters": {"GREETING": "from-params", "MODE": "p"}, "Fn": {"MODE": "fn-specific"}}),
        encoding="utf-8",
    )
    result = run_cli(
        "Fn", "-e", "-", "--env-vars", str(env_file), "--template", str(app_dir / "template.yaml"),
        "--parameter-overrides", "Greeting=bonjour", "ParameterKey=FnTimeout,ParameterValue=9",
        stdin='{"from": "stdin"}',
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["event"] == {"from": "stdin"}
    assert payload["greeting"] == "from-params"
    assert payload["mode"] == "fn-specific"
    assert 5000 < payload["remaining_ms"] <= 9000


def test_cli_reports_handler_exception(app_dir: Path) -> None:
    result = run_cli("Fn", "-e", "-", "-t", str(app_dir / "template.yaml"), stdin='{"raise": true}')
    assert result.returncode != 0
    assert "Traceback" in result.stderr
    assert "RuntimeError: handler failed on purpose" in result.stderr
    error = json.loads(result.stdout)
    assert error["errorType"] == "RuntimeError"
    assert error["errorMessage"] == "handler failed on purpose"


def test_cli_enforces_timeout(app_dir: Path) -> None:
    result = run_cli("Slow", "-e", "-", "-t", str(app_dir / "template.yaml"), stdin='{"loop": true}')
    assert result.returncode == TIMEOUT_EXIT_CODE
    assert "Function timed out after 1 s" in result.stderr


def test_cli_rejects_unknown_function(app_dir: Path) -> None:
    result = run_cli("Nope", "-t", str(app_dir / "template.yaml"))
    assert result.returncode == 2
    assert "Nope" in result.stderr


def test_python_api(app_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    template = load_template(app_dir / "template.yaml")
    spec = function_spec(template, "Fn", Resolver(template))

    context = make_context(spec, request_id="req-1")
    assert context.aws_request_id == "req-1"
    assert context.function_name == "Fn"
    assert context.function_version == "$LATEST"
    assert context.invoked_function_arn.endswith(":function:Fn")
    assert context.memory_limit_in_mb == 192
    assert context.log_group_name == "/aws/lambda/Fn"
    assert context.log_stream_name
    assert 4000 < context.get_remaining_time_in_millis() <= 5000
    assert make_context(spec).aws_request_id != make_context(spec).aws_request_id

    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    env = prepare_environment(spec, base={"PATH": "/bin", "GREETING": "parent", "AWS_ENDPOINT_URL": "http://x"})
    assert env["GREETING"] == "hello"
    assert env["PATH"] == "/bin" and env["AWS_ENDPOINT_URL"] == "http://x"
    assert env["AWS_LAMBDA_FUNCTION_NAME"] == "Fn"
    assert env["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"] == "192"
    assert env["AWS_REGION"] == env["AWS_DEFAULT_REGION"] == "us-east-1"
    assert prepare_environment(spec, base={"AWS_DEFAULT_REGION": "ap-south-1"})["AWS_REGION"] == "ap-south-1"

    overridden = apply_env_vars(spec, {"Fn": {"GREETING": False, "UNDECLARED": "x"}})
    assert overridden.environment["GREETING"] == "false"
    assert "UNDECLARED" not in overridden.environment

    result = invoke_subprocess(spec, {"n": 1}, extra_env={"PARENT_ONLY": "extra"}, timeout=3)
    assert result.returncode == 0, result.stderr
    assert result.payload["event"] == {"n": 1}
    assert result.payload["from_parent"] == "extra"
    assert 0 < result.payload["remaining_ms"] <= 3000
    assert json.loads(result.stdout) == result.payload

    failed = invoke_subprocess(spec, {"raise": True})
    assert failed.returncode == 1 and failed.payload["errorType"] == "RuntimeError"


def test_timeout_backstop_kills_a_handler_that_holds_the_gil(app_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tools.local_invoke as local_invoke

    (app_dir / "fn" / "busy.py").write_text(
        "def lambda_handler(event, context):\n    return sum(range(10**15))\n", encoding="utf-8"
    )
    template = load_template(app_dir / "template.yaml")
    spec = function_spec(template, "Fn", Resolver(template))
    monkeypatch.setattr(local_invoke, "INIT_TIMEOUT_S", 0.5)
    result = invoke_subprocess(dataclasses.replace(spec, handler="busy.lambda_handler"), {}, timeout=1)
    assert result.returncode == TIMEOUT_EXIT_CODE
    assert "Function timed out after 1 s" in result.stderr
    assert result.payload["errorType"] == "Sandbox.Timedout"


def test_parse_parameter_overrides() -> None:
    assert parse_parameter_overrides(["A=1", "B=x=y", "ParameterKey=C,ParameterValue=3", "D='a b' E=e"]) == {
        "A": "1",
        "B": "x=y",
        "C": "3",
        "D": "a b",
        "E": "e",
    }
    with pytest.raises(ValueError):
        parse_parameter_overrides(["novalue"])

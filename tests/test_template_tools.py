"""Tests of the local tooling: template resolution, provisioning, local invoke and services."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
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
from tools.services import MotoServer, RedisServer, ServiceError, free_port
from tools.template import (
    Resolver,
    Template,
    function_spec,
    functions,
    load_template,
    provision,
)

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE_PATH = ROOT / "template.yaml"


def write_template(tmp_path: Path, text: str) -> Template:
    path = tmp_path / "template.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return load_template(path)


@pytest.fixture(scope="module")
def template() -> Template:
    return load_template(TEMPLATE_PATH)


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


def aws_client(service: str, moto: MotoServer) -> Any:
    return boto3.client(
        service,
        endpoint_url=moto.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


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


def test_functions_lists_serverless_functions(template: Template) -> None:
    names = functions(template)
    assert {"FanOutFunction", "PollFunction", "SubmitFunction"} <= set(names)
    assert all(template["Resources"][n]["Type"] == "AWS::Serverless::Function" for n in names)


@pytest.mark.parametrize("logical_id", functions(load_template(TEMPLATE_PATH)))
def test_every_function_resolves(template: Template, logical_id: str) -> None:
    props = template["Resources"][logical_id]["Properties"]
    spec = function_spec(template, logical_id, Resolver(template))
    code_uri = props["CodeUri"].rstrip("/")
    assert code_uri.startswith("functions/")
    assert spec.code_dir == ROOT / code_uri
    assert spec.code_dir.parts[-2:] == ("functions", code_uri.split("/")[-1])
    assert spec.handler == "app.lambda_handler"
    assert spec.layer_dirs == [ROOT / "layers" / "sume_poller"]
    assert spec.timeout == props["Timeout"]
    assert spec.memory == template["Globals"]["Function"]["MemorySize"]
    assert spec.runtime == "python3.11"
    assert spec.function_name == logical_id
    env = spec.environment
    assert env["JOBS_TABLE"] == "JobsTable"  # sam local's Ref to a resource: its logical id
    assert env["POLL_QUEUE_URL"] == "PollQueue"
    assert env["REDIS_URL"] == "redis://127.0.0.1:6379/0"
    assert env["LEASE_KEY_PREFIX"] == "sume:poll:"
    assert env["PENDING_SHARDS"] == "8"  # numbers become strings
    assert env["POWERTOOLS_SERVICE_NAME"] == "sume-poller"
    assert all(isinstance(v, str) for v in env.values())


def test_project_parameters_and_vpc_condition(template: Template) -> None:
    vpc = template["Globals"]["Function"]["VpcConfig"]
    assert Resolver(template).resolve(vpc) is None  # UseVpc false: AWS::NoValue
    resolver = Resolver(template, parameters={"SubnetIds": "subnet-a,subnet-b", "SecurityGroupIds": "sg-1"})
    assert resolver.condition("UseVpc") is True
    assert resolver.resolve(vpc) == {"SubnetIds": ["subnet-a", "subnet-b"], "SecurityGroupIds": ["sg-1"]}
    spec = function_spec(template, "PollFunction", Resolver(template, parameters={"PendingShards": "16"}))
    assert spec.environment["PENDING_SHARDS"] == "16"


def test_project_sub_with_pseudo_parameters(template: Template) -> None:
    statement = template["Resources"]["PollFunction"]["Properties"]["Policies"][0]["Statement"][1]
    resolved = Resolver(template, region="eu-west-1", account_id="111122223333").resolve(statement)
    assert resolved["Resource"] == "arn:aws:ssm:eu-west-1:111122223333:parameter/sume-poller/api-key"


# --------------------------------------------------------------------------------------------
# Intrinsics on small inline templates
# --------------------------------------------------------------------------------------------

INTRINSICS_TEMPLATE = """\
Parameters:
  Env: {Type: String, Default: dev}
  Size: {Type: Number, Default: 3}
  Subnets: {Type: CommaDelimitedList, Default: "a,b,c"}
  NoDefault: {Type: String}
Mappings:
  Sizes:
    dev: {Memory: 128}
    prod: {Memory: 1024}
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
  Topic:
    Type: AWS::SNS::Topic
  Values:
    Type: Custom::Values
    Properties:
      Sub: !Sub "${Env}-${AWS::Region}-${AWS::AccountId}-${AWS::Partition}-${AWS::StackName}"
      SubAttr: !Sub "${Queue.Arn}|${Table.Arn}/index/x|${!Literal}"
      SubList: !Sub
        - "${Name}:${Env}:${Other}"
        - Name: !Ref Queue
          Other: !GetAtt Queue.QueueName
      GetAttDot: !GetAtt Queue.Arn
      GetAttList: !GetAtt [Table, Arn]
      GetAttTopic: !GetAtt Topic.TopicArn
      Join: !Join [",", !Ref Subnets]
      JoinMixed: !Join ["-", [!Ref Env, !Ref Size, x]]
      IfProd: !If [IsProd, big, small]
      IfNotProd: !If [NotProd, yes-not-prod, "no"]
      And: !If [ProdAndBig, 1, 0]
      Or: !If [ProdOrBig, 1, 0]
      Select: !Select [1, !Ref Subnets]
      SelectSplit: !Select ["2", !Split ["/", "x/y/z"]]
      FindInMap: !FindInMap [Sizes, !Ref Env, Memory]
      Base64: !Base64 "hi"
      Azs: !GetAZs ""
      Cidr: !Cidr ["10.0.0.0/16", 2, 8]
      Import: !ImportValue shared-thing
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
    assert values["Sub"] == "dev-us-east-1-123456789012-aws-sume-poller"
    assert values["SubAttr"] == (
        "arn:aws:sqs:us-east-1:123456789012:Queue|arn:aws:dynamodb:us-east-1:123456789012:table/Table"
        "/index/x|${Literal}"
    )
    assert values["SubList"] == "Queue:dev:Queue"
    assert values["GetAttDot"] == "arn:aws:sqs:us-east-1:123456789012:Queue"
    assert values["GetAttList"] == "arn:aws:dynamodb:us-east-1:123456789012:table/Table"
    assert values["GetAttTopic"] == "arn:aws:sns:us-east-1:123456789012:Topic"
    assert values["Join"] == "a,b,c"
    assert values["JoinMixed"] == "dev-3-x"
    assert values["IfProd"] == "small"
    assert values["IfNotProd"] == "yes-not-prod"
    assert values["And"] == 0
    assert values["Or"] == 1
    assert values["Select"] == "b"
    assert values["SelectSplit"] == "z"
    assert values["FindInMap"] == 128
    assert values["Base64"] == "aGk="
    assert values["Azs"] == ["us-east-1a", "us-east-1b", "us-east-1c"]
    assert values["Cidr"] == ["10.0.0.0/24", "10.0.1.0/24"]
    assert values["Import"] == "imported:shared-thing"
    assert "Dropped" not in values
    assert values["List"] == ["a", "c"]
    assert values["Nested"] == {"Deep": ["dev"]}
    assert values["Date"] == "2024-01-02"


def test_intrinsics_with_overrides_and_bound_resources(tmp_path: Path) -> None:
    values = resolve_values(
        tmp_path,
        parameters={"Env": "prod", "Size": "5", "Subnets": "x, y"},
        resources={"Queue": "https://sqs.local/123/real-queue"},
        attributes={"Queue.Arn": "arn:real:queue", "Queue.QueueName": "real-queue"},
        region="eu-central-1",
    )
    assert values["Sub"].startswith("prod-eu-central-1-")
    assert values["SubAttr"].startswith("arn:real:queue|arn:aws:dynamodb:eu-central-1:")
    assert values["SubList"] == "https://sqs.local/123/real-queue:prod:real-queue"
    assert values["Join"] == "x,y"
    assert values["IfProd"] == "big"
    assert values["IfNotProd"] == "no"
    assert values["And"] == 0  # Size is 5
    assert values["Or"] == 1
    assert values["FindInMap"] == 1024
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
    assert (
        resolver.resolve({"Fn::Sub": "redis://${Cache.RedisEndpoint.Address}:6379"})
        == "redis://cache.local:6379"
    )


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
# Provisioning into moto server
# --------------------------------------------------------------------------------------------


def test_provision_creates_tables_and_queues_from_template(template: Template, moto: MotoServer) -> None:
    resolver = Resolver(template)
    created = provision(template, resolver, moto.endpoint_url, names={"JobsTable": "jobs-under-test"})
    assert set(created) == {"JobsTable", "PollQueue", "PollDeadLetterQueue"}
    assert created["JobsTable"] == "jobs-under-test"

    ddb = aws_client("dynamodb", moto)
    table = ddb.describe_table(TableName="jobs-under-test")["Table"]
    props = template["Resources"]["JobsTable"]["Properties"]
    assert table["KeySchema"] == props["KeySchema"]
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    (gsi,) = table["GlobalSecondaryIndexes"]
    assert gsi["IndexName"] == "pending"
    assert gsi["KeySchema"] == props["GlobalSecondaryIndexes"][0]["KeySchema"]
    assert gsi["Projection"] == {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["kind", "deadline_at"]}
    assert table["SSEDescription"]["Status"] == "ENABLED"
    backups = ddb.describe_continuous_backups(TableName="jobs-under-test")["ContinuousBackupsDescription"]
    assert backups["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"] == "ENABLED"

    sqs = aws_client("sqs", moto)
    dlq_arn = sqs.get_queue_attributes(QueueUrl=created["PollDeadLetterQueue"], AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    attrs = sqs.get_queue_attributes(QueueUrl=created["PollQueue"], AttributeNames=["All"])["Attributes"]
    queue_props = template["Resources"]["PollQueue"]["Properties"]
    assert int(attrs["VisibilityTimeout"]) == queue_props["VisibilityTimeout"]
    assert int(attrs["MessageRetentionPeriod"]) == queue_props["MessageRetentionPeriod"]
    redrive = json.loads(attrs["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"] == dlq_arn
    assert int(redrive["maxReceiveCount"]) == queue_props["RedrivePolicy"]["maxReceiveCount"]
    assert attrs["SqsManagedSseEnabled"] == "true"

    # The resolver now gives the real values.
    assert resolver.resolve({"Ref": "JobsTable"}) == "jobs-under-test"
    assert resolver.resolve({"Ref": "PollQueue"}) == created["PollQueue"]
    assert resolver.resolve({"Fn::GetAtt": ["PollQueue", "Arn"]}) == attrs["QueueArn"]
    assert resolver.resolve({"Fn::GetAtt": ["PollDeadLetterQueue", "QueueName"]}) == dlq_arn.split(":")[-1]
    assert resolver.resolve({"Fn::GetAtt": ["JobsTable", "Arn"]}) == table["TableArn"]
    spec = function_spec(template, "PollFunction", resolver)
    assert spec.environment["JOBS_TABLE"] == "jobs-under-test"
    assert spec.environment["POLL_QUEUE_URL"] == created["PollQueue"]


def test_provision_generates_unique_names_and_skips_false_conditions(
    tmp_path: Path, moto: MotoServer
) -> None:
    template = write_template(
        tmp_path,
        """\
        Parameters:
          WithExtra: {Type: String, Default: "no"}
        Conditions:
          Extra: !Equals [!Ref WithExtra, "yes"]
        Resources:
          Main:
            Type: AWS::SQS::Queue
            DependsOn: Later
            Properties: {DelaySeconds: 2}
          Later:
            Type: AWS::SQS::Queue
          Optional:
            Type: AWS::SQS::Queue
            Condition: Extra
          Topic:
            Type: AWS::SNS::Topic
        """,
    )
    first = provision(template, Resolver(template), moto.endpoint_url)
    second = provision(template, Resolver(template), moto.endpoint_url)
    assert list(first) == ["Later", "Main"]  # dependency order; other types and false conditions skipped
    assert first["Main"] != second["Main"]
    assert "/sume-poller-Main-" in first["Main"]
    sqs = aws_client("sqs", moto)
    attrs = sqs.get_queue_attributes(QueueUrl=first["Main"], AttributeNames=["DelaySeconds"])
    assert attrs["Attributes"]["DelaySeconds"] == "2"


def test_moto_reset_forgets_resources(tmp_path: Path) -> None:
    template = write_template(tmp_path, "Resources:\n  Q:\n    Type: AWS::SQS::Queue\n")
    with MotoServer() as server:
        provision(template, Resolver(template), server.endpoint_url)
        sqs = aws_client("sqs", server)
        assert sqs.list_queues().get("QueueUrls")
        server.reset()
        assert not sqs.list_queues().get("QueueUrls")
    assert not server.running


# --------------------------------------------------------------------------------------------
# Services
# --------------------------------------------------------------------------------------------


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_redis_server_start_stop_restart() -> None:
    server = RedisServer().start()  # `make setup` installs redis-server; a missing one fails here
    try:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        assert _ping(server.port)
        pid = server.pid
        server.stop()
        assert not _ping(server.port)
        server.restart()
        assert server.pid != pid and _ping(server.port)
    finally:
        server.stop()
    assert not server.running


def test_service_on_a_taken_port_is_refused() -> None:
    with RedisServer() as first:
        with pytest.raises(ServiceError, match="already in use"):
            RedisServer(port=first.port).start()
        assert _ping(first.port)


class BrokenRedis(RedisServer):
    def _command(self) -> list[str]:
        return [*super()._command(), "--no-such-option", "1"]


def test_service_that_dies_reports_its_output() -> None:
    server = BrokenRedis()
    with pytest.raises(ServiceError, match="exited with code") as info:
        server.start()
    assert "output tail" in str(info.value)
    assert "no-such-option" in str(info.value)
    assert not server.running


def test_missing_redis_binary_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import tools.services as services

    monkeypatch.setattr(services.shutil, "which", lambda name: None)
    monkeypatch.setattr(services.os, "access", lambda path, mode: False)
    with pytest.raises(ServiceError, match="apt-get install redis-server"):
        RedisServer().start()


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
    started = time.monotonic()
    result = run_cli("Slow", "-e", "-", "-t", str(app_dir / "template.yaml"), stdin='{"loop": true}')
    elapsed = time.monotonic() - started
    assert result.returncode == TIMEOUT_EXIT_CODE
    assert "Function timed out after 1 s" in result.stderr
    assert elapsed < 8


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
    env = prepare_environment(
        spec, base={"PATH": "/bin", "GREETING": "parent", "AWS_ENDPOINT_URL": "http://x"}
    )
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


def test_timeout_backstop_kills_a_handler_that_holds_the_gil(
    app_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tools.local_invoke as local_invoke

    (app_dir / "fn" / "busy.py").write_text(
        "def lambda_handler(event, context):\n    return sum(range(10**15))\n", encoding="utf-8"
    )
    template = load_template(app_dir / "template.yaml")
    spec = function_spec(template, "Fn", Resolver(template))
    monkeypatch.setattr(local_invoke, "INIT_TIMEOUT_S", 0.5)
    started = time.monotonic()
    result = invoke_subprocess(dataclasses.replace(spec, handler="busy.lambda_handler"), {}, timeout=1)
    assert result.returncode == TIMEOUT_EXIT_CODE
    assert "Function timed out after 1 s" in result.stderr
    assert result.payload["errorType"] == "Sandbox.Timedout"
    assert time.monotonic() - started < 8


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

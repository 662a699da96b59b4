"""Unit tests of the local tooling: the template through the SAM translator and moto's
CloudFormation (tools.template), and local invoke.

No network here: an autouse fixture makes any socket connection fail (moto's in-memory mock needs
none). Tests against moto server and redis-server are in tests/integration/test_services.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tools.local_invoke import (
    TIMEOUT_EXIT_CODE,
    apply_env_vars,
    functions,
    invoke_subprocess,
    make_context,
    parse_parameter_overrides,
    prepare_environment,
)
from tools.template import MOTO_LACKS, Created, for_moto, load, resolve, translate

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE_PATH = ROOT / "template.yaml"
#: RedisUrl has no Default in the project's template.
PROJECT_PARAMETERS = {"RedisUrl": "redis://cache.local:6379/0"}
VPC = {"SubnetIds": "subnet-a,subnet-b", "SecurityGroupIds": "sg-1"}


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: socket.socket, address: Any) -> None:
        raise AssertionError(f"a unit test tried to connect to {address!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load(TEMPLATE_PATH)


@pytest.fixture(scope="module")
def created() -> Created:
    return resolve(PROJECT_PARAMETERS)


# --------------------------------------------------------------------------------------------
# The project's template, through the libraries
# --------------------------------------------------------------------------------------------


def test_template_loads_with_short_form_tags(template: dict[str, Any]) -> None:
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
    [PROJECT_PARAMETERS, {**PROJECT_PARAMETERS, **VPC, "KmsKeyArn": "arn:aws:kms:us-east-1:123456789012:key/k-1",
                          "AlarmTopicArn": "arn:aws:sns:us-east-1:123456789012:alarms", "Webhooks": "true",
                          "CreateTerminalEventsQueue": "true", "Tracing": "Active"}],
    ids=["defaults", "everything-on"],
)
def test_moto_creates_the_whole_project_template(parameters: dict[str, str]) -> None:
    created = resolve(parameters)
    assert set(created.functions) >= {"SubmitFunction", "PollFunction", "FanOutFunction"}
    assert not [lid for lid, t in created.types.items() if t is None], "every resource is created or stubbed"
    for lid, resource_type in created.types.items():
        if resource_type in MOTO_LACKS:
            assert created.properties[lid], lid  # its properties, as the template resolves them
    assert "alias/aws/sqs" not in json.dumps(created.properties)


def test_every_function_resolves(template: dict[str, Any], created: Created) -> None:
    globals_ = template["Globals"]["Function"]
    shards = template["Parameters"]["PendingShards"]["Default"]
    memory = template["Parameters"]["FunctionMemorySize"]["Default"]
    assert set(created.functions) == {lid for lid, r in template["Resources"].items()
                                      if (r["Type"] == "AWS::Serverless::Function" and not r.get("Condition"))
                                      or lid == "SweepFunction"}  # Sweeps defaults to true
    for logical_id, spec in created.functions.items():
        props = template["Resources"][logical_id]["Properties"]
        code_uri = props["CodeUri"].rstrip("/")
        assert code_uri.startswith("functions/")
        assert spec.code_dir == ROOT / code_uri
        assert spec.handler == "app.lambda_handler"
        assert spec.layer_dirs == [ROOT / "layers" / "sume_poller"]
        assert spec.timeout == props.get("Timeout", globals_.get("Timeout"))
        assert spec.memory == memory
        assert spec.runtime == globals_["Runtime"]
        assert spec.architectures == globals_["Architectures"]
        assert f"-{logical_id}-" in spec.function_name  # the name CloudFormation makes up
        env = spec.environment
        assert env["JOBS_TABLE"] == created["JobsTable"] == created.outputs["JobsTableName"]
        assert env["POLL_QUEUE_URL"] == created["PollQueue"] == created.outputs["PollQueueUrl"]
        assert env["REDIS_URL"] == PROJECT_PARAMETERS["RedisUrl"]
        assert env["PENDING_SHARDS"] == str(shards)  # numbers become strings
        assert env["POWERTOOLS_SERVICE_NAME"] == "sume-poller"
        assert all(isinstance(v, str) for v in env.values())
    assert created.schedules == {"FanOutFunction": "rate(1 minute)", "SweepFunction": "rate(1 minute)"}
    assert created.mappings["PollFunction"]["BatchSize"] == template["Parameters"]["PollBatchSize"]["Default"]


def test_project_parameters_and_vpc_condition(created: Created) -> None:
    assert "VpcConfig" not in created.properties["PollFunction"]  # UseVpc false: NoValue
    assert created.functions["PollFunction"].environment["IN_VPC"] == "false"
    vpc = resolve({**PROJECT_PARAMETERS, **VPC, "PendingShards": "16"})
    assert vpc.properties["PollFunction"]["VpcConfig"] == {"SubnetIds": ["subnet-a", "subnet-b"],
                                                           "SecurityGroupIds": ["sg-1"]}
    assert vpc.functions["PollFunction"].environment["PENDING_SHARDS"] == "16"
    assert vpc.functions["PollFunction"].environment["IN_VPC"] == "true"


def test_project_sub_with_pseudo_parameters() -> None:
    created = resolve(PROJECT_PARAMETERS, region="eu-west-1")
    policies = created.properties["PollFunctionRole"]["Policies"]
    statements = [s for policy in policies for s in policy["PolicyDocument"]["Statement"]]
    (ssm,) = [s for s in statements if s["Action"] == ["ssm:GetParameter"]]
    assert ssm["Resource"] == "arn:aws:ssm:eu-west-1:123456789012:parameter/sume-poller/api-key"  # moto's account


def test_for_moto_stubs_what_moto_lacks_and_keeps_the_rest_local(template: dict[str, Any]) -> None:
    translated = translate(template, {**PROJECT_PARAMETERS, "Webhooks": "true"})
    document = for_moto(translated, names={"JobsTable": "jobs"})
    resources = document["Resources"]
    for lid, resource in translated["Resources"].items():
        stubbed = resource["Type"] in MOTO_LACKS or "ScheduleExpression" in resource.get("Properties", {})
        assert (resources[lid]["Type"] == "AWS::SSM::Parameter") == stubbed, lid
        assert resources[lid].get("Condition") == resource.get("Condition"), lid
    alarm = resources["DeadLetterAlarm"]["Properties"]["Value"]["Fn::ToJsonString"]
    assert alarm == {"Type": "AWS::CloudWatch::Alarm",
                     "Properties": translated["Resources"]["DeadLetterAlarm"]["Properties"]}
    # moto would run the mapping itself (Docker), and serves no function URL
    assert resources["PollFunctionPollQueue"]["Properties"]["Enabled"] is False
    assert resources["SubmitFunctionCreateQueue"]["Properties"]["Enabled"] is False  # the drains' mapping too
    webhook_url = resources["SubmitFunction"]["Properties"]["Environment"]["Variables"]["WEBHOOK_URL"]
    assert webhook_url == {"Fn::If": ["WebhooksOn", "https://webhookfunctionurl.lambda-url.us-east-1.on.aws/", ""]}
    assert set(resources["PollFunction"]["Properties"]["Code"]) == {"ZipFile"}  # the code runs from its directory
    assert translated["Resources"]["PollFunction"]["Properties"]["Code"]["S3Key"] == "functions/poll/"  # untouched
    assert resources["JobsTable"]["Properties"]["TableName"] == "jobs"
    assert "TableName" not in translated["Resources"]["JobsTable"]["Properties"]


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
        "queue": os.environ["QUEUE"],
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
        QUEUE: !Ref Queue
Resources:
  Helpers:
    Type: AWS::Serverless::LayerVersion
    Properties: {ContentUri: layer/}
  Queue:
    Type: AWS::SQS::Queue
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
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None, overrides: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI on the template given with -t/--template, resolved in this process first with
    ``overrides`` (moto is imported here already; a fresh process takes seconds to import it):
    the CLI finds the functions in its cache, as on every `make invoke` after the first."""
    template = Path(args[args.index("-t" if "-t" in args else "--template") + 1])
    child_env = {**os.environ, **(env or {})}
    region = child_env.get("AWS_REGION") or child_env.get("AWS_DEFAULT_REGION") or "us-east-1"
    functions(template, overrides or {}, region)
    return subprocess.run(
        [sys.executable, "-m", "tools.local_invoke", *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env,
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
    assert "-Queue-" in payload["queue"]  # the queue's URL, as CloudFormation (moto's) names it
    assert payload["from_parent"] == "inherited"
    assert payload["helper"] == "from-layer"
    assert payload["function_name"] == payload["lambda_name"]
    assert "-Fn-" in payload["function_name"]
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
        stdin='{"from": "stdin"}', overrides={"Greeting": "bonjour", "FnTimeout": "9"},
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
    spec = resolve(path=app_dir / "template.yaml").functions["Fn"]

    context = make_context(spec, request_id="req-1")
    assert context.aws_request_id == "req-1"
    assert context.function_name == spec.function_name and "-Fn-" in spec.function_name
    assert context.function_version == "$LATEST"
    assert context.invoked_function_arn.endswith(f":function:{spec.function_name}")
    assert context.memory_limit_in_mb == 192
    assert context.log_group_name == f"/aws/lambda/{spec.function_name}"
    assert context.log_stream_name
    assert 4000 < context.get_remaining_time_in_millis() <= 5000
    assert make_context(spec).aws_request_id != make_context(spec).aws_request_id

    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    env = prepare_environment(spec, base={"PATH": "/bin", "GREETING": "parent", "AWS_ENDPOINT_URL": "http://x"})
    assert env["GREETING"] == "hello"
    assert env["PATH"] == "/bin" and env["AWS_ENDPOINT_URL"] == "http://x"
    assert env["AWS_LAMBDA_FUNCTION_NAME"] == spec.function_name
    assert env["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"] == "192"
    assert env["AWS_REGION"] == env["AWS_DEFAULT_REGION"] == "us-east-1"
    assert prepare_environment(spec, base={"AWS_DEFAULT_REGION": "ap-south-1"})["AWS_REGION"] == "ap-south-1"

    overridden = apply_env_vars(spec, {"Fn": {"GREETING": False, "UNDECLARED": "x"}})
    assert apply_env_vars(spec, {spec.function_name: {"MODE": "by-name"}}).environment["MODE"] == "by-name"
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
    spec = resolve(path=app_dir / "template.yaml").functions["Fn"]
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

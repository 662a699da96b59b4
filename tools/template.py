"""template.yaml made into AWS resources by libraries, not by hand: the SAM transform is aws-sam-translator's (the SAM
CLI's), CloudFormation is moto's - CreateStack on the moto server a local stack runs on, or in moto's in-memory mock
for a look-up (:func:`resolve`) - and what a local run needs is read back through the AWS APIs. No intrinsic
function is evaluated here.

What moto's CloudFormation cannot do, handled in :func:`for_moto` (and read back in :func:`create_stack`):

* It has no model for ``AWS::CloudWatch::Alarm``, ``AWS::S3::BucketPolicy``, ``AWS::SQS::QueuePolicy``,
  ``AWS::Lambda::EventInvokeConfig`` and ``AWS::Lambda::Url`` (:data:`MOTO_LACKS`: it would skip them, then fail on
  a GetAtt of one), and its LayerVersion's Ref is no string. Nor does it fire a schedule, and it sends every event
  put on a bus to a rule without a pattern (a schedule rule), failing on its Lambda target. Each of these becomes an
  ``AWS::SSM::Parameter`` holding its properties as JSON (``Fn::ToJsonString``), with the same Condition: moto still
  evaluates them, :attr:`Created.properties` gives what the template makes of each, and the schedules are read from
  them. A GetAtt of one becomes a placeholder (a function URL's: ``https://<id>.lambda-url.<region>.on.aws/``; a
  local stack serves no URL).
* It would run the SQS event source mappings itself (the poll queue's, the create queue's), invoking the function in
  Docker on every message: they are created disabled (the in-process stack plays them).
* A function's code is inline (the code runs from its local directory, which the translated template keeps as the S3
  key of its CodeUri); moto drops a function's layers, architecture and logging config: those are read from the
  translated template, or from ``mirror`` stubs.
* It keeps a ``Ref AWS::NoValue`` inside a list as null (dropped when read back), passes Number parameters on as
  numbers (environment values are read back as strings) and does not evaluate the template's Rules
  (tests/unit/test_template_real_account.py does).
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "template.yaml"
REGION = "us-east-1"
STACK_NAME = "sume-poller"
#: The bucket the functions' and layers' code is "uploaded" to: each CodeUri/ContentUri becomes
#: s3://CODE_BUCKET/<its local path>, so the translated template still says where the code is.
CODE_BUCKET = "sume-poller-local-code"
#: CloudFormation's quota on a template sent in the request ("Template body size in a request"); a
#: larger one is stored in S3 and named by TemplateURL, as ``sam deploy`` does (ministack enforces it).
TEMPLATE_BODY_MAX_BYTES = 51_200
MOTO_LACKS = ("AWS::CloudWatch::Alarm", "AWS::S3::BucketPolicy", "AWS::SQS::QueuePolicy",
              "AWS::Lambda::EventInvokeConfig", "AWS::Lambda::Url", "AWS::Lambda::LayerVersion")
#: The property that names a resource of a type, for ``names`` (tests that want fixed names).
NAME_PROPERTIES = {"AWS::DynamoDB::Table": "TableName", "AWS::SQS::Queue": "QueueName",
                   "AWS::S3::Bucket": "BucketName"}
MIRROR = "{}ResolvedProperties"
Clients = Callable[[str], Any]


def load(path: str | Path = TEMPLATE) -> dict[str, Any]:
    """The template as a dict, short-form tags in long form (the SAM translator's YAML loader)."""
    from samtranslator.yaml_helper import yaml_parse

    document: dict[str, Any] = yaml_parse(Path(path).read_text(encoding="utf-8"))
    return document


def translate(template: Mapping[str, Any], parameters: Mapping[str, Any] | None = None,
              region: str = REGION) -> dict[str, Any]:
    """``template`` after the SAM transform (aws-sam-translator), local code paths kept as S3 keys."""
    import boto3
    from samtranslator.parser.parser import Parser
    from samtranslator.translator.translator import Translator

    document = copy.deepcopy(dict(template))
    for props in (resource.get("Properties") or {} for resource in document.get("Resources", {}).values()):
        for key in ("CodeUri", "ContentUri"):
            if isinstance(props.get(key), str) and not props[key].startswith("s3://"):
                props[key] = f"s3://{CODE_BUCKET}/{props[key]}"
    translator = Translator({}, Parser(), boto_session=boto3.session.Session(region_name=region))
    result: dict[str, Any] = translator.translate(document, {k: str(v) for k, v in (parameters or {}).items()},
                                                  get_managed_policy_map=dict)
    return result


def for_moto(translated: Mapping[str, Any], names: Mapping[str, str] | None = None, mirror: bool = False,
             outputs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The translated template as moto's CloudFormation can create it (see the module docstring); ``names`` sets
    physical names by logical id (tables, queues, buckets); ``mirror`` keeps every resource's properties in a stub
    too (moto drops some properties it does not use: a function's LoggingConfig...), ``outputs`` adds outputs (any
    value to resolve)."""
    stubbed = {lid: r["Type"] for lid, r in translated["Resources"].items() if _stubbed(r)}

    def placeholders(node: Any) -> Any:
        """A copy, a GetAtt of a stubbed resource made a function URL's placeholder or a name."""
        if isinstance(node, list):
            return [placeholders(item) for item in node]
        if not isinstance(node, dict):
            return node
        target = node.get("Fn::GetAtt")
        if len(node) == 1 and isinstance(target, list) and target[0] in stubbed:
            if stubbed[target[0]] == "AWS::Lambda::Url":
                return f"https://{target[0].lower()}.lambda-url.{REGION}.on.aws/"
            return f"stub:{target[0]}.{target[1]}"
        return {key: placeholders(value) for key, value in node.items()}

    document = placeholders({**translated, "Outputs": {**translated.get("Outputs", {}),
                                                       **{k: {"Value": v} for k, v in (outputs or {}).items()}}})
    resources = document["Resources"]

    def stub(lid: str, resource: Mapping[str, Any]) -> dict[str, Any]:
        value = {"Fn::ToJsonString": {"Type": resource["Type"], "Properties": resource.get("Properties") or {}}}
        return {**{k: v for k, v in resource.items() if k == "Condition"}, "Type": "AWS::SSM::Parameter",
                "Properties": {"Name": {"Fn::Sub": f"/cfn-stub/${{AWS::StackName}}/{lid}"}, "Type": "String",
                               "Tier": "Advanced", "Value": value}}

    for lid, resource in list(resources.items()):
        if lid in stubbed:
            resources[lid] = {**stub(lid, resource), **{k: v for k, v in resource.items() if k == "DependsOn"}}
            continue
        if mirror:
            resources[MIRROR.format(lid)] = stub(MIRROR.format(lid), resource)
        if resource["Type"] == "AWS::Lambda::EventSourceMapping":
            resource["Properties"]["Enabled"] = False
        elif resource["Type"] == "AWS::Lambda::Function":
            resource["Properties"]["Code"] = {"ZipFile": "# runs from its local directory (Function.code_dir)"}
    for lid, name in (names or {}).items():
        resources[lid].setdefault("Properties", {})[NAME_PROPERTIES[resources[lid]["Type"]]] = name
    return document


def _stubbed(resource: Mapping[str, Any]) -> bool:
    """moto has no model for its type, or it is a schedule rule: moto fires no schedule, and it sends every event put
    on the bus to a rule without a pattern (failing on a Lambda target)."""
    return resource["Type"] in MOTO_LACKS or (
        resource["Type"] == "AWS::Events::Rule" and "ScheduleExpression" in (resource.get("Properties") or {}))


def _no_values(node: Any) -> Any:
    """moto keeps a ``Ref AWS::NoValue`` in a list as null; CloudFormation drops it."""
    if isinstance(node, list):
        return [_no_values(item) for item in node if item is not None]
    return {k: _no_values(v) for k, v in node.items()} if isinstance(node, dict) else node


def _stub_properties(client: Clients, names: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Logical id -> resolved properties, from the stubs named (logical id by parameter name)."""
    found: dict[str, dict[str, Any]] = {}
    for start in range(0, len(names), 10):
        reply = client("ssm").get_parameters(Names=list(names)[start:start + 10])
        found.update({names[p["Name"]]: _no_values(json.loads(p["Value"])["Properties"]) for p in reply["Parameters"]})
    return found


@dataclass(frozen=True)
class Function:
    """What running one function locally needs: its configuration as the stack created it, and what moto leaves out of
    that, from the translated template."""

    logical_id: str
    function_name: str
    handler: str
    code_dir: Path
    layer_dirs: list[Path] = field(default_factory=list)
    runtime: str = "python3.13"
    timeout: int = 3
    memory: int = 128
    environment: dict[str, str] = field(default_factory=dict)
    architectures: list[str] = field(default_factory=lambda: ["x86_64"])
    reserved_concurrency: int | None = None
    function_arn: str = ""


@dataclass
class Created:
    """A stack created from the template: its outputs, each resource's physical id by logical id
    (``created["PollQueue"]``: the queue's URL), the functions, the schedules (function logical id -> schedule
    expression) and the poll queue's event source mapping."""

    translated: dict[str, Any]
    outputs: dict[str, str]
    resources: dict[str, str]
    types: dict[str, str]
    functions: dict[str, Function]
    schedules: dict[str, str]
    mappings: dict[str, dict[str, Any]]
    client: Clients

    @cached_property
    def properties(self) -> dict[str, dict[str, Any]]:
        """Logical id -> properties as the template resolves them, of each resource moto has no model for (and of every
        resource, where the stack was created with ``mirror``)."""
        stubs = {lid: lid for lid, r in self.translated["Resources"].items() if _stubbed(r)}
        stubs.update({MIRROR.format(lid): lid for lid in self.translated["Resources"]})
        return _stub_properties(self.client, {name: stubs[lid] for lid, name in self.resources.items() if lid in stubs})

    def __getitem__(self, logical_id: str) -> str:
        return self.resources[logical_id]

    def of_type(self, resource_type: str) -> dict[str, str]:
        return {lid: physical for lid, physical in self.resources.items() if self.types[lid] == resource_type}


#: What tests that only need the table, queues and bucket call the result.
Provisioned = Created


def _template_source(client: Clients, stack_name: str, document: Mapping[str, Any]) -> dict[str, str]:
    """CreateStack's ``TemplateBody``, or over :data:`TEMPLATE_BODY_MAX_BYTES` its ``TemplateURL``: the
    template put in :data:`CODE_BUCKET` first (a path-style URL, which moto and ministack both read)."""
    body = json.dumps(document, separators=(",", ":"))
    if len(body.encode()) <= TEMPLATE_BODY_MAX_BYTES:
        return {"TemplateBody": body}
    s3, key = client("s3"), f"templates/{stack_name}-{uuid.uuid4().hex[:8]}.json"
    if CODE_BUCKET not in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
        region = s3.meta.region_name
        s3.create_bucket(Bucket=CODE_BUCKET, **({} if region == "us-east-1" else
                                                {"CreateBucketConfiguration": {"LocationConstraint": region}}))
    s3.put_object(Bucket=CODE_BUCKET, Key=key, Body=body.encode())
    return {"TemplateURL": f"https://s3.amazonaws.com/{CODE_BUCKET}/{key}"}


def create_stack(client: Clients, translated: Mapping[str, Any], parameters: Mapping[str, Any] | None = None, *,
                 stack_name: str = STACK_NAME, names: Mapping[str, str] | None = None, base_dir: Path = ROOT,
                 mirror: bool = False, outputs: Mapping[str, Any] | None = None) -> Created:
    """CreateStack of the translated template on a moto endpoint (``client(service)`` gives its clients), then what it
    made, read back through the AWS APIs (see :func:`for_moto`)."""
    document = for_moto(translated, names, mirror, outputs)
    cfn, lam, resources = client("cloudformation"), client("lambda"), translated["Resources"]
    cfn.create_stack(StackName=stack_name, **_template_source(client, stack_name, document),
                     Parameters=[{"ParameterKey": k, "ParameterValue": str(v)} for k, v in (parameters or {}).items()],
                     Capabilities=["CAPABILITY_IAM", "CAPABILITY_AUTO_EXPAND"])
    stack = cfn.describe_stacks(StackName=stack_name)["Stacks"][0]
    if stack["StackStatus"] != "CREATE_COMPLETE":
        raise RuntimeError(f"stack {stack_name} is {stack['StackStatus']}: {stack.get('StackStatusReason')}")
    listed = cfn.describe_stack_resources(StackName=stack_name)["StackResources"]
    # moto lists a resource whose Condition is false as an empty entry
    physical = {r["LogicalResourceId"]: r.get("PhysicalResourceId") for r in listed if "LogicalResourceId" in r}
    types = {lid: str((resources.get(lid) or document["Resources"][lid])["Type"]) for lid in physical}
    configs = {c["FunctionName"]: c for c in lam.list_functions()["Functions"]}
    functions: dict[str, Function] = {}
    for lid in (lid for lid, t in types.items() if t == "AWS::Lambda::Function"):
        conf, props = configs[physical[lid]], resources[lid]["Properties"]
        layers = [resources[ref["Ref"]]["Properties"]["Content"] for ref in props.get("Layers", [])
                  if isinstance(ref, dict) and ref.get("Ref") in resources]
        reserved = lam.get_function_concurrency(FunctionName=conf["FunctionName"]).get("ReservedConcurrentExecutions")
        functions[lid] = Function(
            logical_id=lid, function_name=conf["FunctionName"], handler=conf["Handler"],
            code_dir=(base_dir / props["Code"]["S3Key"]).resolve(),
            layer_dirs=[(base_dir / layer["S3Key"]).resolve() for layer in layers], runtime=conf["Runtime"],
            timeout=int(conf["Timeout"]), memory=int(conf["MemorySize"]),
            environment={k: str(v) for k, v in ((conf.get("Environment") or {}).get("Variables") or {}).items()},
            architectures=list(props.get("Architectures", ["x86_64"])), reserved_concurrency=reserved,
            function_arn=conf["FunctionArn"])
    by_arn = {f.function_arn: lid for lid, f in functions.items()}
    rules = {physical[lid]: lid for lid in physical if types[lid] == "AWS::Events::Rule" and _stubbed(resources[lid])}
    schedules = {by_arn[target["Arn"]]: rule["ScheduleExpression"] for rule in _stub_properties(client, rules).values()
                 for target in rule.get("Targets", []) if target["Arn"] in by_arn}
    mappings = {by_arn[m["FunctionArn"]]: m for m in lam.list_event_source_mappings()["EventSourceMappings"]
                if m.get("FunctionArn") in by_arn}
    outputs = {o["OutputKey"]: str(o["OutputValue"]) for o in stack.get("Outputs", [])}
    return Created(dict(translated), outputs, physical, types, functions, schedules, mappings, client)


@cache  # a client parses botocore's model of its service: a tenth of a second each
def aws_clients(endpoint_url: str | None = None, region: str = REGION) -> Clients:
    """``client(service)`` with dummy credentials, one client per service: on ``endpoint_url`` (a local stack's), else
    on AWS's own endpoints whatever AWS_ENDPOINT_URL says (where moto's in-memory mock answers)."""
    import boto3
    from botocore.config import Config

    session: Any = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                         region_name=region)
    config = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=60,
                    max_pool_connections=20, ignore_configured_endpoint_urls=endpoint_url is None)
    return cache(lambda service: session.client(service, endpoint_url=endpoint_url, config=config))


_load = cache(load)


@cache
def _resolved(path: Path, parameters: tuple[tuple[str, str], ...], region: str, outputs: str) -> Created:
    from moto import mock_aws

    from tools.services import speed_up_moto

    speed_up_moto()
    with mock_aws():  # moto's in-memory AWS, in this process
        client = aws_clients(region=region)
        created = create_stack(client, translate(_load(path), dict(parameters), region), dict(parameters),
                               stack_name=f"{STACK_NAME}-{uuid.uuid4().hex[:6]}", base_dir=path.parent, mirror=True,
                               outputs=json.loads(outputs))
        created.properties  # noqa: B018 - read while the mock is there
        return created


def resolve(parameters: Mapping[str, Any] | None = None, path: str | Path = TEMPLATE, region: str = REGION,
            outputs: Mapping[str, Any] | None = None) -> Created:
    """The template created with ``parameters`` in moto's in-memory mock (cached per arguments): what it resolves to -
    every resource's properties too (``mirror``), and ``outputs`` added to its own (any expression: moto evaluates
    it) - without any running service."""
    key = tuple(sorted((k, str(v)) for k, v in (parameters or {}).items()))
    return _resolved(Path(path).resolve(), key, region, json.dumps(outputs or {}, sort_keys=True))

"""Read the SAM template the way CloudFormation/SAM would, without AWS.

* :func:`load_template` parses YAML with the short-form intrinsic tags (``!Ref``, ``!GetAtt``,
  ``!Sub``...) turned into their long forms (``{"Ref": ...}``, ``{"Fn::GetAtt": [...]}``...).
* :class:`Resolver` evaluates intrinsics against parameter values, pseudo parameters, conditions
  and (optionally) the physical names/attributes of resources created locally.
* :func:`function_spec` merges ``Globals.Function`` into one ``AWS::Serverless::Function`` and
  resolves what a local invoke needs (handler, code and layer dirs, timeout, environment).
* :func:`provision` creates the template's DynamoDB tables and SQS queues, from the template's own
  properties, in a local AWS endpoint (moto server, ministack) and binds their real names/ARNs
  into the resolver.
"""

from __future__ import annotations

import base64
import copy
import ipaddress
import json
import re
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "NO_VALUE",
    "FunctionSpec",
    "Resolver",
    "Template",
    "function_spec",
    "functions",
    "load_template",
    "provision",
]

STACK_NAME = "sume-poller"

# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


class Template(dict[str, Any]):
    """A parsed template (a plain ``dict``) that remembers the file it was read from."""

    path: Path | None = None

    @property
    def base_dir(self) -> Path:
        """Directory that relative ``CodeUri``/``ContentUri`` paths are taken from."""
        return self.path.parent if self.path is not None else Path.cwd()


_TAGS_WITH_FN_PREFIX = {
    "Base64", "Cidr", "And", "Equals", "FindInMap", "GetAtt", "GetAZs", "If", "ImportValue",
    "Join", "Not", "Or", "Select", "Split", "Sub", "Transform", "Length", "ToJsonString",
}  # fmt: skip


class _TemplateLoader(yaml.SafeLoader):  # type: ignore[misc]
    """SafeLoader that understands CloudFormation short-form tags and keeps dates as strings."""


def _construct_intrinsic(loader: yaml.SafeLoader, tag_suffix: str, node: yaml.Node) -> dict[str, Any]:
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    elif isinstance(node, yaml.MappingNode):
        value = loader.construct_mapping(node, deep=True)
    else:  # pragma: no cover - yaml has no other node kinds
        raise yaml.constructor.ConstructorError(
            None, None, f"unexpected node for !{tag_suffix}", node.start_mark
        )
    if tag_suffix in ("Ref", "Condition"):
        return {tag_suffix: value}
    if tag_suffix not in _TAGS_WITH_FN_PREFIX:
        raise yaml.constructor.ConstructorError(None, None, f"unknown tag !{tag_suffix}", node.start_mark)
    if tag_suffix == "GetAtt" and isinstance(value, str):
        logical_id, _, attribute = value.partition(".")
        value = [logical_id, attribute]
    return {f"Fn::{tag_suffix}": value}


def _construct_str(loader: yaml.SafeLoader, node: yaml.Node) -> str:
    assert isinstance(node, yaml.ScalarNode)
    return str(loader.construct_scalar(node))


_TemplateLoader.add_multi_constructor("!", _construct_intrinsic)
_TemplateLoader.add_constructor("tag:yaml.org,2002:timestamp", _construct_str)


def load_template(path: str | Path = "template.yaml") -> Template:
    """Parse a CloudFormation/SAM template (YAML or JSON) into long-form intrinsics."""
    path = Path(path).resolve()
    with path.open(encoding="utf-8") as handle:
        data = yaml.load(handle, Loader=_TemplateLoader)  # noqa: S506 - SafeLoader subclass
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a template must be a mapping, got {type(data).__name__}")
    template = Template(data)
    template.path = path
    return template


# ---------------------------------------------------------------------------------------------
# Resolving intrinsics
# ---------------------------------------------------------------------------------------------


class _NoValue:
    """``AWS::NoValue``: the key or list item holding it disappears."""

    _instance: _NoValue | None = None

    def __new__(cls) -> _NoValue:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NO_VALUE"


NO_VALUE: Any = _NoValue()

_SUB_VARIABLE = re.compile(r"\$\{([^}]*)\}")

_PSEUDO_PARAMETERS = {
    "AWS::Region", "AWS::AccountId", "AWS::Partition", "AWS::StackName", "AWS::StackId",
    "AWS::URLSuffix", "AWS::NotificationARNs", "AWS::NoValue",
}  # fmt: skip


def _is_intrinsic(value: Any) -> bool:
    if not isinstance(value, dict) or len(value) != 1:
        return False
    key = str(next(iter(value)))
    return key == "Ref" or key.startswith("Fn::")


def _scalar_str(value: Any, where: str) -> str:
    """CloudFormation turns scalars into strings where a string is expected."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise ValueError(f"{where}: expected a string, got {value!r}")


class Resolver:
    """Evaluate intrinsic functions of one template.

    ``parameters`` override parameter defaults; ``resources`` maps a logical id to what ``Ref``
    returns for it (default: the logical id itself, like ``sam local``); ``attributes`` maps
    ``"Logical.Attr"`` to what ``Fn::GetAtt`` returns (default: a plausible placeholder).
    """

    def __init__(
        self,
        template: Mapping[str, Any],
        parameters: Mapping[str, str] | None = None,
        resources: Mapping[str, str] | None = None,
        attributes: Mapping[str, str] | None = None,
        region: str = "us-east-1",
        account_id: str = "123456789012",
    ) -> None:
        self.template = template
        self.parameters: dict[str, str] = dict(parameters or {})
        self.resources: dict[str, str] = dict(resources or {})
        self.attributes: dict[str, str] = dict(attributes or {})
        self.region = region
        self.account_id = account_id
        declared = template.get("Parameters") or {}
        unknown = sorted(set(self.parameters) - set(declared))
        if unknown:
            raise ValueError(f"parameters not declared in the template: {', '.join(unknown)}")
        self._conditions: dict[str, bool] = {}
        self._evaluating: set[str] = set()

    # -- public ---------------------------------------------------------------------------------

    def bind(self, logical_id: str, ref_value: str, attrs: Mapping[str, str] | None = None) -> None:
        """Record the physical ``Ref`` value and ``GetAtt`` attributes of a created resource."""
        self.resources[logical_id] = ref_value
        for attribute, value in (attrs or {}).items():
            self.attributes[f"{logical_id}.{attribute}"] = value

    def resolve(self, value: Any) -> Any:
        """Recursively evaluate intrinsics in ``value`` (a top-level ``AWS::NoValue`` gives None)."""
        result = self._resolve(value)
        return None if result is NO_VALUE else result

    def condition(self, name: str) -> bool:
        """Value of the named entry of the template's ``Conditions``."""
        if name in self._conditions:
            return self._conditions[name]
        conditions = self.template.get("Conditions") or {}
        if name not in conditions:
            raise KeyError(f"condition {name!r} is not defined in Conditions")
        if name in self._evaluating:
            raise ValueError(f"condition {name!r} refers to itself")
        self._evaluating.add(name)
        try:
            result = self._evaluate_condition(conditions[name])
        finally:
            self._evaluating.discard(name)
        self._conditions[name] = result
        return result

    def parameter(self, name: str) -> str | list[str]:
        """Value of a template parameter: override, else Default (lists for list types)."""
        declared = self.template.get("Parameters") or {}
        if name not in declared:
            raise KeyError(f"parameter {name!r} is not declared")
        spec = declared[name] or {}
        if name in self.parameters:
            raw: Any = self.parameters[name]
        elif "Default" in spec:
            raw = spec["Default"]
        else:
            raise ValueError(f"parameter {name!r} has no Default and no override")
        param_type = str(spec.get("Type", "String"))
        if param_type == "CommaDelimitedList" or param_type.startswith("List<"):
            if isinstance(raw, list):
                return [_scalar_str(item, name) for item in raw]
            return [item.strip() for item in _scalar_str(raw, name).split(",")]
        return _scalar_str(raw, name)

    # -- internals ------------------------------------------------------------------------------

    def _resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            items = (self._resolve(item) for item in value)
            return [item for item in items if item is not NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            key, arg = next(iter(value.items()))
            handler = self._INTRINSICS.get(key)
            if handler is not None:
                return handler(self, arg)
            if key == "Condition" and isinstance(arg, str) and arg in (self.template.get("Conditions") or {}):
                return self.condition(arg)
        resolved = {k: self._resolve(v) for k, v in value.items()}
        return {k: v for k, v in resolved.items() if v is not NO_VALUE}

    def _resources(self) -> Mapping[str, Any]:
        return self.template.get("Resources") or {}

    def _ref(self, name: Any) -> Any:
        name = self._resolve(name)
        if not isinstance(name, str):
            raise ValueError(f"Ref needs a name, got {name!r}")
        if name == "AWS::NoValue":
            return NO_VALUE
        if name in _PSEUDO_PARAMETERS:
            return self._pseudo(name)
        if name in (self.template.get("Parameters") or {}):
            return self.parameter(name)
        if name in self.resources:
            return self.resources[name]
        if name in self._resources():
            return name
        raise ValueError(f"Ref to unknown parameter or resource {name!r}")

    def _pseudo(self, name: str) -> Any:
        return {
            "AWS::Region": self.region,
            "AWS::AccountId": self.account_id,
            "AWS::Partition": "aws",
            "AWS::StackName": STACK_NAME,
            "AWS::StackId": (
                f"arn:aws:cloudformation:{self.region}:{self.account_id}:stack/{STACK_NAME}/"
                "00000000-0000-0000-0000-000000000000"
            ),
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::NotificationARNs": [],
        }[name]

    def _get_att(self, arg: Any) -> Any:
        arg = self._resolve(arg)
        if isinstance(arg, str):
            arg = arg.split(".", 1)
        if not (isinstance(arg, list) and len(arg) == 2 and all(isinstance(a, str) for a in arg)):
            raise ValueError(f"Fn::GetAtt needs [LogicalId, Attribute], got {arg!r}")
        logical_id, attribute = arg
        key = f"{logical_id}.{attribute}"
        if key in self.attributes:
            return self.attributes[key]
        resource = self._resources().get(logical_id)
        if resource is None:
            raise ValueError(f"Fn::GetAtt of unknown resource {logical_id!r}")
        return self._placeholder_attribute(logical_id, str(resource.get("Type", "")), attribute)

    def _placeholder_attribute(self, logical_id: str, resource_type: str, attribute: str) -> str:
        region, account = self.region, self.account_id
        name = self.resources.get(logical_id, logical_id)
        if resource_type == "AWS::SQS::Queue":
            if name.startswith(("http://", "https://")):  # bound to a queue URL
                name = name.rstrip("/").rsplit("/", 1)[-1]
            return {
                "Arn": f"arn:aws:sqs:{region}:{account}:{name}",
                "QueueName": name,
                "QueueUrl": f"https://sqs.{region}.amazonaws.com/{account}/{name}",
            }.get(attribute, f"{name}.{attribute}")
        if resource_type == "AWS::DynamoDB::Table":
            arn = f"arn:aws:dynamodb:{region}:{account}:table/{name}"
            return {"Arn": arn, "StreamArn": f"{arn}/stream/1970-01-01T00:00:00.000"}.get(
                attribute, f"{name}.{attribute}"
            )
        if resource_type in ("AWS::Serverless::Function", "AWS::Lambda::Function") and attribute == "Arn":
            return f"arn:aws:lambda:{region}:{account}:function:{name}"
        if attribute.endswith("Arn"):
            parts = resource_type.split("::")
            service = parts[1].lower() if len(parts) > 1 else "unknown"
            return f"arn:aws:{service}:{region}:{account}:{name}"
        if attribute.endswith("Name"):
            return name
        return f"{name}.{attribute}"

    def _sub(self, arg: Any) -> str:
        variables: dict[str, Any] = {}
        if isinstance(arg, list):
            if len(arg) != 2 or not isinstance(arg[1], dict):
                raise ValueError(f"Fn::Sub list form needs [string, {{variables}}], got {arg!r}")
            text = self._resolve(arg[0])
            variables = {k: self._resolve(v) for k, v in arg[1].items()}
        else:
            text = self._resolve(arg)
        if not isinstance(text, str):
            raise ValueError(f"Fn::Sub needs a string, got {text!r}")

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name.startswith("!"):
                return "${" + name[1:] + "}"
            name = name.strip()
            if name in variables:
                value = variables[name]
            elif "." in name and not name.startswith("AWS::"):
                value = self._get_att(name.split(".", 1))
            else:
                value = self._ref(name)
            return _scalar_str(value, f"Fn::Sub ${{{name}}}")

        return _SUB_VARIABLE.sub(replace, text)

    def _join(self, arg: Any) -> str:
        arg = self._resolve(arg)
        if not (isinstance(arg, list) and len(arg) == 2 and isinstance(arg[1], list)):
            raise ValueError(f"Fn::Join needs [delimiter, [values]], got {arg!r}")
        delimiter = _scalar_str(arg[0], "Fn::Join delimiter")
        return delimiter.join(_scalar_str(item, "Fn::Join item") for item in arg[1])

    def _if(self, arg: Any) -> Any:
        if not (isinstance(arg, list) and len(arg) == 3):
            raise ValueError(f"Fn::If needs [condition, then, else], got {arg!r}")
        name = self._resolve(arg[0])
        return self._resolve(arg[1] if self.condition(name) else arg[2])

    def _select(self, arg: Any) -> Any:
        arg = self._resolve(arg)
        if not (isinstance(arg, list) and len(arg) == 2 and isinstance(arg[1], list)):
            raise ValueError(f"Fn::Select needs [index, [values]], got {arg!r}")
        return arg[1][int(arg[0])]

    def _split(self, arg: Any) -> list[str]:
        arg = self._resolve(arg)
        if not (isinstance(arg, list) and len(arg) == 2):
            raise ValueError(f"Fn::Split needs [delimiter, string], got {arg!r}")
        return _scalar_str(arg[1], "Fn::Split source").split(_scalar_str(arg[0], "Fn::Split delimiter"))

    def _find_in_map(self, arg: Any) -> Any:
        arg = self._resolve(arg)
        if not (isinstance(arg, list) and len(arg) in (3, 4)):
            raise ValueError(f"Fn::FindInMap needs [map, top key, second key], got {arg!r}")
        mappings = self.template.get("Mappings") or {}
        try:
            return mappings[arg[0]][arg[1]][arg[2]]
        except KeyError:
            if len(arg) == 4 and isinstance(arg[3], dict) and "DefaultValue" in arg[3]:
                return arg[3]["DefaultValue"]
            raise

    def _base64(self, arg: Any) -> str:
        text = _scalar_str(self._resolve(arg), "Fn::Base64")
        return base64.b64encode(text.encode()).decode()

    def _get_azs(self, arg: Any) -> list[str]:
        region = self._resolve(arg) or self.region
        return [f"{region}{zone}" for zone in "abc"]

    def _import_value(self, arg: Any) -> str:
        return f"imported:{_scalar_str(self._resolve(arg), 'Fn::ImportValue')}"

    def _cidr(self, arg: Any) -> list[str]:
        arg = self._resolve(arg)
        if not (isinstance(arg, list) and len(arg) == 3):
            raise ValueError(f"Fn::Cidr needs [ipBlock, count, cidrBits], got {arg!r}")
        network = ipaddress.ip_network(_scalar_str(arg[0], "Fn::Cidr"), strict=False)
        count, bits = int(arg[1]), int(arg[2])
        subnets = network.subnets(new_prefix=network.max_prefixlen - bits)
        return [str(subnet) for _, subnet in zip(range(count), subnets, strict=False)]

    def _length(self, arg: Any) -> int:
        value = self._resolve(arg)
        if not isinstance(value, list):
            raise ValueError(f"Fn::Length needs a list, got {value!r}")
        return len(value)

    def _to_json_string(self, arg: Any) -> str:
        return json.dumps(self._resolve(arg), separators=(",", ":"))

    def _evaluate_condition(self, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not (isinstance(value, dict) and len(value) == 1):
            raise ValueError(f"not a condition: {value!r}")
        key, arg = next(iter(value.items()))
        if key == "Condition":
            return self.condition(self._resolve(arg))
        if key == "Fn::Equals":
            left, right = (self._resolve(item) for item in arg)
            return bool(_normalise(left) == _normalise(right))
        if key == "Fn::Not":
            (inner,) = arg
            return not self._evaluate_condition(inner)
        if key == "Fn::And":
            return all(self._evaluate_condition(item) for item in arg)
        if key == "Fn::Or":
            return any(self._evaluate_condition(item) for item in arg)
        if key == "Fn::If":
            return self._evaluate_condition(self._if(arg))
        raise ValueError(f"not a condition function: {key}")

    _INTRINSICS: Mapping[str, Any] = {
        "Ref": _ref,
        "Fn::GetAtt": _get_att,
        "Fn::Sub": _sub,
        "Fn::Join": _join,
        "Fn::If": _if,
        "Fn::Select": _select,
        "Fn::Split": _split,
        "Fn::FindInMap": _find_in_map,
        "Fn::Base64": _base64,
        "Fn::GetAZs": _get_azs,
        "Fn::ImportValue": _import_value,
        "Fn::Cidr": _cidr,
        "Fn::Length": _length,
        "Fn::ToJsonString": _to_json_string,
        "Fn::Equals": lambda self, arg: self._evaluate_condition({"Fn::Equals": arg}),
        "Fn::Not": lambda self, arg: self._evaluate_condition({"Fn::Not": arg}),
        "Fn::And": lambda self, arg: self._evaluate_condition({"Fn::And": arg}),
        "Fn::Or": lambda self, arg: self._evaluate_condition({"Fn::Or": arg}),
    }


def _normalise(value: Any) -> Any:
    """Compare like CloudFormation: scalars as strings, lists item by item."""
    if isinstance(value, list):
        return [_normalise(item) for item in value]
    if isinstance(value, bool | str | int | float):
        return _scalar_str(value, "Fn::Equals")
    return value


# ---------------------------------------------------------------------------------------------
# Functions
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FunctionSpec:
    """What is needed to run one ``AWS::Serverless::Function`` locally."""

    logical_id: str
    function_name: str
    handler: str
    code_dir: Path
    layer_dirs: list[Path] = field(default_factory=list)
    runtime: str = "python3.11"
    timeout: int = 3
    memory: int = 128
    environment: dict[str, str] = field(default_factory=dict)
    architectures: list[str] = field(default_factory=lambda: ["x86_64"])


def functions(template: Mapping[str, Any]) -> list[str]:
    """Logical ids of the template's ``AWS::Serverless::Function`` resources, in template order."""
    resources = template.get("Resources") or {}
    return [lid for lid, res in resources.items() if (res or {}).get("Type") == "AWS::Serverless::Function"]


def _merge_globals(global_value: Any, local_value: Any) -> Any:
    """SAM's Globals merge: maps merge key by key, lists concatenate (Globals first), else local wins.

    A value that is an intrinsic function (e.g. ``!If``) is treated as a primitive.
    """
    if (
        isinstance(global_value, dict)
        and isinstance(local_value, dict)
        and not _is_intrinsic(global_value)
        and not _is_intrinsic(local_value)
    ):
        merged = copy.deepcopy(global_value)
        for key, value in local_value.items():
            merged[key] = _merge_globals(merged[key], value) if key in merged else copy.deepcopy(value)
        return merged
    if isinstance(global_value, list) and isinstance(local_value, list):
        return copy.deepcopy(global_value) + copy.deepcopy(local_value)
    return copy.deepcopy(local_value)


def merged_function_properties(template: Mapping[str, Any], logical_id: str) -> dict[str, Any]:
    """A function's Properties with ``Globals.Function`` merged in (unresolved)."""
    resources = template.get("Resources") or {}
    resource = resources.get(logical_id)
    if not resource or resource.get("Type") != "AWS::Serverless::Function":
        raise KeyError(f"{logical_id!r} is not an AWS::Serverless::Function of the template")
    global_props = ((template.get("Globals") or {}).get("Function")) or {}
    props = resource.get("Properties") or {}
    return dict(_merge_globals(global_props, props))


def _env_str(name: str, value: Any) -> str | None:
    if value is None or value is NO_VALUE:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise ValueError(f"environment variable {name} resolved to a non-scalar: {value!r}")


def _local_dir(uri: Any, base_dir: Path, what: str) -> Path:
    if not isinstance(uri, str):
        raise ValueError(f"{what} must be a local path to run locally, got {uri!r}")
    if uri.startswith("s3://"):
        raise ValueError(f"{what} {uri!r} is in S3; only local paths can be run locally")
    return (base_dir / uri).resolve()


def function_spec(
    template: Mapping[str, Any],
    logical_id: str,
    resolver: Resolver,
    base_dir: Path | None = None,
) -> FunctionSpec:
    """Resolve one function (Globals merged) into a :class:`FunctionSpec`.

    Relative ``CodeUri``/``ContentUri`` are taken from ``base_dir``, by default the directory of
    the template file (for a :class:`Template`) or the current directory.
    """
    if base_dir is None:
        base_dir = template.base_dir if isinstance(template, Template) else Path.cwd()
    props = merged_function_properties(template, logical_id)
    resources = template.get("Resources") or {}

    if "CodeUri" not in props:
        raise ValueError(f"{logical_id}: no CodeUri (InlineCode/ImageUri functions cannot be run locally)")
    code_dir = _local_dir(resolver.resolve(props["CodeUri"]), base_dir, f"{logical_id}.CodeUri")

    layer_dirs: list[Path] = []
    for layer in props.get("Layers") or []:
        if isinstance(layer, dict) and set(layer) == {"Ref"} and isinstance(layer["Ref"], str):
            layer_resource = resources.get(layer["Ref"]) or {}
            if layer_resource.get("Type") == "AWS::Serverless::LayerVersion":
                content_uri = (layer_resource.get("Properties") or {}).get("ContentUri")
                layer_dirs.append(
                    _local_dir(resolver.resolve(content_uri), base_dir, f"{layer['Ref']}.ContentUri")
                )
        # Layer ARNs (published elsewhere) cannot be run locally: ignored, like a missing layer.

    environment: dict[str, str] = {}
    env_block = resolver.resolve(props.get("Environment")) or {}
    for name, value in (env_block.get("Variables") or {}).items():
        text = _env_str(name, value)
        if text is not None:
            environment[name] = text

    function_name = resolver.resolve(props.get("FunctionName")) or logical_id
    return FunctionSpec(
        logical_id=logical_id,
        function_name=str(function_name),
        handler=str(resolver.resolve(props.get("Handler", "app.lambda_handler"))),
        code_dir=code_dir,
        layer_dirs=layer_dirs,
        runtime=str(resolver.resolve(props.get("Runtime", "python3.11"))),
        timeout=int(resolver.resolve(props.get("Timeout", 3))),
        memory=int(resolver.resolve(props.get("MemorySize", 128))),
        environment=environment,
        architectures=[str(a) for a in resolver.resolve(props.get("Architectures", ["x86_64"]))],
    )


# ---------------------------------------------------------------------------------------------
# Provisioning tables and queues in a local endpoint
# ---------------------------------------------------------------------------------------------

_PROVISIONED_TYPES = ("AWS::DynamoDB::Table", "AWS::SQS::Queue")


def _references(value: Any) -> Iterator[str]:
    """Logical ids a value refers to through Ref, Fn::GetAtt or Fn::Sub."""
    if isinstance(value, list):
        for item in value:
            yield from _references(item)
    elif isinstance(value, dict):
        for key, arg in value.items():
            if key == "Ref" and isinstance(arg, str):
                yield arg
            elif key == "Fn::GetAtt":
                if isinstance(arg, str):
                    yield arg.split(".", 1)[0]
                elif isinstance(arg, list) and arg and isinstance(arg[0], str):
                    yield arg[0]
            elif key == "Fn::Sub":
                text = arg[0] if isinstance(arg, list) and arg else arg
                if isinstance(text, str):
                    for match in _SUB_VARIABLE.finditer(text):
                        if not match.group(1).startswith("!"):
                            yield match.group(1).strip().split(".", 1)[0]
                if isinstance(arg, list):
                    yield from _references(arg[1:])
            else:
                yield from _references(arg)


def _creation_order(resources: Mapping[str, Any], wanted: list[str]) -> list[str]:
    """Topological order of ``wanted`` by their references and DependsOn among themselves."""
    wanted_set = set(wanted)
    deps: dict[str, set[str]] = {}
    for lid in wanted:
        resource = resources[lid]
        depends_on = resource.get("DependsOn") or []
        if isinstance(depends_on, str):
            depends_on = [depends_on]
        refs = set(_references(resource.get("Properties") or {})) | set(depends_on)
        deps[lid] = (refs & wanted_set) - {lid}
    order: list[str] = []
    state: dict[str, int] = {}

    def visit(lid: str, chain: tuple[str, ...]) -> None:
        if state.get(lid) == 2:
            return
        if state.get(lid) == 1:
            raise ValueError(f"circular dependency: {' -> '.join((*chain, lid))}")
        state[lid] = 1
        for dep in sorted(deps[lid], key=wanted.index):
            visit(dep, (*chain, lid))
        state[lid] = 2
        order.append(lid)

    for lid in wanted:
        visit(lid, ())
    return order


def _physical_name(logical_id: str, names: Mapping[str, str], explicit: Any, fifo: bool = False) -> str:
    if logical_id in names:
        return names[logical_id]
    if isinstance(explicit, str) and explicit:
        return explicit
    name = f"{STACK_NAME}-{logical_id}-{uuid.uuid4().hex[:8]}"
    return f"{name}.fifo" if fifo else name


def _throughput(value: Mapping[str, Any] | None) -> dict[str, int] | None:
    if not value:
        return None
    return {
        "ReadCapacityUnits": int(value["ReadCapacityUnits"]),
        "WriteCapacityUnits": int(value["WriteCapacityUnits"]),
    }


def _create_table(client: Any, name: str, props: Mapping[str, Any]) -> dict[str, str]:
    billing_mode = props.get("BillingMode", "PROVISIONED")
    request: dict[str, Any] = {
        "TableName": name,
        "KeySchema": props["KeySchema"],
        "AttributeDefinitions": props["AttributeDefinitions"],
        "BillingMode": billing_mode,
    }
    if billing_mode == "PROVISIONED":
        request["ProvisionedThroughput"] = _throughput(props.get("ProvisionedThroughput")) or {
            "ReadCapacityUnits": 5,
            "WriteCapacityUnits": 5,
        }
    gsis = []
    for gsi in props.get("GlobalSecondaryIndexes") or []:
        index: dict[str, Any] = {
            "IndexName": gsi["IndexName"],
            "KeySchema": gsi["KeySchema"],
            "Projection": gsi.get("Projection") or {"ProjectionType": "ALL"},
        }
        if billing_mode == "PROVISIONED":
            index["ProvisionedThroughput"] = _throughput(gsi.get("ProvisionedThroughput")) or {
                "ReadCapacityUnits": 5,
                "WriteCapacityUnits": 5,
            }
        gsis.append(index)
    if gsis:
        request["GlobalSecondaryIndexes"] = gsis
    lsis = [
        {"IndexName": lsi["IndexName"], "KeySchema": lsi["KeySchema"], "Projection": lsi["Projection"]}
        for lsi in props.get("LocalSecondaryIndexes") or []
    ]
    if lsis:
        request["LocalSecondaryIndexes"] = lsis
    sse = props.get("SSESpecification")
    if sse:
        request["SSESpecification"] = {
            k: v
            for k, v in {
                "Enabled": bool(sse.get("SSEEnabled", False)),
                "SSEType": sse.get("SSEType"),
                "KMSMasterKeyId": sse.get("KMSMasterKeyId"),
            }.items()
            if v is not None
        }
    stream = props.get("StreamSpecification")
    if stream and stream.get("StreamViewType"):
        request["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": stream["StreamViewType"]}
    for key in ("TableClass", "DeletionProtectionEnabled"):
        if key in props:
            request[key] = props[key]
    if props.get("Tags"):
        request["Tags"] = [{"Key": str(t["Key"]), "Value": str(t["Value"])} for t in props["Tags"]]

    description = client.create_table(**request)["TableDescription"]
    deadline = time.monotonic() + 30
    while description.get("TableStatus") not in (None, "ACTIVE"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"table {name} still {description['TableStatus']} after 30 s")
        time.sleep(0.1)
        description = client.describe_table(TableName=name)["Table"]

    pitr = props.get("PointInTimeRecoverySpecification") or {}
    if pitr.get("PointInTimeRecoveryEnabled"):
        client.update_continuous_backups(
            TableName=name,
            PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True},
        )
    ttl = props.get("TimeToLiveSpecification") or {}
    if ttl.get("Enabled") and ttl.get("AttributeName"):
        client.update_time_to_live(
            TableName=name,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": ttl["AttributeName"]},
        )
    attrs = {"Arn": description["TableArn"]}
    if description.get("LatestStreamArn"):
        attrs["StreamArn"] = description["LatestStreamArn"]
    return attrs


_QUEUE_ATTRIBUTES = (
    "ContentBasedDeduplication", "DeduplicationScope", "DelaySeconds", "FifoQueue",
    "FifoThroughputLimit", "KmsDataKeyReusePeriodSeconds", "KmsMasterKeyId", "MaximumMessageSize",
    "MessageRetentionPeriod", "ReceiveMessageWaitTimeSeconds", "SqsManagedSseEnabled",
    "VisibilityTimeout",
)  # fmt: skip


def _create_queue(client: Any, name: str, props: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    attributes: dict[str, str] = {}
    for key in _QUEUE_ATTRIBUTES:
        if key in props and props[key] is not None:
            attributes[key] = _scalar_str(props[key], key)
    for key in ("RedrivePolicy", "RedriveAllowPolicy"):
        if props.get(key):
            value = props[key]
            attributes[key] = value if isinstance(value, str) else json.dumps(value)
    request: dict[str, Any] = {"QueueName": name, "Attributes": attributes}
    if props.get("Tags"):
        request["tags"] = {str(t["Key"]): str(t["Value"]) for t in props["Tags"]}
    url = client.create_queue(**request)["QueueUrl"]
    arn = client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return url, {"Arn": arn, "QueueName": name, "QueueUrl": url}


def provision(
    template: Mapping[str, Any],
    resolver: Resolver,
    endpoint_url: str,
    region: str = "us-east-1",
    names: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Create the template's DynamoDB tables and SQS queues in a local AWS endpoint.

    Properties come from the template (resolved with ``resolver``, in dependency order so a
    queue's RedrivePolicy points at the real dead-letter queue ARN). Each created resource is
    bound into ``resolver``. Returns logical id -> ``Ref`` value (table name, queue URL).
    Resources whose ``Condition`` is false and other resource types are skipped.
    """
    import boto3  # local import: template parsing must not need boto3

    names = dict(names or {})
    resources = template.get("Resources") or {}
    wanted = [
        lid
        for lid, res in resources.items()
        if (res or {}).get("Type") in _PROVISIONED_TYPES
        and (not res.get("Condition") or resolver.condition(res["Condition"]))
    ]
    session = boto3.session.Session(
        # Dummy credentials: local endpoints (moto, ministack) accept anything.
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name=region,
    )
    dynamodb = session.client("dynamodb", endpoint_url=endpoint_url)
    sqs = session.client("sqs", endpoint_url=endpoint_url)

    created: dict[str, str] = {}
    for lid in _creation_order(resources, wanted):
        resource = resources[lid]
        props = resolver.resolve(resource.get("Properties") or {}) or {}
        if resource["Type"] == "AWS::DynamoDB::Table":
            name = _physical_name(lid, names, props.get("TableName"))
            attrs = _create_table(dynamodb, name, props)
            resolver.bind(lid, name, attrs)
            created[lid] = name
        else:
            fifo = str(props.get("FifoQueue", "")).lower() == "true"
            name = _physical_name(lid, names, props.get("QueueName"), fifo=fifo)
            url, attrs = _create_queue(sqs, name, props)
            resolver.bind(lid, url, attrs)
            created[lid] = url
    return created

"""The project's own reading of template.yaml, for running its functions locally without AWS.

``sam local`` needs Docker and CloudFormation needs AWS; the local tooling (tools.local_invoke,
tools.localrun, tools.ministack, the benches) only needs to know what the template says. This
module reads exactly the part of CloudFormation and SAM that template.yaml uses:

* :func:`load_template` parses the YAML, turning short-form tags (``!Ref``, ``!Sub``...) into
  their long forms (``{"Ref": ...}``, ``{"Fn::Sub": ...}``...).
* :class:`Resolver` evaluates the intrinsic functions listed in :data:`SUPPORTED_INTRINSICS`
  against parameter values, pseudo parameters, conditions and the physical names of resources
  created locally. Any other intrinsic raises :class:`UnsupportedIntrinsic`, naming the function
  and where it was used: add it here when the template starts to need it.
* :func:`functions` and :func:`function_spec` merge ``Globals.Function`` into each
  ``AWS::Serverless::Function`` and resolve what a local invoke needs (handler, code and layer
  directories, timeout, memory, environment).
* :func:`provision` creates the template's DynamoDB tables, SQS queues and S3 buckets in a local
  AWS endpoint (moto server, ministack) and binds their real names into the resolver. Every other
  resource type (log groups, alarms, dashboards, rules, ...) is skipped.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml

__all__ = [
    "NO_VALUE",
    "SUPPORTED_INTRINSICS",
    "FunctionSpec",
    "Provisioned",
    "Resolver",
    "Template",
    "TemplateError",
    "UnsupportedIntrinsic",
    "function_spec",
    "functions",
    "load_template",
    "merged_function_properties",
    "provision",
]

STACK_NAME = "sume-poller"

SUPPORTED_INTRINSICS = (
    "Ref", "Fn::GetAtt", "Fn::Sub", "Fn::Join", "Fn::If", "Fn::Select", "Fn::Split",
    "Fn::Equals", "Fn::Not", "Fn::And", "Fn::Or", "Condition",
)  # fmt: skip

log = logging.getLogger(__name__)


class TemplateError(ValueError):
    """The template (or a value in it) cannot be read or resolved."""


class UnsupportedIntrinsic(TemplateError):
    """An intrinsic function (or pseudo parameter) this module does not implement."""

    def __init__(self, name: str, where: str, supported: tuple[str, ...] = SUPPORTED_INTRINSICS) -> None:
        where = where or "(top level)"
        super().__init__(f"{name} at {where} is not supported by tools.template (supported: {', '.join(supported)})")
        self.name = name
        self.where = where


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


class _TemplateLoader(yaml.SafeLoader):  # type: ignore[misc]
    """SafeLoader that understands CloudFormation short-form tags and keeps dates as strings."""


def _construct_intrinsic(loader: yaml.SafeLoader, tag: str, node: yaml.Node) -> dict[str, Any]:
    """``!Name value`` -> ``{"Fn::Name": value}`` (``Ref`` and ``Condition`` keep their names).

    Every tag is accepted here; the resolver rejects the functions it does not implement when
    (and only if) a value using one is resolved.
    """
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    if tag in ("Ref", "Condition"):
        return {tag: value}
    if tag == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{tag}": value}


def _construct_str(loader: yaml.SafeLoader, node: yaml.Node) -> str:
    return str(loader.construct_scalar(node))


_TemplateLoader.add_multi_constructor("!", _construct_intrinsic)
_TemplateLoader.add_constructor("tag:yaml.org,2002:timestamp", _construct_str)


def load_template(path: str | Path = "template.yaml") -> Template:
    """Parse a CloudFormation/SAM template (YAML or JSON) into long-form intrinsics."""
    path = Path(path).resolve()
    with path.open(encoding="utf-8") as handle:
        data = yaml.load(handle, Loader=_TemplateLoader)  # noqa: S506 - a SafeLoader subclass
    if not isinstance(data, dict):
        raise TemplateError(f"{path}: a template must be a mapping, got {type(data).__name__}")
    template = Template(data)
    template.path = path
    return template


# ---------------------------------------------------------------------------------------------
# Resolving intrinsics
# ---------------------------------------------------------------------------------------------


class _NoValue:
    """``AWS::NoValue``: the key or list item holding it disappears."""

    def __repr__(self) -> str:
        return "NO_VALUE"

    def __reduce__(self) -> str:  # copies (and pickles) are the one NO_VALUE
        return "NO_VALUE"


NO_VALUE: Any = _NoValue()

_SUB_VARIABLE = re.compile(r"\$\{([^}]*)\}")


def _path(where: str, key: object) -> str:
    """``Resources.X`` + ``Properties`` -> ``Resources.X.Properties``; list indexes as ``[i]``."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else str(key)


def _scalar_str(value: Any, where: str) -> str:
    """CloudFormation turns scalars into strings where a string is expected."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise TemplateError(f"{where}: expected a string, got {value!r}")


def _as_list(arg: Any, size: int, usage: str, where: str, list_at: int | None = None) -> list[Any]:
    """``arg`` if it is a list of ``size`` items (item ``list_at`` a list too), else a TemplateError."""
    if not (isinstance(arg, list) and len(arg) == size and (list_at is None or isinstance(arg[list_at], list))):
        raise TemplateError(f"{where}: {usage}, got {arg!r}")
    return arg


def _is_intrinsic(value: Any) -> bool:
    if not isinstance(value, dict) or len(value) != 1:
        return False
    key = str(next(iter(value)))
    return key == "Ref" or key.startswith("Fn::")


def _sam_function_url(resources: Mapping[str, Any], logical_id: str) -> bool:
    """``<Function>Url``: the URL resource the SAM transform makes of a FunctionUrlConfig."""
    function = resources.get(logical_id.removesuffix("Url")) if logical_id.endswith("Url") else None
    return isinstance(function, dict) and "FunctionUrlConfig" in (function.get("Properties") or {})


class Resolver:
    """Evaluate the intrinsic functions of one template.

    ``parameters`` override parameter defaults; ``resources`` maps a logical id to what ``Ref``
    returns for it (default: the logical id itself, like ``sam local``); ``attributes`` maps
    ``"Logical.Attr"`` to what ``Fn::GetAtt`` returns (default: a plausible placeholder).
    ``where`` arguments name the place in the template a value comes from, for error messages.
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
        unknown = sorted(set(self.parameters) - set(self._section("Parameters")))
        if unknown:
            raise TemplateError(f"parameters not declared in the template: {', '.join(unknown)}")
        self._conditions: dict[str, bool] = {}
        self._evaluating: set[str] = set()

    # -- public ---------------------------------------------------------------------------------

    def bind(self, logical_id: str, ref_value: str, attrs: Mapping[str, str] | None = None) -> None:
        """Record the physical ``Ref`` value and ``GetAtt`` attributes of a created resource."""
        self.resources[logical_id] = ref_value
        for attribute, value in (attrs or {}).items():
            self.attributes[f"{logical_id}.{attribute}"] = value

    def resolve(self, value: Any, where: str = "") -> Any:
        """Recursively evaluate intrinsics in ``value`` (a top-level ``AWS::NoValue`` gives None)."""
        result = self._resolve(value, where)
        return None if result is NO_VALUE else result

    def condition(self, name: str) -> bool:
        """Value of the named entry of the template's ``Conditions``."""
        if name in self._conditions:
            return self._conditions[name]
        conditions = self._section("Conditions")
        if name not in conditions:
            raise TemplateError(f"condition {name!r} is not defined in Conditions")
        if name in self._evaluating:
            raise TemplateError(f"condition {name!r} refers to itself")
        self._evaluating.add(name)
        try:
            result = self._truth(conditions[name], f"Conditions.{name}")
        finally:
            self._evaluating.discard(name)
        self._conditions[name] = result
        return result

    def parameter(self, name: str) -> str | list[str]:
        """Value of a template parameter: override, else Default (lists for list types)."""
        declared = self._section("Parameters")
        if name not in declared:
            raise TemplateError(f"parameter {name!r} is not declared")
        spec = declared[name] or {}
        if name in self.parameters:
            raw: Any = self.parameters[name]
        elif "Default" in spec:
            raw = spec["Default"]
        else:
            raise TemplateError(f"parameter {name!r} has no Default and no override")
        param_type = str(spec.get("Type", "String"))
        if param_type == "CommaDelimitedList" or param_type.startswith("List<"):
            if isinstance(raw, list):
                return [_scalar_str(item, f"Parameters.{name}") for item in raw]
            return [item.strip() for item in _scalar_str(raw, f"Parameters.{name}").split(",")]
        return _scalar_str(raw, f"Parameters.{name}")

    # -- walking values -------------------------------------------------------------------------

    def _section(self, name: str) -> Mapping[str, Any]:
        return self.template.get(name) or {}

    def _resolve(self, value: Any, where: str) -> Any:
        if isinstance(value, list):
            items = (self._resolve(item, _path(where, i)) for i, item in enumerate(value))
            return [item for item in items if item is not NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            key, arg = next(iter(value.items()))
            function = self._FUNCTIONS.get(key)
            if function is not None:
                return function(self, arg, where)
            if str(key).startswith("Fn::"):
                raise UnsupportedIntrinsic(key, where)
            if key == "Condition" and isinstance(arg, str) and arg in self._section("Conditions"):
                return self.condition(arg)
        resolved = {k: self._resolve(v, _path(where, k)) for k, v in value.items()}
        return {k: v for k, v in resolved.items() if v is not NO_VALUE}

    def _truth(self, value: Any, where: str) -> bool:
        """A condition's value: a resolved boolean (or "true"/"false")."""
        result = self._resolve(value, where)
        if isinstance(result, bool):
            return result
        if isinstance(result, str) and result.lower() in ("true", "false"):
            return result.lower() == "true"
        raise TemplateError(f"{where}: not a condition: {value!r}")

    # -- the functions --------------------------------------------------------------------------

    def _ref(self, name: Any, where: str) -> Any:
        if not isinstance(name, str):
            raise TemplateError(f"{where}: Ref needs a name, got {name!r}")
        if name.startswith("AWS::"):
            return self._pseudo(name, where)
        if name in self._section("Parameters"):
            return self.parameter(name)
        if name in self.resources:
            return self.resources[name]
        if name in self._section("Resources"):
            return name
        raise TemplateError(f"{where}: Ref to unknown parameter or resource {name!r}")

    def _pseudo(self, name: str, where: str) -> Any:
        values = {
            "AWS::Region": self.region,
            "AWS::AccountId": self.account_id,
            "AWS::Partition": "aws",
            "AWS::StackName": STACK_NAME,
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::NoValue": NO_VALUE,
        }
        if name not in values:
            raise UnsupportedIntrinsic(f"Ref {name}", where, tuple(values))
        return values[name]

    def _get_att(self, arg: Any, where: str) -> Any:
        arg = self._resolve(arg.split(".", 1) if isinstance(arg, str) else arg, _path(where, "Fn::GetAtt"))
        logical_id, attribute = _as_list(arg, 2, "Fn::GetAtt needs [LogicalId, Attribute]", where)
        key = f"{logical_id}.{attribute}"
        if key in self.attributes:
            return self.attributes[key]
        resource = self._section("Resources").get(logical_id)
        if resource is None and _sam_function_url(self._section("Resources"), str(logical_id)):
            return f"https://{str(logical_id).lower()}.lambda-url.{self.region}.on.aws/"
        if resource is None:
            raise TemplateError(f"{where}: Fn::GetAtt of unknown resource {logical_id!r}")
        return self._placeholder(logical_id, str(resource.get("Type", "")), str(attribute))

    def _placeholder(self, logical_id: str, resource_type: str, attribute: str) -> str:
        """What ``Fn::GetAtt`` gives for a resource that was not created: plausible ARNs and names."""
        region, account = self.region, self.account_id
        name = self.resources.get(logical_id, logical_id)
        if resource_type == "AWS::SQS::Queue" and name.startswith(("http://", "https://")):
            name = name.rstrip("/").rsplit("/", 1)[-1]  # bound to a queue URL
        service = resource_type.split("::")[1].lower() if resource_type.count("::") >= 2 else "unknown"
        arns = {
            "AWS::SQS::Queue": f"arn:aws:sqs:{region}:{account}:{name}",
            "AWS::DynamoDB::Table": f"arn:aws:dynamodb:{region}:{account}:table/{name}",
            "AWS::S3::Bucket": f"arn:aws:s3:::{name}",
            "AWS::Serverless::Function": f"arn:aws:lambda:{region}:{account}:function:{name}",
            "AWS::Lambda::Function": f"arn:aws:lambda:{region}:{account}:function:{name}",
        }
        if attribute.endswith("Arn"):  # Arn, TopicArn, ...
            generic = f"arn:aws:{service}:{region}:{account}:{name}"
            return arns.get(resource_type, generic) if attribute == "Arn" else generic
        if resource_type == "AWS::SQS::Queue" and attribute == "QueueUrl":
            return f"https://sqs.{region}.amazonaws.com/{account}/{name}"
        if attribute.endswith("Name"):
            return name
        return f"{name}.{attribute}"

    def _sub(self, arg: Any, where: str) -> str:
        here = _path(where, "Fn::Sub")
        variables: dict[str, Any] = {}
        if isinstance(arg, list):
            text, given = _as_list(arg, 2, "Fn::Sub needs a string or [string, {variables}]", where)
            if not isinstance(given, dict):
                raise TemplateError(f"{where}: Fn::Sub variables must be a mapping, got {given!r}")
            variables = {k: self._resolve(v, _path(_path(here, 1), k)) for k, v in given.items()}
        else:
            text = arg
        if not isinstance(text, str):
            raise TemplateError(f"{where}: Fn::Sub needs a literal string, got {text!r}")

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name.startswith("!"):  # ${!Literal} is written as ${Literal}
                return "${" + name[1:] + "}"
            name = name.strip()
            if name in variables:
                value = variables[name]
            elif "." in name and not name.startswith("AWS::"):
                value = self._get_att(name, here)
            else:
                value = self._ref(name, here)
            return _scalar_str(value, f"{here} ${{{name}}}")

        return _SUB_VARIABLE.sub(replace, text)

    def _join(self, arg: Any, where: str) -> str:
        here = _path(where, "Fn::Join")
        usage = "Fn::Join needs [delimiter, [values]]"
        delimiter, values = _as_list(self._resolve(arg, here), 2, usage, where, list_at=1)
        return _scalar_str(delimiter, here).join(_scalar_str(item, here) for item in values)

    def _select(self, arg: Any, where: str) -> Any:
        usage = "Fn::Select needs [index, [values]]"
        index, values = _as_list(self._resolve(arg, _path(where, "Fn::Select")), 2, usage, where, list_at=1)
        try:
            return values[int(index)]
        except (ValueError, IndexError) as error:
            raise TemplateError(f"{where}: Fn::Select index {index!r} of {values!r}: {error}") from None

    def _split(self, arg: Any, where: str) -> list[str]:
        here = _path(where, "Fn::Split")
        delimiter, text = _as_list(self._resolve(arg, here), 2, "Fn::Split needs [delimiter, string]", where)
        return _scalar_str(text, here).split(_scalar_str(delimiter, here))

    def _if(self, arg: Any, where: str) -> Any:
        name, then, otherwise = _as_list(arg, 3, "Fn::If needs [condition, then, else]", where)
        chosen = 1 if self.condition(name) else 2
        return self._resolve(then if chosen == 1 else otherwise, _path(_path(where, "Fn::If"), chosen))

    def _equals(self, arg: Any, where: str) -> bool:
        here = _path(where, "Fn::Equals")
        left, right = _as_list(self._resolve(arg, here), 2, "Fn::Equals needs [value, value]", where)
        return bool(_comparable(left, here) == _comparable(right, here))

    def _not(self, arg: Any, where: str) -> bool:
        (inner,) = _as_list(arg, 1, "Fn::Not needs [condition]", where)
        return not self._truth(inner, _path(_path(where, "Fn::Not"), 0))

    def _and(self, arg: Any, where: str) -> bool:
        return all(self._truths(arg, _path(where, "Fn::And")))

    def _or(self, arg: Any, where: str) -> bool:
        return any(self._truths(arg, _path(where, "Fn::Or")))

    def _truths(self, arg: Any, where: str) -> Iterator[bool]:
        for i, item in enumerate(arg if isinstance(arg, list) else [arg]):
            yield self._truth(item, _path(where, i))

    _FUNCTIONS: ClassVar[Mapping[str, Callable[[Resolver, Any, str], Any]]] = {
        "Ref": _ref,
        "Fn::GetAtt": _get_att,
        "Fn::Sub": _sub,
        "Fn::Join": _join,
        "Fn::Select": _select,
        "Fn::Split": _split,
        "Fn::If": _if,
        "Fn::Equals": _equals,
        "Fn::Not": _not,
        "Fn::And": _and,
        "Fn::Or": _or,
    }


def _comparable(value: Any, where: str) -> Any:
    """Compare like CloudFormation: scalars as strings, lists item by item."""
    if isinstance(value, list):
        return [_comparable(item, where) for item in value]
    return _scalar_str(value, where)


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
    both_maps = isinstance(global_value, dict) and isinstance(local_value, dict)
    if both_maps and not _is_intrinsic(global_value) and not _is_intrinsic(local_value):
        merged = copy.deepcopy(global_value)
        for key, value in local_value.items():
            merged[key] = _merge_globals(merged[key], value) if key in merged else copy.deepcopy(value)
        return merged
    if isinstance(global_value, list) and isinstance(local_value, list):
        return copy.deepcopy(global_value) + copy.deepcopy(local_value)
    return copy.deepcopy(local_value)


def merged_function_properties(template: Mapping[str, Any], logical_id: str) -> dict[str, Any]:
    """A function's Properties with ``Globals.Function`` merged in (unresolved)."""
    resource = (template.get("Resources") or {}).get(logical_id)
    if not resource or resource.get("Type") != "AWS::Serverless::Function":
        raise KeyError(f"{logical_id!r} is not an AWS::Serverless::Function of the template")
    global_props = (template.get("Globals") or {}).get("Function") or {}
    return dict(_merge_globals(global_props, resource.get("Properties") or {}))


def _env_str(name: str, value: Any) -> str | None:
    if value is None or value is NO_VALUE:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise TemplateError(f"environment variable {name} resolved to a non-scalar: {value!r}")


def _local_dir(uri: Any, base_dir: Path, where: str) -> Path:
    if not isinstance(uri, str):
        raise TemplateError(f"{where} must be a local path to run locally, got {uri!r}")
    if uri.startswith("s3://"):
        raise TemplateError(f"{where} {uri!r} is in S3; only local paths can be run locally")
    return (base_dir / uri).resolve()


def _layer_dirs(template: Mapping[str, Any], layers: Any, resolver: Resolver, base_dir: Path) -> list[Path]:
    """Directories of the template's own ``AWS::Serverless::LayerVersion`` layers (``!Ref`` only).

    Layer ARNs (published elsewhere) cannot be run locally: ignored, like a missing layer.
    """
    resources = template.get("Resources") or {}
    dirs = []
    for layer in layers or []:
        if not (isinstance(layer, dict) and set(layer) == {"Ref"} and isinstance(layer["Ref"], str)):
            continue
        resource = resources.get(layer["Ref"]) or {}
        if resource.get("Type") == "AWS::Serverless::LayerVersion":
            where = f"Resources.{layer['Ref']}.Properties.ContentUri"
            content_uri = resolver.resolve((resource.get("Properties") or {}).get("ContentUri"), where)
            dirs.append(_local_dir(content_uri, base_dir, where))
    return dirs


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
    where = f"Resources.{logical_id}.Properties"

    def prop(name: str, default: Any) -> Any:
        return resolver.resolve(props.get(name, default), f"{where}.{name}")

    if "CodeUri" not in props:
        raise TemplateError(f"{logical_id}: no CodeUri (InlineCode/ImageUri functions cannot be run locally)")
    environment: dict[str, str] = {}
    for name, value in ((prop("Environment", None) or {}).get("Variables") or {}).items():
        text = _env_str(name, value)
        if text is not None:
            environment[name] = text
    return FunctionSpec(
        logical_id=logical_id,
        function_name=str(prop("FunctionName", None) or logical_id),
        handler=str(prop("Handler", "app.lambda_handler")),
        code_dir=_local_dir(prop("CodeUri", None), base_dir, f"{where}.CodeUri"),
        layer_dirs=_layer_dirs(template, props.get("Layers"), resolver, base_dir),
        runtime=str(prop("Runtime", "python3.11")),
        timeout=int(prop("Timeout", 3)),
        memory=int(prop("MemorySize", 128)),
        environment=environment,
        architectures=[str(a) for a in prop("Architectures", ["x86_64"])],
    )


# ---------------------------------------------------------------------------------------------
# Provisioning tables, queues and buckets in a local endpoint
# ---------------------------------------------------------------------------------------------


class Provisioned(dict[str, str]):
    """What :func:`provision` created: logical id -> ``Ref`` value (table name, queue URL, bucket
    name), in creation order; ``skipped`` maps the resources of other types to their type."""

    def __init__(self) -> None:
        super().__init__()
        self.skipped: dict[str, str] = {}


def _throughput(value: Mapping[str, Any] | None) -> dict[str, int]:
    value = value or {"ReadCapacityUnits": 5, "WriteCapacityUnits": 5}
    return {key: int(value[key]) for key in ("ReadCapacityUnits", "WriteCapacityUnits")}


def _create_table(client: Any, name: str, props: Mapping[str, Any], region: str) -> tuple[str, dict[str, str]]:
    """Keys, global secondary indexes and billing mode; PITR, SSE, TTL, tags... are not emulated."""
    billing_mode = props.get("BillingMode", "PROVISIONED")
    provisioned = billing_mode == "PROVISIONED"
    request: dict[str, Any] = {
        "TableName": name,
        "KeySchema": props["KeySchema"],
        "AttributeDefinitions": props["AttributeDefinitions"],
        "BillingMode": billing_mode,
    }
    if provisioned:
        request["ProvisionedThroughput"] = _throughput(props.get("ProvisionedThroughput"))
    indexes = []
    for gsi in props.get("GlobalSecondaryIndexes") or []:
        index = {key: gsi[key] for key in ("IndexName", "KeySchema")}
        index["Projection"] = gsi.get("Projection") or {"ProjectionType": "ALL"}
        if provisioned:
            index["ProvisionedThroughput"] = _throughput(gsi.get("ProvisionedThroughput"))
        indexes.append(index)
    if indexes:
        request["GlobalSecondaryIndexes"] = indexes
    arn = client.create_table(**request)["TableDescription"]["TableArn"]
    client.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
    return name, {"Arn": arn}


def _queue_attribute(value: Any, where: str) -> str:
    return json.dumps(value) if isinstance(value, dict | list) else _scalar_str(value, where)


def _create_queue(client: Any, name: str, props: Mapping[str, Any], region: str) -> tuple[str, dict[str, str]]:
    """CloudFormation's queue properties are SQS attribute names (``RedrivePolicy`` as JSON)."""
    attributes = {key: _queue_attribute(value, key) for key, value in props.items() if key not in ("QueueName", "Tags")}
    url = client.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    arn = client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return url, {"Arn": arn, "QueueName": name, "QueueUrl": url}


def _create_bucket(client: Any, name: str, props: Mapping[str, Any], region: str) -> tuple[str, dict[str, str]]:
    """A plain bucket: encryption, versioning, public access block... are not emulated."""
    if region == "us-east-1":
        client.create_bucket(Bucket=name)
    else:
        client.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": region})
    return name, {"Arn": f"arn:aws:s3:::{name}", "DomainName": f"{name}.s3.amazonaws.com"}


@dataclass(frozen=True)
class _Kind:
    service: str
    name_property: str
    create: Callable[[Any, str, Mapping[str, Any], str], tuple[str, dict[str, str]]]


_KINDS = {
    "AWS::DynamoDB::Table": _Kind("dynamodb", "TableName", _create_table),
    "AWS::SQS::Queue": _Kind("sqs", "QueueName", _create_queue),
    "AWS::S3::Bucket": _Kind("s3", "BucketName", _create_bucket),
}


def _physical_name(logical_id: str, resource_type: str, props: Mapping[str, Any]) -> str:
    """The name the template gives, else a unique one like CloudFormation's."""
    explicit = props.get(_KINDS[resource_type].name_property)
    if isinstance(explicit, str) and explicit:
        return explicit
    name = f"{STACK_NAME}-{logical_id}-{uuid.uuid4().hex[:8]}"
    if resource_type == "AWS::S3::Bucket":
        return name.lower()
    if resource_type == "AWS::SQS::Queue" and str(props.get("FifoQueue", "")).lower() == "true":
        return f"{name}.fifo"
    return name


def _references(value: Any) -> Iterator[str]:
    """Logical ids (and parameter names) a value refers to through Ref, Fn::GetAtt or Fn::Sub."""
    if isinstance(value, list):
        for item in value:
            yield from _references(item)
        return
    if not isinstance(value, dict):
        return
    for key, arg in value.items():
        if key == "Ref" and isinstance(arg, str):
            yield arg
        elif key == "Fn::GetAtt" and arg:
            yield arg.split(".", 1)[0] if isinstance(arg, str) else str(arg[0])
        elif key == "Fn::Sub":
            text = arg[0] if isinstance(arg, list) and arg else arg
            for match in _SUB_VARIABLE.finditer(text if isinstance(text, str) else ""):
                yield match.group(1).strip().split(".", 1)[0]
            yield from _references(arg[1:] if isinstance(arg, list) else [])
        else:
            yield from _references(arg)


def _creation_order(resources: Mapping[str, Any], wanted: list[str]) -> list[str]:
    """``wanted`` ordered so each resource comes after the ones it refers to or DependsOn."""
    order: list[str] = []
    visiting: list[str] = []

    def visit(lid: str) -> None:
        if lid in order:
            return
        if lid in visiting:
            raise TemplateError(f"circular dependency: {' -> '.join([*visiting, lid])}")
        visiting.append(lid)
        resource = resources[lid]
        depends_on = resource.get("DependsOn") or []
        depends_on = [depends_on] if isinstance(depends_on, str) else list(depends_on)
        for dep in [*_references(resource.get("Properties") or {}), *depends_on]:
            if dep in wanted and dep != lid:
                visit(dep)
        visiting.pop()
        order.append(lid)

    for lid in wanted:
        visit(lid)
    return order


@functools.lru_cache(maxsize=32)
def _local_client(service: str, endpoint_url: str, region: str) -> Any:
    """One client per local endpoint, region and service in this process: a test run provisions
    the template again before every test, and each new client parses botocore's model of its
    service (most of a provision's CPU)."""
    import boto3  # here: reading templates must not need boto3

    session: Any = boto3.session.Session(
        aws_access_key_id="testing",  # local endpoints (moto, ministack) accept anything
        aws_secret_access_key="testing",
        region_name=region,
    )
    return session.client(service, endpoint_url=endpoint_url)


def provision(
    template: Mapping[str, Any],
    resolver: Resolver,
    endpoint_url: str,
    region: str = "us-east-1",
    names: Mapping[str, str] | None = None,
) -> Provisioned:
    """Create the template's DynamoDB tables, SQS queues and S3 buckets in a local AWS endpoint.

    Properties come from the template (resolved with ``resolver``, in dependency order so a
    queue's RedrivePolicy points at the real dead-letter queue's ARN); ``names`` forces physical
    names. Each created resource is bound into ``resolver``. Resources whose ``Condition`` is
    false are not created; resources of other types are skipped (listed in ``.skipped`` and
    logged).
    """
    resources = template.get("Resources") or {}
    result = Provisioned()
    wanted = []
    for lid, resource in resources.items():
        condition = resource.get("Condition")
        if condition and not resolver.condition(condition):
            continue
        if resource.get("Type") in _KINDS:
            wanted.append(lid)
        else:
            result.skipped[lid] = str(resource.get("Type"))
    if result.skipped:
        log.info("provision: not created locally: %s", ", ".join(f"{k} ({v})" for k, v in result.skipped.items()))

    for lid in _creation_order(resources, wanted):
        resource_type = resources[lid]["Type"]
        kind = _KINDS[resource_type]
        props = resolver.resolve(resources[lid].get("Properties") or {}, f"Resources.{lid}.Properties") or {}
        name = (names or {}).get(lid) or _physical_name(lid, resource_type, props)
        ref_value, attrs = kind.create(_local_client(kind.service, endpoint_url, region), name, props, region)
        resolver.bind(lid, ref_value, attrs)
        result[lid] = ref_value
    return result

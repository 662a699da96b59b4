"""The template's contract, read statically: every parameter bounded and documented (and listed in
the parameters page, docs/parameters.md), handlers and environment wired, every custom-metric alarm on the namespace and
dimension the functions emit, nothing left at a Docker-only build method."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tools.template import load as load_template

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = load_template(ROOT / "template.yaml")
PARAMETERS: dict[str, Any] = TEMPLATE["Parameters"]
RESOURCES: dict[str, Any] = TEMPLATE["Resources"]


@pytest.mark.parametrize("name", sorted(PARAMETERS))
def test_every_parameter_is_bounded_documented_and_in_the_parameters_page(name: str) -> None:
    parameter = PARAMETERS[name]
    assert len(str(parameter.get("Description", ""))) > 20, f"{name} needs a description"
    if parameter["Type"] == "Number":
        assert "MaxValue" in parameter or "AllowedValues" in parameter, f"{name} has no upper bound"
        assert "MinValue" in parameter or "AllowedValues" in parameter, f"{name} has no lower bound"
    elif parameter["Type"] == "String":
        assert "AllowedValues" in parameter or "AllowedPattern" in parameter, f"{name} is not validated"
    table = (ROOT / "docs" / "parameters.md").read_text()
    assert f"| `{name}` |" in table, f"{name} is not in docs/parameters.md's table"


def test_every_function_builds_without_docker_for_python313_arm64() -> None:
    functions = {lid: r for lid, r in RESOURCES.items() if r["Type"] == "AWS::Serverless::Function"}
    assert set(functions) == {"SubmitFunction", "PollFunction", "FanOutFunction", "SweepFunction", "WebhookFunction",
                              "JobsFunction"}
    assert TEMPLATE["Globals"]["Function"]["Runtime"] == "python3.13"
    for lid, resource in {**functions, "SharedLayer": RESOURCES["SharedLayer"]}.items():
        assert resource["Metadata"]["BuildMethod"] == "makefile", lid
        code = ROOT / str(resource["Properties"].get("CodeUri") or resource["Properties"]["ContentUri"])
        assert f"build-{lid}:" in (code / "Makefile").read_text(), lid


def test_every_custom_metric_alarm_names_the_namespace_and_dimension_the_functions_emit() -> None:
    alarms = {lid: r["Properties"] for lid, r in RESOURCES.items() if r["Type"] == "AWS::CloudWatch::Alarm"}
    custom = {lid: a for lid, a in alarms.items() if a.get("Namespace") == "SumePoller"}
    assert len(custom) >= 6
    for lid, alarm in custom.items():
        assert alarm["Dimensions"] == [{"Name": "service", "Value": "sume-poller"}], lid
    env = TEMPLATE["Globals"]["Function"]["Environment"]["Variables"]
    assert (env["POWERTOOLS_METRICS_NAMESPACE"], env["POWERTOOLS_SERVICE_NAME"]) == ("SumePoller", "sume-poller")


def test_the_state_a_paid_pipeline_keeps_survives_a_stack_replacement() -> None:
    for lid in ("JobsTable", "ResultBucket"):
        assert RESOURCES[lid]["DeletionPolicy"] == RESOURCES[lid]["UpdateReplacePolicy"] == "Retain", lid
    assert RESOURCES["FanOutFunction"]["Properties"]["EventInvokeConfig"]["MaximumRetryAttempts"] == 0

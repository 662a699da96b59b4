"""Operator commands for a deployed sume-poller stack (``make status``, ``make models``, ``make redrive``).

    python -m tools.ops status|models|redrive [--stack NAME] [--config-env default|dev|prod] [--max-per-second N]

The stack (default: samconfig.toml's ``stack_name`` of the config environment) is found through CloudFormation: its
outputs name the table and the queues. AWS access is the usual configuration; with ``AWS_ENDPOINT_URL`` set the same
commands talk to a local emulator such as ministack (with dummy credentials when none are configured). ``status``:
counts by status (one paginated scan of four attributes), the oldest pending job, the depths of the poll queue and
its DLQ. ``models``: every profile's learned completion-time model as the poll function fits it from the statistics
items. ``redrive``: an SQS message move task from the DLQ back to the poll queue (StartMessageMoveTask, which
neither moto nor ministack implements: tests/e2e/test_deployed_stack.py tests it against botocore's Stubber).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import tomllib
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from sume_poller.core.clock import Clock
from sume_poller.schedule.durations import MIN_OBSERVATIONS
from sume_poller.schedule.models import ModelCache
from sume_poller.store.records import STATS_PREFIX
from tools.stack.base import ROOT, JobTable, queue_depth

#: Error codes of an endpoint that does not know StartMessageMoveTask (ministack; moto answers 500).
UNSUPPORTED = {"InvalidAction", "UnsupportedOperation", "NotImplemented", "500"}


class OpsError(RuntimeError):
    """A command cannot be carried out (no such stack, an endpoint without the API...)."""


def default_stack_name(config_env: str, samconfig: Path = ROOT / "samconfig.toml") -> str:
    """``stack_name`` of ``config_env`` in samconfig.toml (global, then deploy parameters)."""
    env = (tomllib.loads(samconfig.read_text(encoding="utf-8")) if samconfig.exists() else {}).get(config_env, {})
    for command in ("global", "deploy"):
        if name := env.get(command, {}).get("parameters", {}).get("stack_name"):
            return str(name)
    raise OpsError(f"no stack_name for config environment {config_env!r} in {samconfig.name}: give --stack")


def clients() -> Callable[[str], Any]:
    """boto3 clients from the usual configuration (a local endpoint gets dummy credentials and us-east-1 when none are
    configured)."""
    import boto3

    session: Any = boto3.session.Session()
    if os.environ.get("AWS_ENDPOINT_URL"):
        dummy = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
        session = boto3.session.Session(region_name=session.region_name or "us-east-1",
                                        **(dummy if session.get_credentials() is None else {}))
    client: Callable[[str], Any] = session.client
    return client


class StackView:
    """A deployed stack's outputs and parameters, as CloudFormation describes it."""

    def __init__(self, cfn: Any, name: str) -> None:
        try:
            described = cfn.describe_stacks(StackName=name)["Stacks"][0]
        except ClientError as error:
            raise OpsError(f"stack {name}: {error.response['Error'].get('Message', error)}") from error
        self.name = name
        self.outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
        self.parameters = {p["ParameterKey"]: p.get("ParameterValue", "") for p in described.get("Parameters", [])}
        self.clock = Clock(float(self.parameters.get("TimeScale") or 1))  # the stack's clock (1 on AWS)

    def output(self, key: str) -> str:
        if key not in self.outputs:
            raise OpsError(f"stack {self.name} has no output {key} (is it a sume-poller stack?)")
        return self.outputs[key]


def status(view: StackView, ddb: Any, sqs: Any) -> str:
    """Counts by status, the oldest pending job, the depths of the poll queue and its DLQ, and of the create queue (the
    drains of queued submissions) and its DLQ."""
    records = JobTable(ddb, view.output("JobsTableName")).scan(["status", "kind", "submitted_at"])
    by_status = Counter(str(r.get("status")) for r in records)
    lines = [f"stack {view.name} (table {view.output('JobsTableName')})", f"pending            {by_status['pending']}"]
    pending = [r for r in records if r.get("status") == "pending" and "submitted_at" in r]
    if pending:
        oldest = min(pending, key=lambda r: float(r["submitted_at"]))
        submitted = float(oldest["submitted_at"])
        at = dt.datetime.fromtimestamp(submitted, dt.UTC).isoformat(timespec="seconds")
        lines.append(f"  oldest           {oldest['job_id']} ({oldest.get('kind')}), submitted {at}, "
                     f"{dt.timedelta(seconds=int(view.clock.now() - submitted))} ago")
    terminal = {s: n for s, n in sorted(by_status.items()) if s != "pending"}
    lines.append(f"terminal           {sum(terminal.values())}")
    lines += [f"  {s:<16} {n}" for s, n in terminal.items()]
    dlq = queue_depth(sqs, view.output("PollDeadLetterQueueUrl"))
    lines.append(f"poll queue         {queue_depth(sqs, view.output('PollQueueUrl'))} (visible, in flight and delayed)")
    lines.append(f"dead-letter queue  {dlq}" + ("   -> make redrive" if dlq else ""))
    if view.outputs.get("CreateQueueUrl"):  # stacks from before submissions queued have none
        lines.append(f"create queue       {queue_depth(sqs, view.output('CreateQueueUrl'))} (drain steps)")
        lines.append(f"  dead letters     {queue_depth(sqs, view.output('CreateDeadLetterQueueUrl'))}")
    return "\n".join(lines)


def model_lines(store: Any, profiles: Iterable[str], now: Callable[[], float]) -> list[tuple[str, str]]:
    """(profile, its learned model in words), as the poll function fits it from ``store``."""
    cache = ModelCache(store, now)
    return [(profile, f"median {m['median']:g} s, p90 {m['p90']:g} s, sigma {m['sigma']:g} ({m['observations']} "
             "observations)" if "median" in m else f"static schedule ({m['observations']} completions, "
             f"{m['bracketed']} seen running first; a model needs {MIN_OBSERVATIONS} and {MIN_OBSERVATIONS // 3})")
            for profile, m in ((p, cache.describe(p)) for p in sorted(set(profiles)))]


def models(view: StackView, ddb: Any) -> list[tuple[str, str]]:
    """The learned model of every profile that has a statistics item in the stack's table."""
    table = JobTable(ddb, view.output("JobsTableName"))
    profiles = [str(r["job_id"]).removeprefix(STATS_PREFIX) for r in table.scan([], stats=True)
                if str(r["job_id"]).startswith(STATS_PREFIX)]
    return model_lines(table, profiles, view.clock.now)


def redrive(sqs: Any, dlq_url: str, queue_url: str, max_per_second: int | None = None) -> str:
    """Start moving the DLQ's messages back to the poll queue; the task handle."""
    arns = [sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
            for url in (dlq_url, queue_url)]
    request: dict[str, Any] = {"SourceArn": arns[0], "DestinationArn": arns[1]}
    if max_per_second is not None:
        request["MaxNumberOfMessagesPerSecond"] = max_per_second
    try:
        return str(sqs.start_message_move_task(**request)["TaskHandle"])
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in UNSUPPORTED:
            raise OpsError("this endpoint does not implement SQS StartMessageMoveTask (moto and ministack "
                           "do not; AWS does)") from error
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.ops", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["status", "models", "redrive"])
    parser.add_argument("--stack", help="stack name (default: samconfig.toml's stack_name)")
    parser.add_argument("--config-env", default="default", help="samconfig.toml environment (default: default)")
    parser.add_argument("--max-per-second", type=int, help="redrive: messages moved per second (default: SQS's)")
    args = parser.parse_args(argv)
    try:
        client = clients()
        view = StackView(client("cloudformation"), args.stack or default_stack_name(args.config_env))
        if args.command == "status":
            print(status(view, client("dynamodb"), client("sqs")))
        elif args.command == "models":
            print("\n".join(f"{profile:<24} {text}" for profile, text in models(view, client("dynamodb")))
                  or "no observations yet")
        else:
            handle = redrive(client("sqs"), view.output("PollDeadLetterQueueUrl"), view.output("PollQueueUrl"),
                             args.max_per_second)
            print(f"moving the DLQ's messages back to the poll queue: task {handle}")
    except OpsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Operator commands for a deployed sume-poller stack (``make status``, ``make models``, ``make redrive``).

    python -m tools.ops status|models|redrive|migrate-keys [--stack NAME] [--config-env default|dev|prod]
                        [--max-per-second N] [--dlq poll|terminal-queue|terminal-target] [--finish]

The stack (default: samconfig.toml's ``stack_name`` of the config environment) is found through CloudFormation: its
outputs name the table and the queues. AWS access is the usual configuration; with ``AWS_ENDPOINT_URL`` set the same
commands talk to a local emulator such as ministack (with dummy credentials when none are configured). ``status``:
counts by status (one paginated scan of four attributes), the oldest pending job, the depths of the poll queue and
its DLQ. ``models``: every profile's learned completion-time model as the poll function fits it from the statistics
items. ``redrive``: an SQS message move task from the DLQ back to the poll queue (StartMessageMoveTask, which
neither moto nor ministack implements: tests/e2e/test_deployed_stack.py tests it against botocore's Stubber); with
``--dlq terminal-queue`` or ``terminal-target``, a terminal-event rule's dead-letter queue back to that rule's target
alone (:func:`redrive_events`). ``migrate-keys``: the key configuration's format-1 inline secrets moved to their own
secrets (:func:`plan_migration`).
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

from sume_poller.config.keys import API_KEYS, WEBHOOK_SECRETS
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


#: What redrive_events can deliver to without a PutEvents to the bus (which would reach every rule again and
#: duplicate the other targets' deliveries): the target's service -> (client, the call for one event body).
DELIVER: dict[str, tuple[str, Callable[[Any, str, str], Any]]] = {
    "sqs": ("sqs", lambda c, arn, body: c.send_message(QueueUrl=c.get_queue_url(
        QueueName=arn.rsplit(":", 1)[-1], QueueOwnerAWSAccountId=arn.split(":")[4])["QueueUrl"], MessageBody=body)),
    "lambda": ("lambda", lambda c, arn, body: c.invoke(FunctionName=arn, InvocationType="Event", Payload=body)),
    "sns": ("sns", lambda c, arn, body: c.publish(TopicArn=arn, Message=body)),
    "states": ("stepfunctions", lambda c, arn, body: c.start_execution(stateMachineArn=arn, input=body)),
    "kinesis": ("kinesis", lambda c, arn, body: c.put_record(StreamARN=arn, Data=body.encode(),
                                                             PartitionKey=json_id(body))),
    "firehose": ("firehose", lambda c, arn, body: c.put_record(DeliveryStreamName=arn.rsplit("/", 1)[-1],
                                                               Record={"Data": body.encode()})),
}


def json_id(body: str) -> str:
    """An event's id (EventBridge's ``id``), for a partition key."""
    import json

    try:
        return str(json.loads(body).get("id") or "event")
    except (ValueError, AttributeError):
        return "event"


def redrive_events(sqs: Any, dlq_url: str, target_arn: str, client: Callable[[str], Any],
                   limit: int | None = None) -> int:
    """Deliver a terminal-event rule's dead letters to that rule's target alone; how many. A dead
    letter's body is the event as the rule would have delivered it (the stack's rules have no input
    transformer); each is deleted once its target took it, so a repeat after a failure delivers only
    what is left. An SQS queue of this account gets a message move task instead (as ``redrive``)."""
    service = target_arn.split(":")[2]
    if service not in DELIVER:
        raise OpsError(f"cannot re-deliver to a {service} target from here ({target_arn}): deliver the DLQ's "
                       "messages yourself, then delete them")
    name, deliver = DELIVER[service]
    target, moved = client(name), 0
    while limit is None or moved < limit:
        reply = sqs.receive_message(QueueUrl=dlq_url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                                    VisibilityTimeout=60)
        messages = reply.get("Messages", [])
        if not messages:
            return moved
        for message in messages:
            deliver(target, target_arn, message["Body"])
            sqs.delete_message(QueueUrl=dlq_url, ReceiptHandle=message["ReceiptHandle"])
            moved += 1
    return moved


# -- the key configuration, format 1 -> 2 -------------------------------------------------------------------

def plan_migration(config: dict[str, Any], name: str, read: Callable[[str, str], str], *,
                   finish: bool) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """(the new key list, secret name -> value to write first, what was done in words - ids, never values).

    Format 1 held each key's API key (``api_key``) and webhook secret (``webhook_secret``) inline, or an
    ``api_key_from`` anywhere under ``name/``. Format 2 keeps them in secrets of their own under
    ``name/api-keys/`` and ``name/webhook-secrets/`` (keys.py), each readable only by the functions that use it.
    Without ``finish`` an inline webhook secret stays in the list too (the version before the split reads it
    there; the version after reads it too, counted as KeyConfigLegacy), so this step is safe under either version;
    ``finish`` - once the new version is deployed - points the list at the moved webhook secrets instead. Safe to
    repeat: a migrated entry changes nothing. ``read(source, name)`` reads a secret kept elsewhere.
    """
    entries = config.get("keys")
    if not isinstance(entries, dict):
        raise OpsError('the key configuration is not {"keys": {...}}: nothing to migrate')
    new: dict[str, Any] = {}
    writes: dict[str, str] = {}
    done: list[str] = []
    for key_id, raw in entries.items():
        entry = dict(raw) if isinstance(raw, dict) else raw
        if not isinstance(entry, dict):
            raise OpsError(f"key {key_id}: its entry is not an object")
        api_name = f"{name}/{API_KEYS}/{key_id}"
        where = str(entry.get("api_key_from") or "")
        source, _, ref = where.partition(":")
        if "api_key" in entry:
            writes[api_name] = str(entry.pop("api_key"))
            entry["api_key_from"] = f"secretsmanager:{api_name}"
            done.append(f"{key_id}: API key moved from the list to secret {api_name}")
        elif where and not ref.lstrip("/").startswith(f"{name}/{API_KEYS}/"):
            writes[api_name] = read(source, ref)
            entry["api_key_from"] = f"secretsmanager:{api_name}"
            done.append(f"{key_id}: API key copied from {where} to secret {api_name} (delete the old one when done)")
        hook_name = f"{name}/{WEBHOOK_SECRETS}/{key_id}"
        if "webhook_secret" in entry:
            writes[hook_name] = str(entry["webhook_secret"])
            if finish:
                del entry["webhook_secret"]
                entry["webhook_secret_from"] = f"secretsmanager:{hook_name}"
                done.append(f"{key_id}: webhook secret moved from the list to secret {hook_name}")
            else:
                done.append(f"{key_id}: webhook secret copied to secret {hook_name}; still inline until --finish "
                            "(after deploying the version that reads it there)")
        new[key_id] = entry
    return {**config, "keys": new}, writes, done


def migrate_keys(secrets: Any, ssm: Any, name: str, *, finish: bool) -> list[str]:
    """:func:`plan_migration` carried out: each moved secret written (created or updated), then the list."""
    import json

    def read(source: str, ref: str) -> str:
        if source == "ssm":
            return str(ssm.get_parameter(Name=ref, WithDecryption=True)["Parameter"]["Value"])
        return str(secrets.get_secret_value(SecretId=ref)["SecretString"])

    try:
        raw = secrets.get_secret_value(SecretId=name)["SecretString"]
    except ClientError as error:
        raise OpsError(f"key configuration {name}: {error.response['Error'].get('Message', error)}") from error
    try:
        config = json.loads(raw)
    except ValueError as error:
        raise OpsError(f"key configuration {name} is not JSON") from error
    new, writes, done = plan_migration(config, name, read, finish=finish)
    for secret_name, value in writes.items():
        try:
            secrets.put_secret_value(SecretId=secret_name, SecretString=value)
        except secrets.exceptions.ResourceNotFoundException:
            secrets.create_secret(Name=secret_name, SecretString=value)
    if new != config:
        secrets.put_secret_value(SecretId=name, SecretString=json.dumps(new))
    return done or ["nothing to migrate: the key configuration is in format 2"]


DLQ_OUTPUTS = {"terminal-queue": ("TerminalEventsQueueDeadLetterQueueUrl", "TerminalEventsQueueUrl"),
               "terminal-target": ("TerminalEventsTargetDeadLetterQueueUrl", "TerminalEventsTargetArn")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.ops", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["status", "models", "redrive", "migrate-keys"])
    parser.add_argument("--stack", help="stack name (default: samconfig.toml's stack_name)")
    parser.add_argument("--config-env", default="default", help="samconfig.toml environment (default: default)")
    parser.add_argument("--max-per-second", type=int, help="redrive: messages moved per second (default: SQS's)")
    parser.add_argument("--dlq", choices=["poll", *DLQ_OUTPUTS], default="poll",
                        help="redrive: which dead-letter queue (default: the poll queue's)")
    parser.add_argument("--finish", action="store_true",
                        help="migrate-keys: also move inline webhook secrets (after deploying the new version)")
    args = parser.parse_args(argv)
    try:
        client = clients()
        view = StackView(client("cloudformation"), args.stack or default_stack_name(args.config_env))
        if args.command == "status":
            print(status(view, client("dynamodb"), client("sqs")))
        elif args.command == "models":
            print("\n".join(f"{profile:<24} {text}" for profile, text in models(view, client("dynamodb")))
                  or "no observations yet")
        elif args.command == "migrate-keys":
            name = view.parameters.get("SumeKeysSecretName") or ""
            if not name:
                raise OpsError(f"stack {view.name} has no key configuration (SumeKeysSecretName)")
            print("\n".join(migrate_keys(client("secretsmanager"), client("ssm"), name, finish=args.finish)))
        elif args.dlq == "poll":
            handle = redrive(client("sqs"), view.output("PollDeadLetterQueueUrl"), view.output("PollQueueUrl"),
                             args.max_per_second)
            print(f"moving the DLQ's messages back to the poll queue: task {handle}")
        elif args.dlq == "terminal-queue":  # the stack's own queue: an SQS move task
            dlq, queue = (view.output(k) for k in DLQ_OUTPUTS[args.dlq])
            handle = redrive(client("sqs"), dlq, queue, args.max_per_second)
            print(f"moving the terminal events' dead letters to the stack's events queue: task {handle}")
        else:
            dlq, target = (view.output(k) for k in DLQ_OUTPUTS[args.dlq])
            moved = redrive_events(client("sqs"), dlq, target, client)
            print(f"delivered {moved} terminal events to {target} (that rule's target alone)")
    except OpsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

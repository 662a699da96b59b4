"""Deploy the real template.yaml into ministack (no Docker) and drive the deployed system.

ministack (a local AWS emulator, https://github.com/ministackorg/ministack) runs the template's
Lambdas as warm Python subprocesses of its own interpreter, fires the classic ``Schedule`` rule,
runs the SQS event source mapping (``BatchSize``, ``MaximumConcurrency``,
``ReportBatchItemFailures``, redrive to the DLQ) and captures each invocation's output in
CloudWatch Logs. So ``sam build`` + ``sam deploy`` of the project's own template give the real
wiring: the deployed schedule, queue and functions do the work; this module only starts things,
deploys, submits and reads state. Pieces::

    ensure_venvs()                      # .venv-ministack and .venv-sam, created when missing
    with MinistackServer() as ms:       # child process on a free 127.0.0.1 port, TMPDIR in .scratch
        stack = deploy(ms.endpoint_url, template=build(), sume_base_url=..., redis_url=...,
                       api_key=...)     # -> DeployedStack (outputs, clients, helpers)
        sink = stack.event_sink()       # EventBridge rule -> SQS queue for the terminal events
        stack.submit({...}); stack.fanout(); stack.records(); sink.drain(); stack.metric_totals()

:class:`MinistackBackend` is the demo's ``ministack`` backend (``python -m tools.demo``).

Where ministack differs from AWS (and what is done about it here):

* Its CloudFormation stores ``ScalingConfig: {MaximumConcurrency: !Ref PollMaxConcurrency}`` as a
  string and its SQS poller then fails on every pass (no message is ever delivered): after the
  deploy, :meth:`DeployedStack.normalise_event_source_mappings` writes the same value back as a
  number through ``UpdateEventSourceMapping``.
* ``ReservedConcurrentExecutions`` in a template is not applied by its CloudFormation: after the
  deploy, :func:`deploy` sets each function's reserved concurrency from the template with
  ``PutFunctionConcurrency`` (ministack enforces it once set).
* Powertools' EMF metric lines land in the functions' log groups but ministack does not turn
  them into CloudWatch metrics: :class:`EmfTotals` reads the log lines and sums the metrics.
* It accepts ``DelaySeconds`` > 900 (real SQS rejects it): never rely on it to catch that.
* ``sam deploy`` splits ``--parameter-overrides`` on spaces: values with spaces are quoted
  (``FanOutSchedule="rate(1 minute)"``), see :func:`parameter_overrides`.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from tools.services import HttpService, ServiceError

__all__ = [
    "API_KEY_NAME",
    "DEFAULT_OVERRIDES",
    "DeployError",
    "DeployedStack",
    "EmfTotals",
    "EventSink",
    "MinistackBackend",
    "MinistackServer",
    "VenvError",
    "build",
    "deploy",
    "ensure_venvs",
    "parameter_overrides",
]

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = ROOT / ".scratch" / "ministack"
REGION = "us-east-1"
API_KEY_NAME = "/sume-poller/api-key"
#: Dummy credentials: ministack accepts any; a non-numeric key maps to account 000000000000.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION}
MINISTACK_VENV = ROOT / ".venv-ministack"
SAM_VENV = ROOT / ".venv-sam"

#: Template parameters for local runs (the rest keep the template's defaults).
DEFAULT_OVERRIDES: dict[str, str] = {
    "FanOutSchedule": "rate(1 minute)",
    "SumeApiKeyName": API_KEY_NAME,
    # Short lease margin: a lost chain is picked up by fan-out a few seconds after its delay ends.
    "LeaseMarginSeconds": "5",
}

READY_TIMEOUT_S = 60.0
BUILD_TIMEOUT_S = 900.0
DEPLOY_TIMEOUT_S = 600.0
_TAIL = 4000


class VenvError(RuntimeError):
    """A virtualenv this module needs could not be created."""


class DeployError(RuntimeError):
    """``sam build`` / ``sam deploy`` failed, or the stack did not come up as expected."""


# ---------------------------------------------------------------------------------------------
# Virtualenvs
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Venv:
    path: Path
    packages: tuple[str, ...]  # installed in ONE pip command (ministack pins botocore exactly)
    probe: str  # python code that must run in the venv
    entry: str  # console script that must exist

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def ok(self) -> bool:
        if not self.python.exists() or not (self.path / "bin" / self.entry).exists():
            return False
        probe = subprocess.run([str(self.python), "-c", self.probe], capture_output=True, timeout=120)
        return probe.returncode == 0


VENVS = (
    # boto3 must be in ministack's venv: the Lambdas run on ministack's own interpreter, like
    # the real python3.11 runtime, which ships boto3 (the layer does not carry it).
    _Venv(MINISTACK_VENV, ("ministack", "boto3", "aws-sam-translator"),
          "import ministack, boto3, samtranslator", "ministack"),
    # aws-sam-cli pins boto3 and friends: a virtualenv of its own.
    _Venv(SAM_VENV, ("aws-sam-cli",), "import samcli", "sam"),
)


def _base_python() -> str:
    found = shutil.which("python3.11")
    if found:
        return found
    base = getattr(sys, "_base_executable", None) or sys.executable
    return str(base)


@contextlib.contextmanager
def _file_lock(name: str) -> Iterator[None]:
    """An exclusive lock shared by every process of this checkout (concurrent runs, tests)."""
    SCRATCH.mkdir(parents=True, exist_ok=True)
    with open(SCRATCH / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_venvs(log: Any = None) -> None:
    """Create ``.venv-ministack`` and ``.venv-sam`` when missing or broken; raise :class:`VenvError`
    with pip's output when that fails. Cheap when both are fine (one import probe each)."""
    say = log or (lambda text: print(text, file=sys.stderr))
    with _file_lock("venvs"):
        for venv in VENVS:
            if venv.ok():
                continue
            say(f"creating {venv.path.name} ({' '.join(venv.packages)}); this takes a minute or two")
            env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
            steps = [
                [_base_python(), "-m", "venv", str(venv.path)],
                [str(venv.python), "-m", "pip", "install", "-q", "--upgrade", "pip"],
                [str(venv.python), "-m", "pip", "install", "-q", *venv.packages],
            ]
            for step in steps:
                done = subprocess.run(step, capture_output=True, text=True, env=env, timeout=1800)
                if done.returncode != 0:
                    raise VenvError(f"creating {venv.path} failed: {' '.join(step)} exited with "
                                    f"{done.returncode}\n{(done.stdout + done.stderr)[-_TAIL:]}")
            if not venv.ok():
                raise VenvError(f"{venv.path} was created but `{venv.probe}` still fails in it")
            (venv.path / ".installed").touch()  # the Makefile's marker for the same venv


# ---------------------------------------------------------------------------------------------
# The ministack server
# ---------------------------------------------------------------------------------------------

def _children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc; empty elsewhere)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def _descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, start time) of every descendant, so a PID is only signalled if it is still the same process."""
    out: list[tuple[int, str]] = []
    todo = _children_of(pid)
    while todo:
        child = todo.pop()
        stamp = _start_time(child)
        if stamp is not None:
            out.append((child, stamp))
            todo += _children_of(child)
    return out


def _prune_stale(parent: Path) -> None:
    """Remove ``<pid>-...`` entries of processes that are gone (a run that was SIGKILLed)."""
    for entry in parent.glob("*-*"):
        pid = entry.name.split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(entry, ignore_errors=True)


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22: starttime


class MinistackServer(HttpService):
    """``ministack`` on 127.0.0.1 (a child process on a free port) with its own TMPDIR under
    ``.scratch/ministack``; ``.endpoint_url`` is ``http://127.0.0.1:P``.

    Stopping sends SIGTERM to ministack, then stops (by PID, checked against its start time)
    any Lambda worker subprocess of it that is still alive.
    """

    name = "ministack"

    def __init__(self, port: int | None = None, ready_timeout: float = READY_TIMEOUT_S) -> None:
        super().__init__(port, ready_timeout)
        self.tmpdir: Path | None = None

    def _command(self) -> list[str]:
        binary = MINISTACK_VENV / "bin" / "ministack"
        if not binary.exists():
            raise ServiceError(f"{binary} not found: run tools.ministack.ensure_venvs() (make setup)")
        if sys.platform == "linux":
            _prune_stale(SCRATCH / "run")
        self.tmpdir = SCRATCH / "run" / f"{os.getpid()}-{self.port}-{uuid.uuid4().hex[:6]}"
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        # _Service starts the command without an env of its own: `env` sets it and execs ministack
        # (same PID). Its Lambda workers inherit it: TMPDIR keeps their files in .scratch.
        # setpriv --pdeathsig: ministack gets SIGTERM if this process dies without stopping it.
        guard = ["setpriv", "--pdeathsig", "TERM"] if shutil.which("setpriv") and sys.platform == "linux" else []
        # -u AWS_ENDPOINT_URL: a local run may have set it (for moto) in this process.
        return [*guard, "env", "-u", "AWS_ENDPOINT_URL", f"GATEWAY_PORT={self.port}", "BIND_HOST=127.0.0.1",
                f"TMPDIR={self.tmpdir}",
                f"MINISTACK_REGION={REGION}", "LOG_LEVEL=WARNING", "LAMBDA_EXECUTOR=local",
                *(f"{k}={v}" for k, v in CREDENTIALS.items()), str(binary)]

    def _probe(self) -> bool:
        return self._request("GET", "/_ministack/health", timeout=1.0, quiet=True)

    def reset(self) -> None:
        """Forget every resource (POST /_ministack/reset)."""
        if not self._request("POST", "/_ministack/reset", timeout=30.0, quiet=False):
            raise ServiceError(f"ministack reset failed on {self.endpoint_url}")

    @staticmethod
    def _signal(processes: list[tuple[int, str]], signum: int) -> None:
        for pid, stamp in processes:
            if _start_time(pid) == stamp:  # still the same process, not a reused PID
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)

    def stop(self) -> None:
        process = self._process
        workers = _descendants(process.pid) if process is not None and process.poll() is None else []
        # Its Lambda workers first (ministack otherwise stops them one by one, seconds each),
        # then ministack, then whatever of them is still alive.
        self._signal(workers, signal.SIGTERM)
        super().stop()
        self._signal(workers, signal.SIGKILL)
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None


# ---------------------------------------------------------------------------------------------
# Build and deploy
# ---------------------------------------------------------------------------------------------

_built: Path | None = None
_built_lock = threading.Lock()


def _sam_env(endpoint_url: str | None = None) -> dict[str, str]:
    env = {**os.environ, "SAM_CLI_TELEMETRY": "0", **CREDENTIALS}
    env.pop("AWS_PROFILE", None)
    if endpoint_url:
        env["AWS_ENDPOINT_URL"] = endpoint_url
    return env


def build(*, force: bool = False, template: Path = ROOT / "template.yaml") -> Path:
    """``sam build`` of the project's template, once per process; returns the built template.

    Builds into a directory of this process under ``.scratch/ministack`` (so a concurrent
    ``make sam-build`` or another run cannot change it under a deploy) from a build cache shared
    by every run of this checkout (a rebuild with unchanged sources takes a few seconds).
    """
    global _built
    with _built_lock:
        if _built is not None and _built.exists() and not force:
            return _built
        sam = SAM_VENV / "bin" / "sam"
        if not sam.exists():
            raise DeployError(f"{sam} not found: run tools.ministack.ensure_venvs() (make setup)")
        work = SCRATCH / "sam"  # sam writes build.toml and .aws-sam/deps relative to its cwd
        work.mkdir(parents=True, exist_ok=True)
        if sys.platform == "linux":
            _prune_stale(SCRATCH / "builds")
        build_dir = SCRATCH / "builds" / f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        atexit.register(shutil.rmtree, build_dir, True)
        command = [str(sam), "build", "--template-file", str(template), "--build-dir", str(build_dir),
                   "--cache-dir", str(work / "cache"), "--cached"]
        with _file_lock("sam-build"):
            done = subprocess.run(command, cwd=work, env=_sam_env(), capture_output=True, text=True,
                                  timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise DeployError(f"sam build failed ({done.returncode}):\n{(done.stdout + done.stderr)[-_TAIL:]}")
        _built = build_dir / "template.yaml"
        return _built


def parameter_overrides(values: Mapping[str, Any]) -> list[str]:
    """``Key=Value`` arguments for ``sam deploy --parameter-overrides``; values are quoted
    because sam splits the list on whitespace (``rate(1 minute)`` would lose ``minute)``)."""
    out = []
    for key, value in values.items():
        text = str(value)
        if '"' in text:
            raise ValueError(f"parameter {key} contains a double quote: {text!r}")
        out.append(f'{key}="{text}"')
    return out


def _session(endpoint_url: str) -> Any:
    import boto3
    from botocore.config import Config

    session = boto3.session.Session(aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                                    aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                                    region_name=REGION)
    config = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=60,
                    max_pool_connections=20)
    return lambda service: session.client(service, endpoint_url=endpoint_url, config=config)


def deploy(endpoint_url: str, *, sume_base_url: str, redis_url: str, api_key: str,
           template: Path | None = None, stack_name: str = "sume-poller",
           overrides: Mapping[str, Any] | None = None, bucket: str = "sume-poller-artifacts") -> DeployedStack:
    """Store the Sume key, ``sam deploy`` the built template into ministack, return the stack.

    The key goes where the template says: an SSM SecureString named by ``SumeApiKeyName``.
    ``overrides`` are template parameters on top of :data:`DEFAULT_OVERRIDES`.
    """
    built = template or build()
    params: dict[str, Any] = {**DEFAULT_OVERRIDES, "SumeBaseUrl": sume_base_url, "RedisUrl": redis_url,
                              **(overrides or {})}
    client = _session(endpoint_url)
    s3 = client("s3")
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
        s3.create_bucket(Bucket=bucket)
    client("ssm").put_parameter(Name=str(params["SumeApiKeyName"]), Value=api_key, Type="SecureString",
                                Overwrite=True)
    command = [str(SAM_VENV / "bin" / "sam"), "deploy", "--template-file", str(built),
               "--stack-name", stack_name, "--s3-bucket", bucket, "--region", REGION,
               "--capabilities", "CAPABILITY_IAM", "--no-confirm-changeset", "--no-fail-on-empty-changeset",
               "--no-progressbar", "--parameter-overrides", *parameter_overrides(params)]
    work = SCRATCH / "sam"
    work.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(command, cwd=work, env=_sam_env(endpoint_url), capture_output=True, text=True,
                          timeout=DEPLOY_TIMEOUT_S)
    if done.returncode != 0:
        raise DeployError(f"sam deploy failed ({done.returncode}):\n{(done.stdout + done.stderr)[-_TAIL:]}")
    stack = DeployedStack(stack_name, endpoint_url, client)
    stack.apply_reserved_concurrency(built)
    stack.normalise_event_source_mappings()
    return stack


# ---------------------------------------------------------------------------------------------
# The deployed stack
# ---------------------------------------------------------------------------------------------

def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | set):
        return [_plain(v) for v in value]
    return value


def _from_item(item: Mapping[str, Any]) -> dict[str, Any]:
    """A DynamoDB item as plain Python (numbers as int/float)."""
    from boto3.dynamodb.types import TypeDeserializer

    deserializer = TypeDeserializer()
    return {k: _plain(deserializer.deserialize(v)) for k, v in item.items()}


class InvokeError(RuntimeError):
    """A deployed function returned an error (FunctionError) or was throttled."""


@dataclass
class DeployedStack:
    """A deployed sume-poller stack: its outputs and helpers to drive and read it."""

    name: str
    endpoint_url: str
    client: Any  # service name -> boto3 client on ministack
    outputs: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.cfn = self.client("cloudformation")
        self.lam = self.client("lambda")
        self.sqs = self.client("sqs")
        self.ddb = self.client("dynamodb")
        self.events = self.client("events")
        self.logs = self.client("logs")
        described = self.cfn.describe_stacks(StackName=self.name)["Stacks"][0]
        status = described.get("StackStatus", "")
        if not status.endswith("_COMPLETE") or "ROLLBACK" in status:
            raise DeployError(f"stack {self.name} is {status}")
        self.outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
        missing = {"JobsTableName", "PollQueueUrl", "PollDeadLetterQueueUrl", "FanOutFunctionName",
                   "PollFunctionName", "SubmitFunctionName"} - set(self.outputs)
        if missing:
            raise DeployError(f"stack {self.name} lacks outputs {sorted(missing)}: {self.outputs}")

    # -- outputs --------------------------------------------------------------------------
    @property
    def table(self) -> str:
        return self.outputs["JobsTableName"]

    @property
    def queue_url(self) -> str:
        return self.outputs["PollQueueUrl"]

    @property
    def dlq_url(self) -> str:
        return self.outputs["PollDeadLetterQueueUrl"]

    @property
    def submit_function(self) -> str:
        return self.outputs["SubmitFunctionName"]

    @property
    def poll_function(self) -> str:
        return self.outputs["PollFunctionName"]

    @property
    def fanout_function(self) -> str:
        return self.outputs["FanOutFunctionName"]

    def physical_ids(self) -> dict[str, str]:
        resources = self.cfn.describe_stack_resources(StackName=self.name)["StackResources"]
        return {r["LogicalResourceId"]: r["PhysicalResourceId"] for r in resources}

    def apply_reserved_concurrency(self, built_template: Path) -> dict[str, int]:
        """Set ``ReservedConcurrentExecutions`` from the template (ministack's CloudFormation
        ignores the property; its Lambda service enforces it once set through the API)."""
        from tools.template import load_template

        template = load_template(built_template)
        ids = self.physical_ids()
        applied: dict[str, int] = {}
        for logical_id, resource in template.get("Resources", {}).items():
            if resource.get("Type") not in ("AWS::Serverless::Function", "AWS::Lambda::Function"):
                continue
            reserved = (resource.get("Properties") or {}).get("ReservedConcurrentExecutions")
            if isinstance(reserved, int) and logical_id in ids:
                self.lam.put_function_concurrency(FunctionName=ids[logical_id],
                                                  ReservedConcurrentExecutions=reserved)
                applied[logical_id] = reserved
        return applied

    def normalise_event_source_mappings(self) -> list[str]:
        """Store each SQS mapping's ``ScalingConfig.MaximumConcurrency`` as a number.

        ministack's CloudFormation keeps the value of ``MaximumConcurrency: !Ref PollMaxConcurrency``
        as the string CloudFormation passes parameters as, and its SQS poller then fails on every
        pass (``'>=' not supported between 'int' and 'str'``) so no message is ever delivered.
        AWS coerces it; here the same value is written back through UpdateEventSourceMapping,
        whose API path stores an integer.
        """
        fixed = []
        for function in (self.poll_function, self.fanout_function, self.submit_function):
            mappings = self.lam.list_event_source_mappings(FunctionName=function)["EventSourceMappings"]
            for mapping in mappings:
                scaling = mapping.get("ScalingConfig") or {}
                if scaling.get("MaximumConcurrency") is not None:
                    self.lam.update_event_source_mapping(
                        UUID=mapping["UUID"], ScalingConfig={"MaximumConcurrency": int(scaling["MaximumConcurrency"])})
                    fixed.append(mapping["UUID"])
        return fixed

    # -- invoking ---------------------------------------------------------------------------
    def invoke(self, function: str, event: Any) -> Any:
        """Synchronous invoke (RequestResponse); the function's JSON reply."""
        reply = self.lam.invoke(FunctionName=function, InvocationType="RequestResponse",
                                Payload=json.dumps(event).encode())
        payload = reply["Payload"].read()
        if reply.get("FunctionError") or int(reply.get("StatusCode", 200)) >= 300:
            raise InvokeError(f"{function} failed ({reply.get('FunctionError')}): {payload[:2000]!r}")
        return json.loads(payload) if payload else None

    def submit(self, event: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = self.invoke(self.submit_function, event)
        return reply

    def fanout(self, timeout: float = 60.0) -> dict[str, Any]:
        """Run the deployed fan-out now, with the event its schedule sends; its report.

        Fan-out has a reserved concurrency of 1: while the schedule's own run is in progress an
        invoke is throttled (TooManyRequestsException), so it is retried until ``timeout``.
        """
        event = {"version": "0", "id": str(uuid.uuid4()), "detail-type": "Scheduled Event",
                 "source": "aws.events", "account": "000000000000",
                 "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "region": REGION,
                 "resources": [], "detail": {}}
        deadline = time.monotonic() + timeout
        while True:
            try:
                reply: dict[str, Any] = self.invoke(self.fanout_function, event)
                return reply
            except self.lam.exceptions.TooManyRequestsException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def send(self, body: str, delay: int = 0) -> None:
        """Put a message straight on the deployed poll queue."""
        self.sqs.send_message(QueueUrl=self.queue_url, MessageBody=body, DelaySeconds=delay)

    # -- reading state -------------------------------------------------------------------
    def scan(self, attributes: tuple[str, ...] = ("job_id", "status")) -> list[dict[str, Any]]:
        """Every job record (consistent scan), with only ``attributes``."""
        names = {f"#a{i}": a for i, a in enumerate(attributes)}
        kwargs: dict[str, Any] = {"TableName": self.table, "ConsistentRead": True,
                                  "ProjectionExpression": ", ".join(names),
                                  "ExpressionAttributeNames": names}
        items: list[dict[str, Any]] = []
        while True:
            reply = self.ddb.scan(**kwargs)
            items.extend(_from_item(i) for i in reply.get("Items", []))
            if not reply.get("LastEvaluatedKey"):
                return items
            kwargs["ExclusiveStartKey"] = reply["LastEvaluatedKey"]

    def records(self) -> list[dict[str, Any]]:
        return self.scan(("job_id", "status"))

    def job(self, job_id: str) -> dict[str, Any] | None:
        item = self.ddb.get_item(TableName=self.table, Key={"job_id": {"S": job_id}}, ConsistentRead=True)
        return _from_item(item["Item"]) if "Item" in item else None

    def queue_depth(self, url: str | None = None) -> int:
        attrs = self.sqs.get_queue_attributes(QueueUrl=url or self.queue_url, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed"])["Attributes"]
        return sum(int(v) for v in attrs.values())

    def dlq_depth(self) -> int:
        return self.queue_depth(self.dlq_url)

    def event_sink(self, bus: str = "default") -> EventSink:
        return EventSink.create(self.sqs, self.events, bus)

    def metric_totals(self) -> EmfTotals:
        return EmfTotals(self.logs, f"/aws/lambda/{self.poll_function}")


class EventSink:
    """An SQS queue fed by an EventBridge rule that matches this project's terminal events
    (``source: sume.poller``) on the bus the functions publish to."""

    def __init__(self, sqs: Any, url: str) -> None:
        self.sqs = sqs
        self.url = url
        self.received: list[dict[str, Any]] = []  # event details, in arrival order

    @classmethod
    def create(cls, sqs: Any, events: Any, bus: str = "default") -> EventSink:
        name = f"sume-poller-events-sink-{uuid.uuid4().hex[:6]}"
        url = sqs.create_queue(QueueName=name)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        rule = f"{name}-rule"
        events.put_rule(Name=rule, EventBusName=bus, EventPattern=json.dumps({"source": ["sume.poller"]}))
        events.put_targets(Rule=rule, EventBusName=bus, Targets=[{"Id": "sink", "Arn": arn}])
        return cls(sqs, url)

    def drain(self, wait_seconds: int = 0) -> list[dict[str, Any]]:
        """Receive (and delete) what is on the sink now; the first receive may long-poll up to
        ``wait_seconds``. Returns the new event details (also kept in ``received``)."""
        new: list[dict[str, Any]] = []
        wait = wait_seconds
        while True:
            reply = self.sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=10, WaitTimeSeconds=wait)
            messages = reply.get("Messages", [])
            if not messages:
                self.received.extend(new)
                return new
            wait = 0
            for message in messages:
                body = json.loads(message["Body"])
                new.append({**body.get("detail", {}), "_event_id": body.get("id")})
            self.sqs.delete_message_batch(QueueUrl=self.url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)])


class EmfTotals:
    """Sums of the Powertools EMF metrics a function printed, read from its CloudWatch log group.

    ministack stores each invocation's output in ``/aws/lambda/<name>`` but does not extract
    EMF into metrics, so the lines are read here: incrementally (a time watermark with a few
    seconds of overlap, de-duplicated by stream and message) and summed per metric name.
    """

    OVERLAP_MS = 5_000
    LIMIT = 10_000

    def __init__(self, logs: Any, group: str) -> None:
        self.logs = logs
        self.group = group
        self.totals: Counter[str] = Counter()
        self._watermark = 0
        self._recent: dict[tuple[str, str], int] = {}  # (stream, message) -> timestamp
        self._lock = threading.Lock()

    def refresh(self) -> Counter[str]:
        with self._lock:
            while True:
                start = max(0, self._watermark - self.OVERLAP_MS)
                try:
                    reply = self.logs.filter_log_events(logGroupName=self.group, startTime=start,
                                                        filterPattern='"_aws"', limit=self.LIMIT)
                except self.logs.exceptions.ResourceNotFoundException:
                    return Counter(self.totals)  # nothing logged yet
                events = reply.get("events", [])
                for event in events:
                    key = (event.get("logStreamName", ""), event.get("message", ""))
                    if key in self._recent:
                        continue
                    self._recent[key] = int(event["timestamp"])
                    self._watermark = max(self._watermark, int(event["timestamp"]))
                    self._add(event.get("message", ""))
                floor = self._watermark - 2 * self.OVERLAP_MS
                self._recent = {k: t for k, t in self._recent.items() if t >= floor}
                if len(events) < self.LIMIT:
                    return Counter(self.totals)

    def _add(self, message: str) -> None:
        start = message.find("{")
        if start < 0:
            return
        try:
            data = json.loads(message[start:])
        except ValueError:
            return
        if not isinstance(data, dict) or "_aws" not in data:
            return
        for directive in data["_aws"].get("CloudWatchMetrics", []):
            for metric in directive.get("Metrics", []):
                value = data.get(metric.get("Name"))
                values = value if isinstance(value, list) else [value]
                self.totals[metric["Name"]] += int(sum(v for v in values if isinstance(v, int | float)))


# ---------------------------------------------------------------------------------------------
# The demo backend
# ---------------------------------------------------------------------------------------------

#: Demo knobs: more poll concurrency than the template's default (5) makes a few hundred jobs
#: finish sooner on a small machine; every other parameter keeps its template default.
DEMO_OVERRIDES: dict[str, Any] = {"PollMaxConcurrency": 8, "PollBatchSize": 10}


def _sigterm_as_interrupt() -> None:
    """Let SIGTERM (``timeout``, ``kill PID``) unwind like Ctrl-C, so everything started is stopped."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def interrupt(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt(f"signal {signum}")
        signal.signal(signal.SIGTERM, interrupt)


class MinistackBackend:
    """The demo's default backend: template.yaml deployed into ministack; the deployed schedule,
    SQS event source mapping and Lambdas do the work, this process only submits and reads."""

    name = "template.yaml deployed into ministack"

    def __init__(self, stack: DeployedStack, sink: EventSink, sim: Any) -> None:
        self.stack = stack
        self.sink = sink
        self.sim = sim
        self.metrics = stack.metric_totals()
        self._metrics_at = 0.0
        self._counters: dict[str, int] = {"requeues": 0, "contention": 0}

    @classmethod
    def start(cls, stack: contextlib.ExitStack, *, time_scale: float,
              overrides: Mapping[str, Any] | None = None, log: Any = None) -> MinistackBackend:
        from tools.services import RedisServer
        from tools.sume_sim import SumeSimulator

        say = log or (lambda text: print(text, file=sys.stderr, flush=True))
        started = time.monotonic()
        _sigterm_as_interrupt()
        ensure_venvs(say)
        subprocess.run([str(ROOT / "scripts" / "ensure-redis.sh")], check=True)
        key = "sume_demo_" + uuid.uuid4().hex
        redis_server = stack.enter_context(RedisServer())
        sim = stack.enter_context(SumeSimulator(api_key=key, hints=True, time_scale=time_scale))
        ministack = stack.enter_context(MinistackServer())
        say(f"ministack on {ministack.endpoint_url} (pid {ministack.pid}), redis-server on port "
            f"{redis_server.port} (pid {redis_server.pid}), Sume simulator on {sim.base_url}")
        say("sam build ...")
        template = build()
        say("sam deploy into ministack ...")
        deployed = deploy(ministack.endpoint_url, template=template, sume_base_url=sim.base_url,
                          redis_url=redis_server.url, api_key=key, stack_name="sume-poller-demo",
                          overrides={**DEMO_OVERRIDES, **(overrides or {})})
        sink = deployed.event_sink()
        say(f"deployed stack {deployed.name} in {time.monotonic() - started:.0f} s: {deployed.outputs}")
        return cls(deployed, sink, sim)

    def submit(self, event: dict[str, Any]) -> dict[str, Any]:
        return self.stack.submit(event)

    def tick(self) -> None:
        # The deployed schedule (fan-out) and the SQS event source (poll) do the work. Wait for
        # terminal events instead of spinning: a long poll of the sink, at most 1 s.
        self.sink.drain(wait_seconds=1)

    def records(self) -> list[dict[str, Any]]:
        return self.stack.records()

    def events(self, settle_timeout: float = 20.0) -> list[dict[str, Any]]:
        """Every terminal event so far. A job's event is put on the bus just after its terminal
        write, so first wait (bounded) until no record still has its event pending."""
        deadline = time.monotonic() + settle_timeout
        while time.monotonic() < deadline:
            unsent = [r for r in self.stack.scan(("job_id", "status", "event_pending"))
                      if r.get("status") != "pending" and r.get("event_pending")]
            if not unsent:
                break
            self.sink.drain(wait_seconds=1)
        self.sink.drain(wait_seconds=1)
        return list(self.sink.received)

    def dlq_depth(self) -> int:
        return self.stack.dlq_depth()

    def counters(self) -> dict[str, int]:
        if time.monotonic() - self._metrics_at >= 2.0:  # the live view asks every tick
            totals = self.metrics.refresh()
            self._metrics_at = time.monotonic()
            self._counters = {
                "requeues": sum(totals[f"Outcome_{n}"] for n in ("requeued", "transient", "hopped",
                                                                 "result_not_ready")),
                "contention": totals["LeaseContention"],
            }
        return dict(self._counters)

    def sim_stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self.sim.stats()
        return stats

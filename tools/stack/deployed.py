"""DeployedStack: template.yaml built with ``sam build`` and deployed with ``sam deploy`` into
ministack (a pure-Python local AWS: CloudFormation with the SAM transform, Lambdas as local
processes, SQS event source mappings, EventBridge schedules, CloudWatch Logs). The deployed
schedule, event source mapping and functions do the work; this process starts the services,
deploys, submits and reads state. No Docker.

Where ministack differs from AWS, and what is done about it here:

* Its CloudFormation fails the whole stack on a CloudWatch alarm over metric math
  (``Metrics``): the template has none (every alarm is one metric).
* Its CloudFormation stores ``ScalingConfig.MaximumConcurrency: !Ref PollMaxConcurrency`` as the
  string parameters arrive as, and its SQS poller then fails on every pass (nothing is ever
  delivered): after the deploy the same value is written back as a number with
  UpdateEventSourceMapping.
* It ignores ``ReservedConcurrentExecutions``: after the deploy it is applied with
  PutFunctionConcurrency (ministack enforces it once set).
* ``sam deploy`` splits ``--parameter-overrides`` on whitespace: every value is quoted.
* It does not turn EMF lines into CloudWatch metrics: :meth:`metric_totals` reads the functions'
  log groups (:class:`tools.stack.base.LogGroupMetrics`).
* It accepts SQS ``DelaySeconds`` over 900 (real SQS rejects them): tests of that limit use the
  in-process stack on moto.
* It does not implement SQS StartMessageMoveTask (``make redrive``; see tools/ops.py).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from mirakuru.exceptions import ProcessFinishedWithError

from tools.services import Service, free_port
from tools.stack.base import (
    CREDENTIALS,
    REGION,
    ROOT,
    SCRATCH,
    TEMPLATE,
    EventSink,
    JobTable,
    LogGroupMetrics,
    Stack,
    aws_clients,
    prune_stale,
    require,
    stack_parameters,
    wait_until,
)

MINISTACK = ROOT / ".venv-ministack" / "bin" / "ministack"
SAM = ROOT / ".venv-sam" / "bin" / "sam"
UV = ROOT / ".venv-uv" / "bin" / "uv"
UV_WRAPPER = ROOT / "scripts" / "uv.sh"  # uv with pip's index configuration
ARTIFACT_BUCKET = "sume-poller-artifacts"
BUILD_TIMEOUT_S = 600.0
DEPLOY_TIMEOUT_S = 600.0
QUIESCE_S = 20.0
_TAIL = 4000


class DeployError(RuntimeError):
    """``sam build`` / ``sam deploy`` failed, or the stack did not come up as the template says."""


class InvokeError(RuntimeError):
    """A deployed function returned an error."""


# ---------------------------------------------------------------------------------------------
# The ministack server
# ---------------------------------------------------------------------------------------------

class MinistackServer(Service):
    """ministack on a free 127.0.0.1 port, TMPDIR under ``.scratch/stack``; ready when its health
    route answers. Stopping it stops its Lambda workers too (mirakuru: its process group and every
    process that inherited its environment marker)."""

    name = "ministack"

    def __init__(self, port: int | None = None, ready_timeout: float = 60.0) -> None:
        binary = require(MINISTACK, ".venv-ministack")
        prune_stale(SCRATCH / "ministack")
        port = port or free_port()
        self.tmpdir = SCRATCH / "ministack" / f"{os.getpid()}-{port}-{uuid.uuid4().hex[:6]}"
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        # setpriv --pdeathsig: ministack gets SIGTERM if this process dies without stopping it.
        guard = ["setpriv", "--pdeathsig", "TERM"] if shutil.which("setpriv") else []
        # -u: this process may point boto3 at moto (ministack's Lambdas get their own endpoint)
        # and Python at the layer's sources (they must import the built layer).
        super().__init__([*guard, "env", "-u", "AWS_ENDPOINT_URL", "-u", "PYTHONPATH", f"GATEWAY_PORT={port}",
                          "BIND_HOST=127.0.0.1", f"TMPDIR={self.tmpdir}", f"MINISTACK_REGION={REGION}",
                          "LOG_LEVEL=WARNING", "LAMBDA_EXECUTOR=local", *(f"{k}={v}" for k, v in CREDENTIALS.items()),
                          str(binary)], port, ready_timeout)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def after_start_check(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint_url}/_ministack/health", timeout=1.0) as reply:
                return 200 <= int(reply.status) < 300
        except OSError:
            return False

    def stop(self, *args: Any, **kwargs: Any) -> Self:
        with contextlib.suppress(ProcessFinishedWithError):  # whatever code it exits with on SIGTERM
            super().stop(*args, **kwargs)
        shutil.rmtree(self.tmpdir, ignore_errors=True)
        return self


# ---------------------------------------------------------------------------------------------
# sam build, sam deploy
# ---------------------------------------------------------------------------------------------

_built: Path | None = None
_built_lock = threading.Lock()


@contextlib.contextmanager
def _file_lock(name: str) -> Iterator[None]:
    """A lock shared by every process of this checkout (the demo and a test run at once)."""
    SCRATCH.mkdir(parents=True, exist_ok=True)
    with open(SCRATCH / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _sam(args: list[str], endpoint_url: str | None, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SAM_CLI_TELEMETRY": "0", **CREDENTIALS}
    if UV.exists():  # the layer's packages installed with uv (layers/sume_poller/Makefile)
        env["SUME_UV"] = str(UV_WRAPPER)
    env.pop("AWS_PROFILE", None)
    env.pop("AWS_ENDPOINT_URL", None)
    if endpoint_url:
        env["AWS_ENDPOINT_URL"] = endpoint_url
    work = SCRATCH / "sam"  # sam writes build.toml and its deps cache relative to the cwd
    work.mkdir(parents=True, exist_ok=True)
    return subprocess.run([str(require(SAM, ".venv-sam")), *args], cwd=work, env=env, capture_output=True,
                          text=True, timeout=timeout)


def build() -> Path:
    """``sam build`` of template.yaml once per process, into a build directory of this process
    (a concurrent ``make build`` cannot change it under a deploy), from a cache shared by the
    runs of this checkout. Returns the built template."""
    global _built
    with _built_lock:
        if _built is not None and _built.exists():
            return _built
        prune_stale(SCRATCH / "builds")
        build_dir = SCRATCH / "builds" / f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        atexit.register(shutil.rmtree, build_dir, True)
        with _file_lock("sam-build"):
            done = _sam(["build", "--template-file", str(TEMPLATE), "--build-dir", str(build_dir),
                         "--cache-dir", str(SCRATCH / "sam" / "cache"), "--cached"], None, BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise DeployError(f"sam build failed ({done.returncode}):\n{(done.stdout + done.stderr)[-_TAIL:]}")
        _built = build_dir / "template.yaml"
        return _built


def parameter_overrides(values: Mapping[str, str]) -> list[str]:
    """``Key="Value"`` arguments: sam splits ``--parameter-overrides`` on whitespace."""
    for key, value in values.items():
        if '"' in value:
            raise ValueError(f"parameter {key} contains a double quote: {value!r}")
    return [f'{key}="{value}"' for key, value in values.items()]


@dataclass
class Deployment:
    outputs: dict[str, str]  # the stack's outputs
    functions: dict[str, str]  # logical id -> deployed function name


def deploy(client: Callable[[str], Any], endpoint_url: str, stack_name: str, parameters: Mapping[str, str],
           api_key: str) -> Deployment:
    """Store the Sume key where the template reads it, ``sam deploy`` the built template, apply
    what ministack leaves out."""
    template = build()
    s3 = client("s3")
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
        s3.create_bucket(Bucket=ARTIFACT_BUCKET)
    client("ssm").put_parameter(Name=parameters["SumeApiKeyName"], Value=api_key, Type="SecureString",
                                Overwrite=True)
    done = _sam(["deploy", "--template-file", str(template), "--stack-name", stack_name, "--s3-bucket",
                 ARTIFACT_BUCKET, "--region", REGION, "--capabilities", "CAPABILITY_IAM",
                 "--no-confirm-changeset", "--no-fail-on-empty-changeset", "--no-progressbar",
                 "--parameter-overrides", *parameter_overrides(parameters)], endpoint_url, DEPLOY_TIMEOUT_S)
    if done.returncode != 0:
        raise DeployError(f"sam deploy failed ({done.returncode}): {_failures(client, stack_name)}\n"
                          f"{(done.stdout + done.stderr)[-_TAIL:]}")
    cfn = client("cloudformation")
    described = cfn.describe_stacks(StackName=stack_name)["Stacks"][0]
    status = described.get("StackStatus", "")
    if not status.endswith("_COMPLETE") or "ROLLBACK" in status:
        raise DeployError(f"stack {stack_name} is {status}")
    outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
    missing = {"JobsTableName", "PollQueueUrl", "PollDeadLetterQueueUrl"} - set(outputs)
    if missing:
        raise DeployError(f"stack {stack_name} lacks outputs {sorted(missing)}: {outputs}")
    resources = cfn.describe_stack_resources(StackName=stack_name)["StackResources"]
    functions = {r["LogicalResourceId"]: r["PhysicalResourceId"] for r in resources
                 if r["ResourceType"] == "AWS::Lambda::Function"}
    _apply_reserved_concurrency(client, functions, parameters)
    _numeric_maximum_concurrency(client, list(functions.values()))
    return Deployment(outputs, functions)


def log_group(client: Callable[[str], Any], function: str) -> str:
    """Where a deployed function logs: the group its LoggingConfig names (the template binds each
    function to a group of its own), else Lambda's default - as ``sam logs`` finds it."""
    config = client("lambda").get_function_configuration(FunctionName=function)
    return str((config.get("LoggingConfig") or {}).get("LogGroup") or f"/aws/lambda/{function}")


def _failures(client: Callable[[str], Any], stack_name: str) -> str:
    """The reasons CloudFormation gave for the resources that failed."""
    try:
        events = client("cloudformation").describe_stack_events(StackName=stack_name)["StackEvents"]
    except Exception as error:  # the stack may not exist at all
        return f"(no stack events: {error})"
    failed = [f"{e['LogicalResourceId']}: {e.get('ResourceStatusReason')}" for e in events
              if str(e.get("ResourceStatus", "")).endswith("_FAILED")]
    return "; ".join(failed) or "(no failed resource reported)"


def _apply_reserved_concurrency(client: Callable[[str], Any], functions: Mapping[str, str],
                                parameters: Mapping[str, str]) -> None:
    """ReservedConcurrentExecutions as the template resolves it with these parameters (moto's
    CloudFormation keeps it: tools.template.resolve)."""
    from tools.template import resolve

    for logical_id, function in resolve(parameters).functions.items():
        if function.reserved_concurrency is not None and logical_id in functions:
            client("lambda").put_function_concurrency(FunctionName=functions[logical_id],
                                                      ReservedConcurrentExecutions=int(function.reserved_concurrency))


def _numeric_maximum_concurrency(client: Callable[[str], Any], functions: list[str]) -> None:
    """Write each SQS mapping's MaximumConcurrency back as a number (see the module docstring)."""
    lam = client("lambda")
    for function in functions:
        for mapping in lam.list_event_source_mappings(FunctionName=function)["EventSourceMappings"]:
            maximum = (mapping.get("ScalingConfig") or {}).get("MaximumConcurrency")
            if maximum is not None:
                lam.update_event_source_mapping(UUID=mapping["UUID"],
                                                ScalingConfig={"MaximumConcurrency": int(maximum)})


# ---------------------------------------------------------------------------------------------
# The stack
# ---------------------------------------------------------------------------------------------

class DeployedStack(Stack):
    """See the module docstring. ``parameters`` are template parameters over the local defaults;
    ``log`` receives progress lines (default: stderr)."""

    name = "template.yaml deployed into ministack"

    def __init__(self, *, time_scale: float = 1.0, parameters: Mapping[str, Any] | None = None,
                 sim_options: Mapping[str, Any] | None = None, stack_name: str = "sume-poller-local",
                 log: Callable[[str], None] | None = None) -> None:
        super().__init__()
        self.time_scale = time_scale
        self.stack_name = stack_name
        self._overrides = dict(parameters or {})
        self._sim_options = dict(sim_options or {})
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))

    def _start(self, stack: ExitStack) -> None:
        from sume_poller.clock import Clock
        from tools.services import RedisServer
        from tools.sume_sim import SumeSimulator
        from tools.template import resolve

        require(SAM, ".venv-sam")
        require(MINISTACK, ".venv-ministack")
        started = time.monotonic()
        self.clock = Clock(self.time_scale)
        self.api_key = "sume_local_" + uuid.uuid4().hex
        self.redis_server = stack.enter_context(RedisServer())
        self.redis_url = self.redis_server.url
        self.sim = stack.enter_context(SumeSimulator(api_key=self.api_key, time_scale=self.time_scale,
                                                     **self._sim_options))
        self.ministack = stack.enter_context(MinistackServer())
        self.endpoint_url = self.ministack.endpoint_url
        self.client = aws_clients(self.endpoint_url)
        self.log(f"ministack on {self.endpoint_url}, redis-server on port {self.redis_server.port}, "
                 f"Sume simulator on {self.sim.base_url}; sam build + sam deploy ...")
        self.parameters = stack_parameters(self.time_scale, self.redis_url, self.sim.base_url, self._overrides)
        deployment = deploy(self.client, self.endpoint_url, self.stack_name, self.parameters, self.api_key)
        self.outputs, self.functions = deployment.outputs, deployment.functions
        scheduled = resolve(self.parameters).schedules  # template order: fan-out before sweeps
        self.schedules = [lid for lid in self.functions if lid in scheduled]
        self.table = JobTable(self.client("dynamodb"), self.outputs["JobsTableName"])
        self.sink = EventSink(self.client("sqs"), self.client("events"), self.parameters.get("EventBusName", "default"))
        groups = [log_group(self.client, function) for function in self.functions.values()]
        self._metrics = LogGroupMetrics(self.client("logs"), groups)
        self.log(f"deployed stack {self.stack_name} in {time.monotonic() - started:.0f} s")

    # -- invoking ---------------------------------------------------------------------------------
    def invoke(self, logical_id: str, event: Any, retry_for: float = 60.0) -> Any:
        """Synchronous invoke of a deployed function; its JSON reply. A throttled invoke (a
        function with reserved concurrency already running) is retried for ``retry_for`` s."""
        lam = self.client("lambda")
        deadline = time.monotonic() + retry_for
        while True:
            try:
                reply = lam.invoke(FunctionName=self.functions[logical_id], InvocationType="RequestResponse",
                                   Payload=json.dumps(event).encode())
                break
            except lam.exceptions.TooManyRequestsException:
                if time.monotonic() > deadline:
                    raise
                self.sink.drain(wait_seconds=1)  # wait, and keep the events flowing
        payload = reply["Payload"].read()
        if reply.get("FunctionError") or int(reply.get("StatusCode", 200)) >= 300:
            raise InvokeError(f"{logical_id} failed ({reply.get('FunctionError')}): {payload[:2000]!r}")
        return json.loads(payload) if payload else None

    def drive(self, until: Callable[[], bool], timeout: float, *, fanout_every: float | None = None) -> None:
        """Wait while the deployed event source mapping and schedule work (the schedule fires
        about once a minute; ``fanout_every`` runs the scheduled functions more often)."""
        next_fanout = time.monotonic() + (fanout_every or 0.0)

        def step(left: float) -> None:
            nonlocal next_fanout
            if fanout_every is not None and time.monotonic() >= next_fanout:
                self.run_schedules()
                next_fanout = time.monotonic() + fanout_every
            self.sink.drain(wait_seconds=1 if left >= 1 else 0)  # the wait: a long poll of the sink

        wait_until(until, timeout, self.pending_summary, step)

    # -- state --------------------------------------------------------------------------------------
    def metric_totals(self) -> Counter[str]:
        return self._metrics.refresh()

    def reset(self) -> None:
        """Redis emptied, simulator reset, poll queues purged until the functions are quiet, the
        table emptied, the event sink and the metric totals restarted. The deployed stack stays."""
        self._reset_services()
        self._quiesce()
        self.table.clear()
        self.sink.drain()
        self.sink.received.clear()
        self._metrics.restart()

    def _quiesce(self) -> None:
        """Purge the poll queues until they stay empty (an invocation in flight may still send)."""
        sqs = self.client("sqs")
        urls = [self.outputs[k] for k in ("PollQueueUrl", "PollDeadLetterQueueUrl", "FailedInvocationsQueueUrl")
                if k in self.outputs]
        quiet = 0

        def step(left: float) -> None:
            nonlocal quiet
            for url in urls:
                sqs.purge_queue(QueueUrl=url)
            self.sink.drain(wait_seconds=1 if left >= 1 else 0)
            quiet = quiet + 1 if self.queue_depth() == 0 else 0

        try:
            wait_until(lambda: quiet >= 2, QUIESCE_S, lambda: f"poll queue depth {self.queue_depth()}", step)
        except TimeoutError as error:
            self.log(f"reset: the poll queue did not stay empty ({error}); going on")


__all__ = ["DeployError", "DeployedStack", "InvokeError", "MinistackServer", "build", "deploy"]

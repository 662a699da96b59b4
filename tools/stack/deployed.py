"""DeployedStack: template.yaml built with ``sam build`` and deployed with ``sam deploy`` into ministack (a pure-Python
local AWS: CloudFormation with the SAM transform, Lambdas as local processes, SQS event source mappings, EventBridge
schedules, CloudWatch Logs). The deployed schedule, event source mapping and functions do the work; this process
starts the services, deploys, submits and reads state. No Docker.

Where ministack differs from AWS, and what is done about it here:

* Its CloudFormation fails the whole stack on a CloudWatch alarm over metric math (``Metrics``): the per-key alarms
  (Metrics Insights queries) are off here (``PerKeyAlarms=false``); every other alarm is one metric.
* Its CloudFormation stores ``ScalingConfig.MaximumConcurrency: !Ref PollMaxConcurrency`` as the string parameters
  arrive as, and its SQS poller then fails on every pass (nothing is ever delivered): after the deploy the same
  value is written back as a number with UpdateEventSourceMapping.
* It ignores ``ReservedConcurrentExecutions``: after the deploy it is applied with PutFunctionConcurrency (ministack
  enforces it once set).
* ``sam deploy`` splits ``--parameter-overrides`` on whitespace: every value is quoted.
* It does not turn EMF lines into CloudWatch metrics: :meth:`metric_totals` reads the functions' log groups
  (:class:`LogGroupMetrics`).
* It accepts SQS ``DelaySeconds`` over 900 (real SQS rejects them): tests of that limit run in-process on moto.
* It does not implement SQS StartMessageMoveTask (``make redrive``; see tools/ops.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Self

from mirakuru.exceptions import ProcessFinishedWithError

from tools.services import Service, free_port
from tools.stack.base import CREDENTIALS, SCRATCH, EmfTotals, Stack, prune_stale, require, wait_until
from tools.template import REGION, ROOT, TEMPLATE, aws_clients

MINISTACK = ROOT / ".venv-ministack" / "bin" / "ministack"
SAM = ROOT / ".venv-sam" / "bin" / "sam"
UV = ROOT / ".venv-uv" / "bin" / "uv"
UV_WRAPPER = ROOT / "scripts" / "uv.sh"  # uv with pip's index configuration
ARTIFACT_BUCKET = "sume-poller-artifacts"
BUILD_TIMEOUT_S = DEPLOY_TIMEOUT_S = 600.0
QUIESCE_S = 20.0
#: Free space on /dev/shm below which ministack's workers unpack on the disk instead (a stack takes ~0.4 GB).
SHM_ROOM = 2 << 30
_TAIL = 4000


class DeployError(RuntimeError):
    """``sam build`` / ``sam deploy`` failed, or the stack did not come up as the template says."""


class InvokeError(RuntimeError):
    """A deployed function returned an error."""


def ministack_tmp() -> Path:
    """Where ministack's TMPDIR goes: each Lambda worker it starts unpacks the function and its layer there
    (27 MB, 1,700 files), written at each cold start and deleted when it stops - on the disk, deleting a
    stack's dozen freshly written workers took 15 to 32 s after the e2e tier's tests (writeback). So a
    memory file system (/dev/shm) with room to spare, else ``.scratch/stack``."""
    shm = Path("/dev/shm")  # noqa: S108 - a directory of this user's own under it, created here
    with contextlib.suppress(OSError):
        if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free >= SHM_ROOM:
            return shm / f"sume-poller-{os.getuid()}" / "ministack"
    return SCRATCH / "ministack"


class MinistackServer(Service):
    """ministack on a free 127.0.0.1 port, TMPDIR under :func:`ministack_tmp`; ready when its health route answers.
    Stopping it stops its Lambda workers too (mirakuru: its process group and every process that inherited its
    environment marker)."""

    name = "ministack"

    def __init__(self, port: int | None = None, ready_timeout: float = 60.0) -> None:
        binary = require(MINISTACK, ".venv-ministack")
        parent = ministack_tmp()
        parent.mkdir(parents=True, exist_ok=True)
        prune_stale(parent)
        port = port or free_port()
        self.tmpdir = parent / f"{os.getpid()}-{port}-{uuid.uuid4().hex[:6]}"
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        # setpriv --pdeathsig: ministack gets SIGTERM if this process dies without stopping it.
        guard = ["setpriv", "--pdeathsig", "TERM"] if shutil.which("setpriv") else []
        # -u: this process may point boto3 at moto (ministack's Lambdas get their own endpoint)
        # and Python at the layer's sources (they must import the built layer).
        super().__init__([*guard, "env", "-u", "AWS_ENDPOINT_URL", "-u", "PYTHONPATH", f"GATEWAY_PORT={port}",
                          "BIND_HOST=127.0.0.1", f"TMPDIR={self.tmpdir}", f"MINISTACK_REGION={REGION}",
                          "LOG_LEVEL=WARNING", "LAMBDA_EXECUTOR=local", *(f"{k}={v}" for k, v in CREDENTIALS.items()),
                          str(binary)], port, ready_timeout)
        self.endpoint_url = f"http://127.0.0.1:{port}"

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


class LogGroupMetrics(EmfTotals):
    """EMF totals from CloudWatch Logs groups since :meth:`restart`: each refresh reads again from a few seconds before
    the newest event seen (delivery is not ordered across streams); an event counts once (by stream, time and
    message: ministack gives no eventId)."""

    def __init__(self, logs: Any, groups: Iterable[str]) -> None:
        super().__init__()
        self.logs, self.groups = logs, list(groups)
        self.restart()

    def restart(self) -> None:
        self.clear()
        self._from = dict.fromkeys(self.groups, int(time.time() * 1000))
        self._seen: set[tuple[str, int, str]] = set()

    def refresh(self) -> None:
        for group, start in list(self._from.items()):
            pages = self.logs.get_paginator("filter_log_events").paginate(
                logGroupName=group, filterPattern='"_aws"', startTime=start)
            with contextlib.suppress(self.logs.exceptions.ResourceNotFoundException):  # nothing logged yet
                for event in (e for page in pages for e in page.get("events", [])):
                    key = (event.get("logStreamName", ""), int(event["timestamp"]), event.get("message", ""))
                    if key not in self._seen:
                        self._seen.add(key)
                        self._from[group] = max(self._from[group], key[1] - 5_000)
                        self.add_line(key[2])


def _sam(args: list[str], endpoint_url: str | None, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_PROFILE", "AWS_ENDPOINT_URL")}
    env.update(SAM_CLI_TELEMETRY="0", **CREDENTIALS, **({"AWS_ENDPOINT_URL": endpoint_url} if endpoint_url else {}))
    if UV.exists():  # the layer's packages installed with uv (layers/sume_poller/Makefile)
        env["SUME_UV"] = str(UV_WRAPPER)
    work = SCRATCH / "sam"  # sam writes build.toml and its deps cache relative to the cwd
    work.mkdir(parents=True, exist_ok=True)
    return subprocess.run([str(require(SAM, ".venv-sam")), *args], cwd=work, env=env, capture_output=True,
                          text=True, timeout=timeout)


_built: dict[str, Path] = {}
_built_lock = threading.Lock()


def _sources_digest() -> str:
    """A digest of what ``sam build`` reads: the template, the functions and the layer (their caches left out)."""
    digest = hashlib.sha256(TEMPLATE.read_bytes())
    for top in (ROOT / "functions", ROOT / "layers"):
        for path in sorted(top.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def build() -> Path:
    """``sam build`` of template.yaml, once per version of its sources: into a build directory of its own (a
    concurrent ``make build`` cannot change it under a deploy), renamed to ``src-<digest>`` once it is whole and
    never written again, so the processes of a run (the e2e tier's two workers, the demo) deploy one build, not
    one each after another (each waited for the others' builds under load). One build at a time, from a cache
    shared by the runs of this checkout. Returns the built template's path."""
    with _built_lock:
        if "template" in _built and _built["template"].exists():
            return _built["template"]
        builds = SCRATCH / "builds"
        builds.mkdir(parents=True, exist_ok=True)
        with open(SCRATCH / "sam-build.lock", "w") as lock:  # the demo and a test run at once
            fcntl.flock(lock, fcntl.LOCK_EX)
            prune_stale(builds)
            shared = builds / f"src-{_sources_digest()}"
            if not (shared / "template.yaml").exists():
                work = builds / f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
                done = _sam(["build", "--template-file", str(TEMPLATE), "--build-dir", str(work),
                             "--cache-dir", str(SCRATCH / "sam" / "cache"), "--cached"], None, BUILD_TIMEOUT_S)
                if done.returncode != 0:
                    shutil.rmtree(work, ignore_errors=True)
                    raise DeployError(f"sam build failed ({done.returncode}):\n{(done.stdout + done.stderr)[-_TAIL:]}")
                for old in builds.glob("src-*"):  # builds of earlier versions, made over an hour ago
                    if time.time() - old.stat().st_mtime > 3_600:
                        shutil.rmtree(old, ignore_errors=True)
                shutil.rmtree(shared, ignore_errors=True)  # a partial one left by a crash: no template.yaml
                work.rename(shared)
        _built["template"] = shared / "template.yaml"
        return _built["template"]


def deploy(client: Callable[[str], Any], endpoint_url: str, stack_name: str,
           parameters: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``sam deploy`` the built template, apply what ministack leaves out; the stack's outputs and its functions
    (logical id -> name)."""
    from tools.template import resolve

    if quoted := [key for key, value in parameters.items() if '"' in value]:  # each goes in as Key="Value"
        raise ValueError(f"parameters {quoted} contain a double quote")
    template, s3, cfn, lam = build(), client("s3"), client("cloudformation"), client("lambda")
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
        s3.create_bucket(Bucket=ARTIFACT_BUCKET)
    done = _sam(["deploy", "--template-file", str(template), "--stack-name", stack_name, "--s3-bucket",
                 ARTIFACT_BUCKET, "--region", REGION, "--capabilities", "CAPABILITY_IAM",
                 "--no-confirm-changeset", "--no-fail-on-empty-changeset", "--no-progressbar", "--parameter-overrides",
                 *(f'{k}="{v}"' for k, v in parameters.items())], endpoint_url, DEPLOY_TIMEOUT_S)
    if done.returncode != 0:
        failed = "(no stack events)"
        with contextlib.suppress(Exception):  # the stack may not exist at all
            failed = "; ".join(f"{e['LogicalResourceId']}: {e.get('ResourceStatusReason')}" for e in
                               cfn.describe_stack_events(StackName=stack_name)["StackEvents"]
                               if str(e.get("ResourceStatus", "")).endswith("_FAILED")) or "(none failed)"
        raise DeployError(f"sam deploy failed ({done.returncode}): {failed}\n{(done.stdout + done.stderr)[-_TAIL:]}")
    described = cfn.describe_stacks(StackName=stack_name)["Stacks"][0]
    if not (status := described.get("StackStatus", "")).endswith("_COMPLETE") or "ROLLBACK" in status:
        raise DeployError(f"stack {stack_name} is {status}")
    outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
    if missing := {"JobsTableName", "PollQueueUrl", "PollDeadLetterQueueUrl"} - set(outputs):
        raise DeployError(f"stack {stack_name} lacks outputs {sorted(missing)}: {outputs}")
    functions = {r["LogicalResourceId"]: r["PhysicalResourceId"] for r in
                 cfn.describe_stack_resources(StackName=stack_name)["StackResources"]
                 if r["ResourceType"] == "AWS::Lambda::Function"}
    for logical_id, function in resolve(parameters).functions.items():  # as moto's CloudFormation keeps it
        if function.reserved_concurrency is not None and logical_id in functions:
            lam.put_function_concurrency(FunctionName=functions[logical_id],
                                         ReservedConcurrentExecutions=int(function.reserved_concurrency))
    for name in functions.values():  # each SQS mapping's MaximumConcurrency as a number (the docstring)
        for mapping in lam.list_event_source_mappings(FunctionName=name)["EventSourceMappings"]:
            if (maximum := (mapping.get("ScalingConfig") or {}).get("MaximumConcurrency")) is not None:
                lam.update_event_source_mapping(UUID=mapping["UUID"],
                                                ScalingConfig={"MaximumConcurrency": int(maximum)})
    return outputs, functions


class DeployedStack(Stack):
    """See the module docstring. ``parameters`` are template parameters over the local defaults; ``log`` receives
    progress lines (default: stderr)."""

    name = "template.yaml deployed into ministack"

    def __init__(self, *, time_scale: float = 1.0, parameters: Mapping[str, Any] | None = None,
                 sim_options: Mapping[str, Any] | None = None, stack_name: str = "sume-poller-local",
                 log: Callable[[str], None] | None = None, keys: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        super().__init__(time_scale, {"PerKeyAlarms": "false", **(parameters or {})}, sim_options, keys)
        self.stack_name = stack_name
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))

    def _start(self, stack: ExitStack) -> None:
        from tools.template import resolve

        require(SAM, ".venv-sam")
        require(MINISTACK, ".venv-ministack")
        started = time.monotonic()
        self._start_services(stack)
        self.ministack = stack.enter_context(MinistackServer())
        self.endpoint_url = self.ministack.endpoint_url
        self.client = client = aws_clients(self.endpoint_url)
        self.store_keys()  # where the template reads them
        self.log(f"ministack on {self.endpoint_url}, redis-server on port {self.redis_server.port}, "
                 f"Sume simulator on {self.sim.base_url}; sam build + sam deploy ...")
        outputs, self.functions = deploy(client, self.endpoint_url, self.stack_name, self.parameters)
        self._connect(client, outputs)
        scheduled = resolve(self.parameters).schedules
        self.schedules = [lid for lid in self.functions if lid in scheduled]  # template order: fan-out first
        # Each function logs to the group its LoggingConfig names (as `sam logs` finds it).
        configs = [self.client("lambda").get_function_configuration(FunctionName=f) for f in self.functions.values()]
        self._emf = LogGroupMetrics(self.client("logs"), [
            (c.get("LoggingConfig") or {}).get("LogGroup") or f"/aws/lambda/{c['FunctionName']}" for c in configs])
        self.log(f"deployed stack {self.stack_name} in {time.monotonic() - started:.0f} s")

    def invoke(self, logical_id: str, event: Any, retry_for: float = 60.0) -> Any:
        """Synchronous invoke of a deployed function; its JSON reply. A throttled invoke (a function with reserved
        concurrency already running) is retried for ``retry_for`` s."""
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
        """Wait while the deployed event source mapping and schedule work (the schedule fires about once a minute;
        ``fanout_every`` runs the scheduled functions more often)."""
        next_fanout = time.monotonic() + (fanout_every or 0.0)

        def step(left: float) -> None:
            nonlocal next_fanout
            if fanout_every is not None and time.monotonic() >= next_fanout:
                self.run_schedules()
                next_fanout = time.monotonic() + fanout_every
            self.sink.drain(wait_seconds=1 if left >= 1 else 0)  # the wait: a long poll of the sink

        wait_until(until, timeout, self.pending_summary, step)

    def reset(self) -> None:
        """Redis emptied, simulator reset, the poll queues purged until the functions are quiet (an invocation in
        flight may still send), the table emptied, the event sink and the metric totals restarted, the keys stored
        as at the start. The deployed stack stays."""
        self._reset_services()
        self.store_keys()
        sqs = self.client("sqs")
        urls = [self.outputs[k] for k in ("PollQueueUrl", "PollDeadLetterQueueUrl", "CreateQueueUrl",
                                          "CreateDeadLetterQueueUrl", "FailedInvocationsQueueUrl") if k in self.outputs]
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
        self.table.clear()
        self.sink.drain()
        self.sink.received.clear()
        self._emf.restart()


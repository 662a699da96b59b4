"""InProcessStack: the template's handlers run in this process, on moto server, against a real redis-server and the
Sume simulator. No deploy step; seconds to start.

Starting it creates the template in moto (tools.template), stores the Sume keys where the template reads them, sets
this process's environment to the functions' (as moto's Lambda reports them) and loads each handler. It then plays
what moto does not run: the poll function's SQS event source mapping (:meth:`pump`, :meth:`deliver`: receive up to
the mapping's BatchSize, invoke, delete what succeeded; DelaySeconds and the redrive policy are moto's own), the
submit function's on the create queue (:meth:`pump_creates`: the drains of queued submissions) and the schedules
(:meth:`drive`).

Test hooks: ``receive()`` and ``deliver(messages, duplicate=True)`` (each message twice in one batch) play the event
source by hand; ``make_visible(messages)`` ends their visibility timeout; ``step_hook`` is set on the poll runner's
poller before every batch (it may raise any BaseException: the invocation crashes and, as in Lambda, the whole batch
stays undeleted); ``last_report`` and ``outcomes`` come from the batch runner's BatchReport. Handler logs go to
``log_path``, with what a handler prints on stdout - Powertools' EMF lines, which :meth:`metric_totals` adds up.
"""

from __future__ import annotations

import heapq
import io
import math
import os
import re
import runpy
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from tools.stack.base import CREDENTIALS, SCRATCH, EmfTotals, Stack, prune_stale, queue_depth, wait_until
from tools.template import REGION, TEMPLATE, aws_clients

if TYPE_CHECKING:
    from tools.services import MotoServer

#: Suffix of the copy of a message that ``duplicate=True`` delivers in the same batch.
DUPLICATE_SUFFIX = "-dup"
#: How long :meth:`InProcessStack.drive` waits when the queue has nothing visible: this little while
#: a message is due (a re-queue's delay, seen in the handler's report), at most MAX_IDLE_S otherwise
#: (a visibility timeout ran out unseen). Polling every 50 ms all the time made an idle stack burn
#: 0.4 of a core: on 2 cores four test workers spent most of theirs waiting.
IDLE_POLL_S, MAX_IDLE_S = 0.05, 0.5
#: A message expected visible but not received this long after: no longer expected.
DUE_GRACE_S = 0.3


def _rate_seconds(expression: str) -> float:
    """Real seconds between runs of ``rate(N unit)`` (other expressions: a minute)."""
    match = re.fullmatch(r"rate\((\d+) (minute|hour|day)s?\)", expression.strip())
    return float(int(match.group(1)) * {"minute": 60, "hour": 3600, "day": 86400}[match.group(2)]) if match else 60.0


def _environment_changed() -> None:
    """What a fresh Lambda container reads from the environment, read again: the layer's cached parts (settings,
    secrets: another stack in this process may have had other ones) and Powertools Metrics' namespace and service
    (the layer may have been imported before they were set)."""
    from sume_poller import runtime
    from sume_poller.core.observability import metrics

    runtime.reset()
    metrics.namespace = os.environ.get("POWERTOOLS_METRICS_NAMESPACE")
    metrics.service = os.environ.get("POWERTOOLS_SERVICE_NAME")


class _ThreadOutput(io.TextIOBase):
    """``sys.stdout`` while a handler runs: what the invoking thread writes is kept (for the EMF lines), what other
    threads write (a live display, a test runner) passes through."""

    def __init__(self, passthrough: Any) -> None:
        self.passthrough = passthrough
        self._thread = threading.get_ident()
        self._kept: list[str] = []

    def write(self, text: str) -> int:
        if threading.get_ident() == self._thread:
            self._kept.append(text)
            return len(text)
        return int(self.passthrough.write(text))

    def flush(self) -> None:
        self.passthrough.flush()


@dataclass
class Delivery:
    """One invocation of the poll function: what went in and what came out."""

    messages: list[dict[str, Any]]
    report: Any  # sume_poller.poll.batch.BatchReport, None when the invocation crashed
    failed: set[str]  # message ids left for SQS to deliver again
    crash: BaseException | None = None


class InProcessStack(Stack):
    """``parameters``: template parameters over the local defaults; ``env``: function variables set directly, for
    values the template's limits refuse (``CLAIM_TTL_SECONDS`` below 31...); ``fast_retry``: failed records and
    crashed batches are visible again at once, not after the visibility timeout; ``moto``: a running MotoServer
    instead of a new one (a test process keeps one: a start costs seconds of imports), reset when the stack starts
    and closes."""

    name = "handlers in-process on moto server"

    def __init__(self, *, time_scale: float = 1.0, parameters: Mapping[str, Any] | None = None,
                 env: Mapping[str, str] | None = None, sim_options: Mapping[str, Any] | None = None,
                 fast_retry: bool = True, log_path: Path | None = None, moto: MotoServer | None = None,
                 keys: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        super().__init__(time_scale, parameters, sim_options, keys)
        self._given_moto, self._env, self.fast_retry = moto, dict(env or {}), fast_retry
        self.log_path = log_path or SCRATCH / "logs" / f"{os.getpid()}-handlers.log"
        self.step_hook: Callable[[str, str], None] | None = None
        self._due: list[float] = []  # heap: monotonic times a message is expected to become visible
        self._due_lock = threading.Lock()
        self._invocations = 0  # handler invocations so far: records change only through them
        #: The create queue was seen empty (nothing visible, delayed or in flight) and no function that sends to it
        #: ran since: :meth:`pump_creates` does not ask it. (Asking every step was a fifth of the tier's AWS calls,
        #: empty receives on moto, in tests that queue no submission.)
        self._creates_empty = False
        self._tallies()

    def _tallies(self) -> None:
        """What a run counts, from nothing (at the start and on every reset)."""
        self._emf, self.outcomes, self.crashes = EmfTotals(), Counter[str](), 0
        self.last_report: Any = None
        self.last_crash: BaseException | None = None
        self._settled: tuple[int, tuple[str, ...]] | None = None  # not settled as of that count

    def _start(self, stack: ExitStack) -> None:
        """Create the template's stack in moto, set this process's environment to the functions' (restored on exit),
        load their handlers."""
        from sume_poller.core.observability import logger
        from tools.services import MotoServer
        from tools.template import create_stack, load, translate

        self._start_services(stack)
        self.moto = self._given_moto or stack.enter_context(MotoServer())
        if self._given_moto is not None:
            self.moto.reset()
            stack.callback(self.moto.reset)
        client = aws_clients(self.moto.endpoint_url)
        self.translated = translate(load(TEMPLATE), self.parameters, REGION)
        self.created = create_stack(client, self.translated, self.parameters)
        self.specs = self.created.functions
        self.schedules = sorted(self.created.schedules, key=list(self.specs).index)  # template order: fan-out first
        self.schedule_period = min((_rate_seconds(e) for e in self.created.schedules.values()), default=60.0)
        self._next_schedule = time.monotonic() + self.schedule_period
        mapping = self.created.mappings["PollFunction"]
        self.batch_size, self.queue_arn = int(mapping["BatchSize"]), str(mapping["EventSourceArn"])
        creates = self.created.mappings.get("SubmitFunction")  # the create queue's drains
        self.create_batch_size = int(creates["BatchSize"]) if creates else 0
        self.create_queue_arn = str(creates["EventSourceArn"]) if creates else ""
        if (bus := self.parameters.get("EventBusName", "default")) != "default":
            client("events").create_event_bus(Name=bus)
        self._connect(client, self.created.outputs)
        self.store_keys()
        # Handler logs (Powertools Logger) to log_path.
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        prune_stale(SCRATCH / "logs")
        self._log: IO[str] = stack.enter_context(open(self.log_path, "a", encoding="utf-8"))  # noqa: SIM115
        for handler in (h for h in logger.handlers if hasattr(h, "setStream")):
            stack.callback(handler.setStream, handler.setStream(self._log))
        # One process runs every function: the union of their variables (they must agree).
        env: dict[str, str] = {}
        for key, value in ((k, v) for spec in self.specs.values() for k, v in spec.environment.items()):
            if env.setdefault(key, value) != value:
                raise ValueError(f"functions disagree on {key}: {env[key]!r} vs {value!r}")
        stack.callback(self._restore_environment, dict(os.environ))
        os.environ.update({**env, **CREDENTIALS, "AWS_ENDPOINT_URL": self.moto.endpoint_url,
                           "POWERTOOLS_METRICS_DISABLED": "false", **self._env})
        for layer in dict.fromkeys(str(layer) for spec in self.specs.values() for layer in spec.layer_dirs):
            if layer not in sys.path:
                sys.path.insert(0, layer)  # what /opt/python is in Lambda
        _environment_changed()
        self.handlers = {}  # each function's handler, its module run from the function's code dir
        for lid, spec in self.specs.items():
            module, name = spec.handler.rsplit(".", 1)
            path = spec.code_dir / f"{module.replace('.', '/')}.py"
            self.handlers[lid] = runpy.run_path(str(path), run_name=f"_stack_handler_{lid}")[name]

    @staticmethod
    def _restore_environment(saved: dict[str, str]) -> None:
        os.environ.clear()
        os.environ.update(saved)
        _environment_changed()

    def invoke(self, logical_id: str, event: Any) -> Any:
        """Call a function's handler with ``event`` and a fresh Lambda context."""
        from tools.local_invoke import make_context

        self._invocations += 1
        if logical_id != "PollFunction":
            self.expect_visible(0.0)  # submit, fan-out, sweeps and webhooks send poll messages
            self._creates_empty = False  # submit, the jobs API and fan-out (a drain's restart) send drain steps
        output = _ThreadOutput(sys.stdout)
        sys.stdout = output
        try:
            return self.handlers[logical_id](event, make_context(self.specs[logical_id]))
        finally:
            sys.stdout = output.passthrough
            for line in filter(str.strip, "".join(output._kept).splitlines()):  # Powertools prints EMF there
                self._emf.add_line(line)
                self._log.write(line + "\n")

    def receive(self, max_messages: int | None = None, wait_seconds: int = 0) -> list[dict[str, Any]]:
        """Receive up to ``max_messages`` (default: the mapping's BatchSize) from the poll queue."""
        reply = self.client("sqs").receive_message(
            QueueUrl=self.queue_url, MaxNumberOfMessages=max_messages or self.batch_size,
            WaitTimeSeconds=wait_seconds, AttributeNames=["All"], MessageAttributeNames=["All"])
        return list(reply.get("Messages", []))

    def _poll_runner(self) -> Any:
        """The handler's batch runner, with the stack's step hook and a report tap."""
        from sume_poller import runtime

        runner = runtime.poll_runner()
        if not getattr(runner, "_stack_tap", False):
            run = runner.run

            def tapped(event: dict[str, Any], remaining_ms: Callable[[], int]) -> Any:
                self.last_report = run(event, remaining_ms)
                return self.last_report

            setattr(runner, "run", tapped)  # noqa: B010 - an instance attribute over the method
            setattr(runner, "_stack_tap", True)  # noqa: B010
        runner.step_hook = self.step_hook
        return runner

    def _invoke_batch(self, function: str, url: str, messages: list[dict[str, Any]],
                      duplicate: bool = False) -> tuple[set[str], BaseException | None]:
        """Lambda's SQS event source: invoke ``function`` with ``messages`` (as received; ``duplicate``: each twice in
        the batch), delete the successes; (the ids that failed, the crash). A handler that raises (any BaseException
        but KeyboardInterrupt) crashed: nothing is deleted. ``fast_retry``: failures visible again."""
        arn = self.queue_arn if url == self.queue_url else self.create_queue_arn
        records = [{"messageId": m["MessageId"], "receiptHandle": m["ReceiptHandle"], "body": m["Body"],
                    "attributes": dict(m.get("Attributes", {})), "md5OfBody": m.get("MD5OfBody", ""),
                    "messageAttributes": dict(m.get("MessageAttributes", {})), "eventSource": "aws:sqs",
                    "eventSourceARN": arn, "awsRegion": REGION} for m in messages]
        records += [{**r, "messageId": r["messageId"] + DUPLICATE_SUFFIX} for r in records if duplicate]
        crash = None
        try:
            reply = self.invoke(function, {"Records": records})
            failed = {f["itemIdentifier"].removesuffix(DUPLICATE_SUFFIX) for f in reply.get("batchItemFailures", [])}
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # Lambda reports anything that escapes as a crash
            self.crashes, self.last_crash, crash = self.crashes + 1, error, error
            failed = {m["MessageId"] for m in messages}
        done = [m for m in messages if m["MessageId"] not in failed]
        for start in range(0, len(done), 10):
            self.client("sqs").delete_message_batch(QueueUrl=url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(done[start:start + 10])])
        if failed and self.fast_retry:
            self.make_visible([m for m in messages if m["MessageId"] in failed], url)
            self.expect_visible(0.0)
        return failed, crash

    def deliver(self, messages: list[dict[str, Any]], *, duplicate: bool = False) -> Delivery:
        """The poll queue's event source, once: :meth:`_invoke_batch` of the poll function."""
        self._poll_runner()
        self.last_report = None
        failed, crash = self._invoke_batch("PollFunction", self.queue_url, messages, duplicate)
        if crash is None and self.last_report is not None:
            self.outcomes.update(self.last_report.counts())
            queue = self._poll_runner().queue
            for send in (o.send for o in self.last_report.outcomes if o.send is not None):
                self.expect_visible(queue.real_delay(send.delay))
        return Delivery(messages, None if crash else self.last_report, failed, crash)

    def pump_creates(self) -> bool:
        """One event-source cycle of the create queue: receive up to its mapping's BatchSize, invoke the submit
        function with them, delete what succeeded. False when nothing was received."""
        if not self.create_batch_size or self._creates_empty:
            return False
        url, sqs = self.outputs["CreateQueueUrl"], self.client("sqs")
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=self.create_batch_size,
                                       AttributeNames=["All"]).get("Messages", [])
        if messages:
            self._invoke_batch("SubmitFunction", url, messages)
            self.expect_visible(1.0)  # a drain's wait: whole real seconds of SQS DelaySeconds
        else:
            self._creates_empty = queue_depth(sqs, url) == 0
        return bool(messages)

    def send(self, body: str, delay_seconds: int = 0) -> None:
        super().send(body, delay_seconds)
        self.expect_visible(delay_seconds)

    def expect_visible(self, real_seconds: float) -> None:
        """A message will become visible on the poll queue in ``real_seconds``: :meth:`drive` then receives at that
        time instead of waiting its idle maximum."""
        with self._due_lock:
            heapq.heappush(self._due, time.monotonic() + real_seconds)

    def idle_wait(self) -> float:
        """Real seconds to wait after an empty receive: until the next message is expected to be visible (at least
        ``IDLE_POLL_S``), at most ``MAX_IDLE_S``."""
        now = time.monotonic()
        with self._due_lock:
            while self._due and self._due[0] < now - DUE_GRACE_S:
                heapq.heappop(self._due)
            nearest = self._due[0] if self._due else math.inf
        return min(MAX_IDLE_S, max(IDLE_POLL_S, nearest - now))

    def make_visible(self, messages: list[dict[str, Any]], url: str | None = None) -> None:
        """What SQS does once a message's visibility timeout runs out: it may be received again."""
        for start in range(0, len(messages), 10):
            self.client("sqs").change_message_visibility_batch(QueueUrl=url or self.queue_url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
                for i, m in enumerate(messages[start:start + 10])])

    def drive(self, until: Callable[[], bool], timeout: float, *, fanout_every: float | None = None,
              duplicate: bool = False) -> None:
        """Play the event source mapping and the schedules (at the template's rate, or every ``fanout_every`` s) until
        ``until()``; ``duplicate`` delivers every message twice."""
        period = fanout_every or self.schedule_period
        self._next_schedule = min(self._next_schedule, time.monotonic() + period)

        def step(left: float) -> None:
            if time.monotonic() >= self._next_schedule:
                self.run_schedules()
                self._next_schedule = time.monotonic() + period
            drained = self.pump_creates()
            if messages := self.receive():  # one event-source cycle
                self.deliver(messages, duplicate=duplicate)
            elif not drained:
                time.sleep(max(0.0, min(self.idle_wait(), left, self._next_schedule - time.monotonic())))

        def describe() -> str:
            crash = f"; {self.crashes} crashed invocations, the last: {self.last_crash!r}" if self.crashes else ""
            return self.pending_summary() + crash

        wait_until(until, timeout, describe, step)

    def settled(self, job_ids: Iterable[str]) -> bool:
        """As :meth:`Stack.settled`, but the table is read again only after a handler ran: an idle :meth:`drive` asks
        often, and a BatchGetItem of every id is moto's costliest call."""
        ids = tuple(job_ids)
        if self._settled == (self._invocations, ids):
            return False
        done = super().settled(ids)
        self._settled = None if done else (self._invocations, ids)
        return done

    def reset(self) -> None:
        """A clean slate that keeps the stack (a CreateStack costs moto a tenth of a second, and tests reset hundreds
        of times): its queues (the event sink's too), table and buckets emptied, SSM parameters and secrets it did
        not create deleted, its Sume key stored again, the functions' cached settings and clients dropped (a fresh
        container)."""
        self._reset_services()
        sqs, s3, ssm, secrets = (self.client(s) for s in ("sqs", "s3", "ssm", "secretsmanager"))
        for url in [*self.created.of_type("AWS::SQS::Queue").values(), self.sink.url]:
            sqs.purge_queue(QueueUrl=url)
        self.sink.received.clear()
        self.table.clear()
        for bucket in self.created.of_type("AWS::S3::Bucket").values():
            for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
                if versions := [{"Key": v["Key"], "VersionId": v["VersionId"]}
                                for v in page.get("Versions", []) + page.get("DeleteMarkers", [])]:
                    s3.delete_objects(Bucket=bucket, Delete={"Objects": versions, "Quiet": True})
            for upload in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
                s3.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
        ours = {*self.created.resources.values(), self.parameters["SumeApiKeyName"]}
        names = [p["Name"] for page in ssm.get_paginator("describe_parameters").paginate()
                 for p in page["Parameters"] if p["Name"] not in ours]
        for start in range(0, len(names), 10):
            ssm.delete_parameters(Names=names[start:start + 10])
        for secret in secrets.list_secrets().get("SecretList", []):
            secrets.delete_secret(SecretId=secret["ARN"], ForceDeleteWithoutRecovery=True)
        self.store_keys()
        self._next_schedule = time.monotonic() + self.schedule_period
        _environment_changed()
        self._tallies()

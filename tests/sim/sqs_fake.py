"""SQS in process: standard queues with delays, visibility timeouts, a redrive policy, at-least-once delivery.

The layer only sends (``send_message_batch``, through :class:`sume_poller.store.queue.PollQueue`); Lambda's
event source mapping receives and deletes (:mod:`.world` plays it). Kept from SQS (and held to moto
server by ``tests/integration/test_sim_fakes.py``): ``DelaySeconds`` 0-900 (an entry outside is
failed, the rest of the batch sent), at most 10 entries with distinct ids, a received message
invisible for the visibility timeout and visible again after it unless deleted, a message received
more than ``maxReceiveCount`` times moved to the dead-letter queue instead, a delete by any of a
message's receipt handles. What the scheduler may add: a send throttled (the whole call fails), one
entry failed, and a duplicate delivery (a message still in flight handed out again, as a standard
queue may).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

MAX_DELAY = 900
MAX_BODY = 256 * 1024


@dataclass
class Message:
    id: str
    body: str
    sent_at: float
    visible_at: float
    receive_count: int = 0
    receipt: str = ""
    #: Kills of invocations that held it (the fault budget per message).
    crashes: int = 0


@dataclass
class Queue:
    name: str
    url: str
    visibility: float
    max_receive: int | None = None
    dlq: Queue | None = None
    messages: dict[str, Message] = field(default_factory=dict)
    #: Every message moved here (a dead-letter queue), with why.
    dead: list[Message] = field(default_factory=list)

    def visible(self, now: float) -> list[Message]:
        return [m for m in self.messages.values() if m.visible_at <= now]

    def next_visible(self, now: float) -> float | None:
        later = [m.visible_at for m in self.messages.values() if m.visible_at > now]
        return min(later) if later else None


class SqsWorld:
    def __init__(self, sched: Any, faults: Any) -> None:
        self.sched = sched
        self.faults = faults
        self.queues: dict[str, Queue] = {}
        self._ids = 0
        #: Told of every message sent: (queue name, body).
        self.observers: list[Any] = []
        self.client = SqsClient(self)

    def queue(self, name: str, visibility: float, *, dlq: Queue | None = None, max_receive: int | None = None) -> Queue:
        q = Queue(name, f"https://sqs.sim/000000000000/{name}", visibility, max_receive, dlq)
        self.queues[q.url] = q
        return q

    def new_id(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}-{self._ids:06d}"

    def put(self, queue: Queue, body: str, delay: float) -> Message:
        message = Message(self.new_id("m"), body, self.sched.now, self.sched.now + delay)
        queue.messages[message.id] = message
        for observer in self.observers:
            observer(queue.name, body)
        return message

    def receive(self, queue: Queue, count: int) -> list[tuple[Message, str]]:
        """What Lambda's poller receives: up to ``count`` visible messages (in an order SQS does not
        promise: the scheduler's), each with a new receipt handle; a message received more often than
        the redrive policy allows goes to the dead-letter queue instead."""
        now = self.sched.now
        visible = queue.visible(now)
        out: list[tuple[Message, str]] = []
        while visible and len(out) < count:
            message = visible.pop(self.sched.choose(len(visible)))
            if queue.max_receive is not None and message.receive_count >= queue.max_receive:
                del queue.messages[message.id]
                if queue.dlq is not None:
                    queue.dlq.messages[message.id] = message
                    queue.dlq.dead.append(message)
                continue
            out.append((message, self._deliver(queue, message)))
        in_flight = [m for m in queue.messages.values() if m.visible_at > now and m.receipt and
                     m.id not in {o[0].id for o in out}]
        if in_flight and len(out) < count and self.faults.take("sqs_duplicate"):
            message = in_flight[self.sched.choose(len(in_flight))]
            self.sched.note_fault(f"sqs duplicate delivery of {message.id}")
            out.append((message, self._deliver(queue, message, keep_visibility=True)))
        return out

    def _deliver(self, queue: Queue, message: Message, keep_visibility: bool = False) -> str:
        message.receive_count += 1
        if not keep_visibility:
            message.visible_at = self.sched.now + queue.visibility
        message.receipt = f"{message.id}#{message.receive_count}"
        return message.receipt

    def delete(self, queue: Queue, receipt: str) -> None:
        """Delete the message a receipt handle names (an older handle of it too, as moto does; SQS says it
        then "might not be deleted")."""
        queue.messages.pop(receipt.partition("#")[0], None)


class SqsClient:
    """The client calls the layer makes."""

    def __init__(self, world: SqsWorld) -> None:
        self.world = world

    def send_message_batch(self, *, QueueUrl: str, Entries: list[dict[str, Any]], **_: Any) -> dict[str, Any]:
        world = self.world
        world.sched.point(f"sqs send {len(Entries)}")
        queue = world.queues.get(QueueUrl)
        if queue is None:
            raise ClientError({"Error": {"Code": "AWS.SimpleQueueService.NonExistentQueue",
                                         "Message": "The specified queue does not exist."}}, "SendMessageBatch")
        if not 1 <= len(Entries) <= 10:
            raise ClientError({"Error": {"Code": "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
                                         "Message": "Maximum number of entries per request are 10."}},
                              "SendMessageBatch")
        if len({e["Id"] for e in Entries}) != len(Entries):
            raise ClientError({"Error": {"Code": "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
                                         "Message": "Two or more batch entries have the same Id."}},
                              "SendMessageBatch")
        if world.faults.take("sqs_throttle"):
            world.sched.note_fault("sqs send throttled")
            raise ClientError({"Error": {"Code": "RequestThrottled", "Message": "simulated"}}, "SendMessageBatch")
        successful, failed = [], []
        for entry in Entries:
            delay = int(entry.get("DelaySeconds", 0))
            if not 0 <= delay <= MAX_DELAY or len(entry["MessageBody"].encode()) > MAX_BODY:
                failed.append({"Id": entry["Id"], "SenderFault": True, "Code": "InvalidParameterValue",
                               "Message": "Value for parameter DelaySeconds is invalid."})
                continue
            if world.faults.take("sqs_entry_failed"):
                world.sched.note_fault("sqs entry failed")
                failed.append({"Id": entry["Id"], "SenderFault": False, "Code": "InternalError",
                               "Message": "simulated"})
                continue
            message = world.put(queue, entry["MessageBody"], delay)
            successful.append({"Id": entry["Id"], "MessageId": message.id, "MD5OfMessageBody": ""})
        reply: dict[str, Any] = {"Successful": successful}
        if failed:
            reply["Failed"] = failed
        return reply

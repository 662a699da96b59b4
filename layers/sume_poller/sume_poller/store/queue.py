"""The poll queue: SQS messages between the polls of one job, sent in batches.

Delays are clock seconds (see :mod:`sume_poller.core.clock`); SQS takes whole real seconds up to
900, so a longer wait is covered by hops (the poller re-queues a message that comes back early).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ..core.aws import client
from ..core.clock import Clock
from ..core.values import value

#: SQS rejects DelaySeconds above this.
SQS_MAX_DELAY_REAL = 900
SQS_BATCH = 10


@value
class Outgoing:
    """One message to send: ``key`` identifies it in the reply (unique within one call)."""

    key: str
    body: str
    delay: float  # clock seconds


class PollQueue:
    def __init__(self, url: str, clock: Clock, sqs: Any = None, max_delay_real: int = SQS_MAX_DELAY_REAL) -> None:
        self.url = url
        self.clock = clock
        self.max_delay_real = max_delay_real
        self._sqs = sqs or client("sqs")

    @property
    def max_delay(self) -> float:
        """The longest wait (clock seconds) one message can cover."""
        return self.clock.from_real(self.max_delay_real)

    def real_delay(self, delay: float) -> int:
        """SQS ``DelaySeconds`` for a clock delay: whole real seconds, rounded up, at most 900."""
        return max(0, min(self.max_delay_real, math.ceil(self.clock.to_real(max(0.0, delay)) - 1e-9)))

    def send(self, messages: Iterable[Outgoing]) -> set[str]:
        """Send every message in ``SendMessageBatch`` calls of up to 10 (entries SQS refuses are
        tried once more); return the keys of the messages not sent."""
        pending = list(messages)
        failed: set[str] = set()
        for start in range(0, len(pending), SQS_BATCH):
            chunk = pending[start:start + SQS_BATCH]
            refused = self._send_batch(chunk)
            if refused:
                refused = self._send_batch([m for m in chunk if m.key in refused])
            failed |= refused
        return failed

    def _send_batch(self, chunk: list[Outgoing]) -> set[str]:
        ids = {str(i): m for i, m in enumerate(chunk)}
        try:
            reply = self._sqs.send_message_batch(QueueUrl=self.url, Entries=[
                {"Id": i, "MessageBody": m.body, "DelaySeconds": self.real_delay(m.delay)} for i, m in ids.items()])
        except Exception:  # the whole call failed (throttle, network): every entry is unsent
            return {m.key for m in chunk}
        return {ids[f["Id"]].key for f in reply.get("Failed", []) if f.get("Id") in ids}

"""The webhook delivery worker: POSTs the model's due webhook events in a background thread.

The model plans every delivery when a job is created (due time from the job's timeline, fates
from the seeded RNG); this worker only watches the clock, takes what is due, and sends it with
urllib: a short timeout, no retries, duplicates sent twice. What each receiver answered goes back
to the model's webhook stats.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request

from tools.sume_sim.model import Delivery, Model

SEND_TIMEOUT = 2.0  # real seconds per POST
MAX_IDLE = 0.02  # real seconds between looks at the plans


def post(url: str, body: bytes, headers: dict[str, str], timeout: float = SEND_TIMEOUT) -> int | str:
    """POST once; the HTTP status, or the error's class name when no status came back."""
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError) as exc:
        return type(exc).__name__


class WebhookWorker:
    """Delivers due webhooks until :meth:`stop`."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> WebhookWorker:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="sume-sim-webhooks", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=SEND_TIMEOUT * 3)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self._idle()):
            for delivery in self.model.take_due_webhooks():
                if self._stop.is_set():
                    return
                self._send(delivery)

    def _idle(self) -> float:
        """Real seconds to wait before the next look: until the next due delivery, capped."""
        due = self.model.next_webhook_due()
        if due is None:
            return MAX_IDLE
        clock = self.model.clock
        return min(MAX_IDLE, max(0.0, (due - clock.now()) * clock.scale))

    def _send(self, delivery: Delivery) -> None:
        plan = delivery.plan
        outcomes = [post(plan.url, plan.body, delivery.headers) for _ in range(delivery.copies)]
        self.model.record_delivery(delivery, outcomes)

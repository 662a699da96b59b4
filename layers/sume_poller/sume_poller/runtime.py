"""The entry points of every function's parts, for local tooling, tests and benchmarks: each
imports its function's wiring (:mod:`sume_poller.wiring`) only when called, so importing this
module costs nothing. The deployed handlers import their own wiring module directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api.jobsapi import JobsApi
    from .creates.submit import Submitter
    from .discovery.sweep import Sweeps
    from .discovery.webhook import WebhookReceiver
    from .poll.batch import BatchRunner
    from .poll.fanout import FanOut


def poll_runner() -> BatchRunner:
    from .wiring import poll

    return poll.runner()


def fanout(remaining_ms: Callable[[], int]) -> FanOut:
    from .wiring import fanout

    return fanout.fanout(remaining_ms)


def submitter() -> Submitter:
    from .wiring import submit

    return submit.submitter()


def sweeper(remaining_ms: Callable[[], int]) -> Sweeps:
    from .wiring import sweep

    return sweep.sweeper(remaining_ms)


def webhook_receiver() -> WebhookReceiver:
    from .wiring import webhook

    return webhook.receiver()


def jobs_api() -> JobsApi:
    from .wiring import jobs

    return jobs.api()


def redis_client(settings: Any) -> Any:
    from .wiring.shared import redis_client

    return redis_client(settings)


def sume_client(settings: Any, **options: Any) -> Any:
    from .wiring.shared import sume_client

    return sume_client(settings, **options)


def reset() -> None:
    from .wiring import reset

    reset()

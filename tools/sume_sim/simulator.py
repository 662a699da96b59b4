"""``SumeSimulator``: the model, its HTTP server and its webhook worker behind one Python API.

This is what tests, benchmarks and the demo embed (``with SumeSimulator(...) as sim``); the CLI
(``python -m tools.sume_sim``) wraps it too. The simulator runs on the project's clock: with
``time_scale`` s, a clock second lasts s real seconds, and every time the simulator reports or
takes (durations, hints, ``Retry-After``, budget windows, timestamps) is in clock seconds.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from sume_poller.core.clock import Clock
from tools.sume_sim.config import DEFAULT_API_KEY, Config, updated
from tools.sume_sim.http import API_PREFIX, CONTROL_PREFIX, SimServer
from tools.sume_sim.model import Model
from tools.sume_sim.webhooks import WebhookWorker


class SumeSimulator:
    """In-process Sume API simulator serving real HTTP on 127.0.0.1.

    >>> with SumeSimulator(api_key="k", time_scale=0.01) as sim:  # doctest: +SKIP
    ...     print(sim.base_url)   # http://127.0.0.1:PORT/api/v1

    ``rate_limit_per_minute`` is an alias of ``read_budget["per_minute"]`` (and wins over it);
    ``budget_windows`` (``{"minute": "fixed"|"sliding", "day": ...}``) how Sume counts each window;
    ``list_config`` is the ``list`` config field; ``keys`` adds API keys beside ``api_key``, each with its
    workspace and optionally its own budgets and webhook secret (see ``README.md``). ``clock`` replaces the default
    ``Clock(time_scale)``, for tests that drive time themselves; with ``deliver_webhooks=False``
    they also deliver due webhooks themselves (``model.take_due_webhooks``).
    """

    def __init__(
        self,
        api_key: str = DEFAULT_API_KEY,
        hints: bool = True,
        latency_ms: int = 0,
        time_scale: float = 1.0,
        *,
        error_rate_5xx: float = 0.0,
        malformed_rate: float = 0.0,
        rate_limit_per_minute: int | None = None,
        seed: int | None = None,
        exact_hints: bool = False,
        host: str = "127.0.0.1",
        max_jobs: int = 20_000,
        log_requests: bool = False,
        read_budget: dict[str, int | None] | None = None,
        create_budget: dict[str, int | None] | None = None,
        budget_windows: dict[str, str] | None = None,
        other_consumer_share: float = 0.0,
        not_found_for: float = 0.0,
        key_forbidden: bool = False,
        result_not_ready: int = 409,
        list_config: dict[str, Any] | None = None,
        webhooks: dict[str, Any] | None = None,
        keys: dict[str, Any] | None = None,
        clock: Clock | None = None,
        deliver_webhooks: bool = True,
    ) -> None:
        self.clock = clock or Clock(time_scale)
        changes: dict[str, Any] = {
            "time_scale": self.clock.scale, "api_key": api_key, "hints": hints, "latency_ms": latency_ms,
            "error_rate_5xx": error_rate_5xx, "malformed_rate": malformed_rate, "seed": seed,
            "exact_hints": exact_hints, "read_budget": read_budget, "create_budget": create_budget,
            "budget_windows": budget_windows,
            "other_consumer_share": other_consumer_share, "not_found_for": not_found_for,
            "key_forbidden": key_forbidden, "result_not_ready": result_not_ready, "list": list_config,
            "webhooks": webhooks, "keys": keys,
        }
        if rate_limit_per_minute is not None:
            changes["rate_limit_per_minute"] = rate_limit_per_minute
        self.model = Model(self.clock, updated(Config(), changes, initial=True), max_jobs=max_jobs)
        self.host = host
        self.log_requests = log_requests
        self.deliver_webhooks = deliver_webhooks
        self._server: SimServer | None = None
        self._worker: WebhookWorker | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self, port: int = 0) -> SumeSimulator:
        """Bind ``host:port`` (0 = any free port), serve and deliver webhooks; returns ``self``."""
        if self._server is not None:
            raise RuntimeError("simulator already started")
        self._server = SimServer(self.model, self.host, self.log_requests).start(port)
        if self.deliver_webhooks:
            self._worker = WebhookWorker(self.model).start()
        return self

    def stop(self) -> None:
        """Stop serving (dropping keep-alive connections) and stop the webhook worker."""
        server, worker = self._server, self._worker
        self._server = self._worker = None
        if server is not None:
            server.stop()
        if worker is not None:
            worker.stop()

    def __enter__(self) -> SumeSimulator:
        if self._server is None:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("simulator not started")
        return self._server.port

    @property
    def root_url(self) -> str:
        """``http://127.0.0.1:PORT`` (no path)."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The API base URL, e.g. ``http://127.0.0.1:PORT/api/v1``."""
        return self.root_url + API_PREFIX

    @property
    def control_url(self) -> str:
        """The control API base URL, e.g. ``http://127.0.0.1:PORT/_sim``."""
        return self.root_url + CONTROL_PREFIX

    # ------------------------------------------------------------------ control (same as /_sim)

    def reset(self) -> None:
        """Clear jobs, counters, budgets, idempotency keys and webhooks; restore the start config."""
        self.model.reset()

    def configure(self, **changes: Any) -> dict[str, Any]:
        """Apply config changes (same fields as ``POST /_sim/config``); return the full config."""
        return self.model.configure(**changes)

    @property
    def config(self) -> dict[str, Any]:
        return self.model.config.to_dict()

    def stats(self) -> dict[str, Any]:
        """Counters, per-job reads and webhook totals (``GET /_sim/stats``)."""
        return self.model.stats()

    def job_info(self, job_id: str) -> dict[str, Any] | None:
        """Control view of one job (``GET /_sim/jobs/{id}``), or None when unknown."""
        return self.model.job_info(job_id)

    def seed_job(self, kind: str = "image", sim: dict[str, Any] | None = None, job_id: str | None = None,
                 age: float = 0.0, webhook_url: str | None = None, *, key: str | None = None,
                 workspace: str | None = None) -> str:
        """Create a job directly (no billing, no budget), as if created ``age`` clock seconds ago, in
        the workspace of API key ``key`` or in ``workspace`` (default: the default workspace)."""
        return self.model.seed_job(kind, sim, job_id, age, webhook_url, key=key, workspace=workspace)

    def budget_stats(self) -> dict[str, Any]:
        """Budget windows per class and size of ``api_key``, and per workspace under ``keys``
        (``GET /_sim/budget``)."""
        return self.model.budget_stats()

    def add_key(self, key: str, workspace: str | None = None, *, read_budget: dict[str, int | None] | None = None,
                create_budget: dict[str, int | None] | None = None,
                webhook_secret: str | None = None) -> dict[str, Any]:
        """Add an API key (``POST /_sim/keys/add``); returns ``{"workspace", "key": <label>}``."""
        entry = {"key": key, "workspace": workspace, "read_budget": read_budget, "create_budget": create_budget,
                 "webhook_secret": webhook_secret}
        return self.model.add_key({name: value for name, value in entry.items() if value is not None})

    def rotate_key(self, old: str, new: str) -> dict[str, Any]:
        """``new`` takes over ``old``'s workspace, limits and budget windows; ``old`` answers 401 from now
        on (``POST /_sim/keys/rotate``)."""
        return self.model.rotate_key(old, new)

    def remove_key(self, key: str) -> dict[str, Any]:
        """``key`` answers 401 from now on; its workspace's jobs stay (``POST /_sim/keys/remove``)."""
        return self.model.remove_key(key)

    def webhook_stats(self) -> dict[str, Any]:
        """Webhook totals and recent deliveries (``GET /_sim/webhooks``)."""
        return self.model.webhook_stats()

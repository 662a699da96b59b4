"""Figure 2: Redis round trips per poll, counted server-side on a dedicated redis-server.

The real Poller (lease on the dedicated server; Sume simulator, DynamoDB on moto, the poll
queue captured in memory) polls jobs one at a time; around each poll one ``INFO stats
commandstats`` reads the server's counters (round trips = read events, see
:class:`bench.harness.RedisCounter`). A client-side count (requests written) cross-checks it.

Baseline: redis-py's ``Lock`` the obvious way, per poll: ``acquire`` (SET NX PX), the Sume
read, ``extend`` (Lua) when the job is not terminal, ``release`` (Lua).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from statistics import mean
from typing import Any

from bench.harness import CallCounter, CaptureQueue, RedisCounter, counting_client
from bench.report import Row
from bench.services import Services

DEADLINE_AT = 4_102_444_800
TARGET = 2
NOT_TERMINAL = {"sim": {"duration": 3600, "steps": 2}}
#: Not terminal on the first read (1 s hint), terminal on the next.
THEN_TERMINAL = {"sim": {"duration": 0, "status_override": {"status": "running", "reads": 1}}}


def _due_now(body: str) -> Any:
    """The captured next message of a chain, due now (the bench does not wait out the hint)."""
    import time

    from sume_poller.messages import parse_message
    return parse_message(body).next(due_at=round(time.time(), 3))


class _Meter:
    def __init__(self, counter: RedisCounter, client_side: CallCounter) -> None:
        self.server = counter
        self.client = client_side
        self.samples: dict[str, list[tuple[int, int]]] = defaultdict(list)
        self.commands: dict[str, Counter[str]] = defaultdict(Counter)

    def measure(self, category: Callable[[Any], str], fn: Callable[[], Any]) -> Any:
        before, c0 = self.server.snapshot(), self.client.n
        out = fn()
        rt, commands = RedisCounter.delta(before, self.server.snapshot())
        name = category(out)
        self.samples[name].append((rt, self.client.n - c0))
        self.commands[name].update(commands)
        return out

    def per_poll(self, name: str) -> tuple[float, int, float]:
        """(mean server-side RT, max server-side RT, mean client-side RT) of one category."""
        s = self.samples.get(name) or [(0, 0)]
        return mean(r for r, _ in s), max(r for r, _ in s), mean(c for _, c in s)

    def mix(self, name: str) -> str:
        n = len(self.samples.get(name) or [1])
        return " ".join(f"{cmd} {calls / n:g}" for cmd, calls in sorted(self.commands[name].items()))


def measure(svc: Services, n: int = 20) -> Row:
    from sume_poller import runtime
    from sume_poller.jobs import hint_delay
    from sume_poller.lease import LeaseStore
    from sume_poller.messages import PollMessage
    from sume_poller.poller import Poller
    from sume_poller.sume import Pending, Terminal
    from tools.services import RedisServer

    svc.fresh()
    settings = runtime.settings()
    store, sume, bus = runtime.job_store(), runtime.sume_client(), svc.bus()

    def seed(prefix: str, spec: dict[str, Any], count: int) -> list[str]:
        ids = []
        for i in range(count):
            job_id = svc.sim.seed_job("image", spec["sim"], job_id=f"job_rt_{prefix}_{i:03d}")
            store.put_pending(job_id, "image", DEADLINE_AT, settings.pending_shards)
            ids.append(job_id)
        return ids

    def first(job_id: str) -> Any:
        return PollMessage(job_id=job_id, kind="image", deadline_at=DEADLINE_AT, due_at=0.0)

    with RedisServer() as dedicated:
        counter = RedisCounter(dedicated.url)
        # -- sume-poller's lease ------------------------------------------------------------------
        ours = CallCounter()
        lease = LeaseStore(counting_client(dedicated.url, ours), settings.lease_key_prefix)
        queue = CaptureQueue()
        poller = Poller(settings, lease, sume, store, queue, bus)  # type: ignore[arg-type]
        meter = _Meter(counter, ours)
        warm = seed("warm", NOT_TERMINAL, 1) + seed("warmt", THEN_TERMINAL, 1)
        queue.take()
        cold = [meter.measure(lambda o: "cold", lambda j=j: poller.process(first(j))) for j in warm]
        body = next(b for b, _d in queue.take() if json.loads(b)["job_id"] == warm[1])
        cold.append(meter.measure(lambda o: "cold", lambda: poller.process(_due_now(body))))
        slow, quick = seed("a", NOT_TERMINAL, n), seed("b", THEN_TERMINAL, n)
        for job_id in slow + quick:
            meter.measure(lambda o: f"first:{o.name}", lambda j=job_id: poller.process(first(j)))
        nxt = {json.loads(body)["job_id"]: body for body, _delay in queue.take()}
        for job_id in slow + quick:
            meter.measure(lambda o: f"chain:{o.name}", lambda j=job_id: poller.process(_due_now(nxt[j])))
        for job_id in slow:  # the same messages again: stale duplicates
            meter.measure(lambda o: f"dup:{o.name}", lambda j=job_id: poller.process(_due_now(nxt[j])))

        # -- baseline: redis-py Lock, acquire / extend / release per poll -----------------------------------
        theirs = CallCounter()
        lock_client = counting_client(dedicated.url, theirs)
        lock_meter = _Meter(counter, theirs)
        ttl = settings.claim_ttl_seconds

        def lock_poll(job_id: str) -> str:
            lock = lock_client.lock(f"bench:lock:{job_id}", timeout=ttl, blocking=False, thread_local=False)
            if not lock.acquire():
                return "contention"
            reply = sume.get_status(job_id)
            if isinstance(reply, Terminal):
                if reply.status == "completed":
                    sume.get_result(job_id)
                lock.release()
                return "terminal"
            delay = hint_delay(reply.next_poll_after) if isinstance(reply, Pending) and reply.next_poll_after else 5
            lock.extend(delay + settings.lease_margin_seconds, replace_ttl=True)
            lock.release()
            return "requeued"

        for job_id in seed("lw", NOT_TERMINAL, 1) + seed("lwt", THEN_TERMINAL, 1):
            lock_meter.measure(lambda o: "cold", lambda j=job_id: lock_poll(j))
            lock_poll(job_id)
        lslow, lquick = seed("la", NOT_TERMINAL, n), seed("lb", THEN_TERMINAL, n)
        for job_id in lslow + lquick:
            lock_meter.measure(lambda o: f"first:{o}", lambda j=job_id: lock_poll(j))
        for job_id in lslow + lquick:
            lock_meter.measure(lambda o: f"chain:{o}", lambda j=job_id: lock_poll(j))

    names = {"first:requeued", "chain:requeued", "chain:terminal", "dup:contention"}
    missing = names - set(meter.samples)
    if missing:
        raise RuntimeError(f"polls did not go as planned: got {sorted(meter.samples)}, missing {sorted(missing)}")
    non_terminal = meter.samples["first:requeued"] + meter.samples["chain:requeued"]
    nt_mean = mean(r for r, _ in non_terminal)
    nt_max = max(r for r, _ in non_terminal)
    nt_client = mean(c for _, c in non_terminal)
    term_mean, _term_max, term_client = meter.per_poll("chain:terminal")
    lock_nt = lock_meter.samples["first:requeued"] + lock_meter.samples["chain:requeued"]
    lock_nt_mean = mean(r for r, _ in lock_nt)
    lock_term, _m, _c = lock_meter.per_poll("chain:terminal")
    dup_mean, _dm, _dc = meter.per_poll("dup:contention")
    row = Row("2 Redis round trips per poll (server-side, dedicated redis-server)",
              f"not terminal {nt_mean:.2f} (max {nt_max}), terminal {term_mean:.2f} RT/poll; "
              f"{len(non_terminal)} + {len(meter.samples['chain:terminal'])} polls",
              f"redis-py Lock: not terminal {lock_nt_mean:.2f}, terminal {lock_term:.2f} RT/poll",
              nt_mean / lock_nt_mean if lock_nt_mean else None, f"<= {TARGET} RT per non-terminal poll (measured)",
              nt_max <= TARGET)
    row.notes.append(
        f"ratio = ours / Lock per non-terminal poll; client-side count agrees: not terminal {nt_client:.2f}, "
        f"terminal {term_client:.2f}; commands per poll (Lua-internal ones included): first poll "
        f"[{meter.mix('first:requeued')}], chain poll [{meter.mix('chain:requeued')}], terminal "
        f"[{meter.mix('chain:terminal')}], Lock [{lock_meter.mix('chain:requeued')}]; a stale duplicate is dropped "
        f"in {dup_mean:.2f} RT; the first 3 polls of a new container ({', '.join(x.name for x in cold)}) cost "
        f"{sum(r for r, _ in meter.samples['cold'])} RT (connection handshake, NOSCRIPT + SCRIPT LOAD once per "
        "script)")
    return row

"""After a 403 on a job: is it the key, or only this job? (Sume answers 403 for a job of another
workspace, and for a key refused altogether.)

One read that names no job - ``GET /jobs?limit=1`` - decides: refused (401, 403) the key, answered
(a page, or a refusal past the key: 400, 404) only the job. If the list route itself is forbidden (a
key may lack it), a job this container read fine recently decides instead; with none to ask, the
key (its reads pause; nothing is recorded) - read under that job's lease, taken for the read (a job
whose chain holds its lease is not read: no evidence now). A read that gets no answer (5xx, 429, a timeout) is no
evidence either way, and neither is a read slot not soon enough: the check says "not now" and the
job asks again later. Only an answer that clears the key holds, for a minute per container. Every
read takes its slot from the shared budget like any other (:meth:`sume_poller.limits.gate.ReadGate.slot_soon`).
"""

from __future__ import annotations

import contextlib
from typing import Any

from ..core.clock import Clock
from ..limits.gate import ReadGate
from ..limits.lease import new_token
from ..limits.redisconn import RedisFailure
from ..sume.client import JobReader, Refused, Retryable
from .step import Deadline

#: The lease a key-check probe takes on the job it reads (real ms; released after the read).
PROBE_LEASE_MS = 60_000
#: How long a "the key is fine" answer holds (clock seconds).
KEY_CHECK_TTL = 60.0
#: The farthest read slot (clock seconds) a key-check read waits for in the invocation; past it the
#: job asks again later.
KEY_CHECK_WAIT = 2.0
#: How long a refused key pauses every read, key-wide (clock seconds).
KEY_PAUSE = 300.0
#: A paused key's chains wake spread over this many clock seconds after the pause, not all at once.
PAUSE_SPREAD = 30.0


class KeyCheck:
    def __init__(self, sume: JobReader, clock: Clock, gate: ReadGate) -> None:
        self.sume = sume
        self.clock = clock
        self.gate = gate
        self._ok_until = 0.0
        self._last_ok_job: str | None = None

    def read_fine(self, job_id: str) -> None:
        """A job this container just read without a refusal (the fallback evidence)."""
        self._last_ok_job = job_id

    def refused(self, deadline: Deadline) -> bool | None:
        """True: the key is refused; False: only the job; None: no evidence now - no read slot soon
        enough (within ``KEY_CHECK_WAIT`` and the invocation's time), or no answer to the check's read."""
        now = self.clock.now()
        if now < self._ok_until:
            return False
        if not self._slot(deadline):
            return None
        listing = self.sume.list_jobs(limit=1, timeout=deadline.call_timeout())
        self.gate.tell(listing.rate, self.clock.now())
        if isinstance(listing, Retryable):
            return None
        if isinstance(listing, Refused) and listing.why == "forbidden" and self._last_ok_job:
            if not self._slot(deadline):
                return None
            probe = self._probe(self._last_ok_job, deadline)
            if probe is None or isinstance(probe, Retryable):
                return None
            refused = isinstance(probe, Refused) and probe.why in ("key", "forbidden")
        else:
            refused = isinstance(listing, Refused) and listing.why in ("key", "forbidden")
        if not refused:
            self._ok_until = now + KEY_CHECK_TTL
        return refused

    def _probe(self, job_id: str, deadline: Deadline) -> Any:
        """The status read of a job this container read fine, under that job's lease taken for the read
        (a chain of the job reads it under its own: never two reads of one job in flight); None when
        a chain holds it or Redis cannot be asked (no evidence now)."""
        token = new_token()
        try:
            if not self.gate.lease.start(job_id, token, PROBE_LEASE_MS):
                return None
        except RedisFailure:
            return None
        try:
            probe = self.sume.get_status(job_id, timeout=deadline.call_timeout())
        finally:
            with contextlib.suppress(*RedisFailure):
                self.gate.lease.release(job_id, f"{token}:0")
        self.gate.tell(probe.rate, self.clock.now())
        return probe

    def _slot(self, deadline: Deadline) -> bool:
        return self.gate.slot_soon(KEY_CHECK_WAIT, deadline.wait_room())

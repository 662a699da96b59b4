"""After a 403 on a job: is it the key, or only this job? (Sume answers 403 for a job of another
workspace, and for a key refused altogether.)

One read that names no job - ``GET /jobs?limit=1`` - decides: refused (401, 403) the key, answered
(a page, or a refusal past the key: 400, 404) only the job. If the list route itself is forbidden (a
key may lack it), a job this container read fine recently decides instead; with none to ask, the
key (its reads pause; nothing is recorded). A read that gets no answer (5xx, 429, a timeout) is no
evidence either way, and neither is a read slot not soon enough: the check says "not now" and the
job asks again later. Only an answer that clears the key holds, for a minute per container. Every
read takes its slot from the shared budget like any other (:meth:`sume_poller.limits.gate.ReadGate.slot_soon`).
"""

from __future__ import annotations

from ..core.clock import Clock
from ..limits.gate import ReadGate
from ..sume.client import JobReader, Refused, Retryable
from .step import Deadline

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
            probe = self.sume.get_status(self._last_ok_job, timeout=deadline.call_timeout())
            self.gate.tell(probe.rate, self.clock.now())
            if isinstance(probe, Retryable):
                return None
            refused = isinstance(probe, Refused) and probe.why in ("key", "forbidden")
        else:
            refused = isinstance(listing, Refused) and listing.why in ("key", "forbidden")
        if not refused:
            self._ok_until = now + KEY_CHECK_TTL
        return refused

    def _slot(self, deadline: Deadline) -> bool:
        return self.gate.slot_soon(KEY_CHECK_WAIT, deadline.wait_room())

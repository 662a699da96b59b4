"""The key check's probe: where the list route is forbidden too, the job it reads to decide is read
under that job's lease, taken for the read - never beside the job's own chain (simulation seed 15483)."""

from __future__ import annotations

from typing import Any

from sume_poller.core.clock import Clock
from sume_poller.poll.keycheck import KeyCheck
from sume_poller.poll.step import Deadline
from sume_poller.sume.client import Refused


class Lease:
    def __init__(self, free: bool) -> None:
        self.free, self.calls = free, []  # type: ignore[var-annotated]

    def start(self, job_id: str, token: str, ttl_ms: int) -> bool:
        self.calls.append(("start", job_id))
        return self.free

    def release(self, job_id: str, value: str) -> bool:
        self.calls.append(("release", job_id))
        return True


class Gate:
    def __init__(self, lease: Lease) -> None:
        self.lease = lease

    def slot_soon(self, wait: float, room: float) -> bool:
        return True

    def tell(self, rate: Any, now: float) -> None:
        pass


class Sume:
    def __init__(self) -> None:
        self.reads: list[str] = []

    def list_jobs(self, **_: Any) -> Refused:
        return Refused("forbidden", 403)

    def get_status(self, job_id: str, **_: Any) -> Refused:
        self.reads.append(job_id)
        return Refused("forbidden", 403)


def check(free: bool) -> tuple[bool | None, Sume, Lease]:
    sume, lease = Sume(), Lease(free)
    keys = KeyCheck(sume, Clock(), Gate(lease))  # type: ignore[arg-type]
    keys.read_fine("job_ok")
    return keys.refused(Deadline(10.0)), sume, lease


def test_a_probe_of_a_job_whose_chain_holds_its_lease_is_no_evidence_and_reads_nothing() -> None:
    verdict, sume, lease = check(free=False)
    assert verdict is None and sume.reads == [] and lease.calls == [("start", "job_ok")]


def test_a_probe_reads_under_the_lease_it_took_and_frees_it() -> None:
    verdict, sume, lease = check(free=True)
    assert verdict is True and sume.reads == ["job_ok"]
    assert lease.calls == [("start", "job_ok"), ("release", "job_ok")]

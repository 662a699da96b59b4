"""Keeping a fetched result: the record fields of what Sume's result route returned."""

from __future__ import annotations

from typing import Any

from ..core.observability import logger
from ..store.records import JobStore
from ..sume.status import BodyTooLarge, Oversized, Result, ResultStream


def keep_result(store: JobStore, job_id: str, reply: Result | ResultStream | Oversized,
                max_bytes: int) -> dict[str, Any]:
    """The record fields of a fetched result: inline or in S3 (:meth:`JobStore.result_fields`),
    streamed to S3 (:meth:`~sume_poller.store.records.ResultBucket.upload`), or - past ``max_bytes`` -
    its size and error ``result_too_large``, never stored."""
    if isinstance(reply, Result):
        return store.result_fields(job_id, reply.payload)
    size = reply.size if isinstance(reply, Oversized) else (reply.length or max_bytes + 1)
    if not isinstance(reply, Oversized) and store.results is not None:
        with reply:
            try:
                return store.results.upload(job_id, reply)
            except BodyTooLarge as exc:
                size = exc.size
    logger.error("result larger than the maximum; recorded without it", extra={"bytes": size, "max": max_bytes})
    return {"result_bytes": size, "error": {"code": "result_too_large",
                                            "message": f"the result has {size} bytes or more (max {max_bytes})"}}

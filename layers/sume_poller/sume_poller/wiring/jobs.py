"""The jobs function's parts: GetJob over the job table and the result bucket, POST /jobs through
to the submit function. No Redis, no Sume key: this function only reads and forwards."""

from __future__ import annotations

import os

from botocore.config import Config

from ..api.jobsapi import JobsApi, SubmitDoor
from ..api.reader import JobReader, JobsSettings, presigner
from ..core.aws import client
from ..store.records import JobStore
from . import once

#: Pre-signed URLs: SigV4 (botocore's default for a pre-signed S3 URL is still SigV2 and the global
#: endpoint) on the bucket's regional virtual host; path style on a local endpoint (moto, ministack).
PRESIGN_CONFIG = Config(signature_version="s3v4", s3={"addressing_style": "virtual"})
LOCAL_PRESIGN_CONFIG = Config(signature_version="s3v4", s3={"addressing_style": "path"})
#: The synchronous invoke of the submit function: its reply may take the submit function's whole
#: 30 s Timeout, and a retried Invoke would run the submission again - one attempt, and the caller
#: retries (the same Idempotency-Key replays). Below this function's own Timeout (template.yaml).
INVOKE_READ_TIMEOUT_S = 35
INVOKE_CONFIG = Config(read_timeout=INVOKE_READ_TIMEOUT_S, retries={"mode": "standard", "total_max_attempts": 1})


@once
def api() -> JobsApi:
    s = JobsSettings.from_env(os.environ)
    local = bool(os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3"))
    s3 = client("s3", LOCAL_PRESIGN_CONFIG if local else PRESIGN_CONFIG)
    reader = JobReader(JobStore(s.common.jobs_table, shards=1),  # reads only: the shard count is never used
                       presigner(s3, s.result_bucket), s.result_url_expiry)
    return JobsApi(reader, SubmitDoor(client("lambda", INVOKE_CONFIG), s.submit_function))

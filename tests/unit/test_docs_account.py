"""What a caller and an operator read in docs/ says what the stack does (round three, the caller's
side): the function URL policy AWS asks of every caller, the GetJob reply as records now are, and
the local stack's ways (the jobs URL's host, PerKeyAlarms, a key list that does not exist yet)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from sume_poller.api.reader import PUBLIC_FIELDS, RESULT_FIELDS

DOCS = Path(__file__).resolve().parents[2] / "docs"


def json_blocks(page: str) -> list[Any]:
    """Every ```json block of a page that parses whole (examples with "..." elisions do not)."""
    blocks = []
    for text in re.findall(r"```json\n(.*?)```", (DOCS / page).read_text(), re.S):
        try:
            blocks.append(json.loads(text))
        except ValueError:
            continue
    return blocks


def test_the_url_policy_grants_both_actions_each_limited_to_the_url() -> None:
    """https://docs.aws.amazon.com/lambda/latest/dg/urls-auth.html: a caller needs lambda:InvokeFunctionUrl
    and lambda:InvokeFunction; lambda:FunctionUrlAuthType and lambda:InvokedViaFunctionUrl limit them
    to the URL."""
    (policy,) = [b for b in json_blocks("read-api.md") if isinstance(b, dict) and "Statement" in b]
    by_action = {s["Action"]: s for s in policy["Statement"]}
    assert set(by_action) == {"lambda:InvokeFunctionUrl", "lambda:InvokeFunction"}
    assert by_action["lambda:InvokeFunctionUrl"]["Condition"] == {
        "StringEquals": {"lambda:FunctionUrlAuthType": "AWS_IAM"}}
    assert by_action["lambda:InvokeFunction"]["Condition"] == {"Bool": {"lambda:InvokedViaFunctionUrl": "true"}}
    assert all(s["Effect"] == "Allow" and s["Resource"].endswith(":function:<JobsFunctionName>")
               for s in policy["Statement"])


def test_the_getjob_example_is_a_reply_as_records_now_are() -> None:
    (reply,) = [b for b in json_blocks("read-api.md") if isinstance(b, dict) and "job_id" in b]
    assert list(reply) == [*PUBLIC_FIELDS, *RESULT_FIELDS]
    assert reply["key"] == "default" and reply["idempotency_key"]  # records name their key; the caller's id


def test_the_local_stacks_ways_are_said_where_a_new_user_looks() -> None:
    read_api, keys, local = ((DOCS / page).read_text() for page in ("read-api.md", "keys.md", "local.md"))
    assert '"Host": host' in read_api and "does not resolve" in read_api  # the jobs URL on ministack
    assert "PerKeyAlarms=false" in keys and "PerKeyAlarms=false" in local
    assert "**Before the list exists**" in keys and "does not exist: create that" in keys.replace("\n", " ")
    assert "needs an `api_key_from` of its own" in keys  # an entry with the default key's id

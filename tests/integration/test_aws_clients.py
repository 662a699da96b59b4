"""How many times the layer's AWS clients send one call that keeps failing: botocore's ``max_attempts``
counts retries (``max_attempts: 1`` is two sends), ``total_max_attempts`` counts sends - counted here
at a loopback server that answers every request 503 (a retryable error in botocore's standard mode)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from sume_poller.core.aws import CLIENT_CONFIG
from sume_poller.store.events import EVENTS_CONFIG
from sume_poller.wiring.jobs import INVOKE_CONFIG

pytestmark = pytest.mark.integration


class _Unavailable(http.server.BaseHTTPRequestHandler):
    sends = 0

    def do_POST(self) -> None:
        type(self).sends += 1
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"__type":"ServiceUnavailableException","message":"try later"}'
        self.send_response(503)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def unavailable() -> Iterator[tuple[str, type[_Unavailable]]]:
    handler = type("Handler", (_Unavailable,), {"sends": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("service", "config", "sends"), [
    ("dynamodb", CLIENT_CONFIG, 2),                    # every client: one call at most ~8 s (two sends)
    ("events", CLIENT_CONFIG.merge(EVENTS_CONFIG), 1),  # PutEvents under the publish claim: never resent
    ("lambda", CLIENT_CONFIG.merge(INVOKE_CONFIG), 1),  # POST /jobs's Invoke: a resend submits again
])
def test_a_failing_call_is_sent_as_often_as_its_config_says(unavailable: tuple[str, type[_Unavailable]],
                                                              service: str, config: Config, sends: int) -> None:
    endpoint, handler = unavailable
    client = boto3.session.Session().client(service, endpoint_url=endpoint, region_name="us-east-1",
                                            aws_access_key_id="test", aws_secret_access_key="test",
                                            config=config)
    call = {"dynamodb": lambda: client.get_item(TableName="t", Key={"job_id": {"S": "j"}}),
            "events": lambda: client.put_events(Entries=[{"Source": "s", "DetailType": "d", "Detail": "{}"}]),
            "lambda": lambda: client.invoke(FunctionName="f", Payload=b"{}")}[service]
    with pytest.raises(ClientError):
        call()
    assert handler.sends == sends

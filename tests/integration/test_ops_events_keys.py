"""Operator commands on moto server over HTTP: a terminal-event rule's dead letters re-delivered to
that rule's target alone (never to the bus, which would reach every rule again), and the key
configuration's format-1 inline secrets moved to secrets of their own, safe to repeat."""

from __future__ import annotations

import json

import boto3
import pytest

from sume_poller.config.keys import KeyRing
from tools.ops import OpsError, migrate_keys, plan_migration, redrive_events

pytestmark = pytest.mark.integration


def event(job: str) -> str:
    return json.dumps({"version": "0", "id": f"id-{job}", "detail-type": "Sume Job Terminal", "source": "sume.poller",
                       "detail": {"job_id": job, "event_id": f"{job}:terminal"}})


def test_a_rules_dead_letters_go_back_to_that_rules_target_alone(aws: str) -> None:
    sqs = boto3.client("sqs")
    dlq = sqs.create_queue(QueueName="target-dlq")["QueueUrl"]
    target = sqs.create_queue(QueueName="consumer")["QueueUrl"]
    other = sqs.create_queue(QueueName="stack-events")["QueueUrl"]  # the other rule's target
    target_arn = sqs.get_queue_attributes(QueueUrl=target, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    bodies = [event(f"job_{i}") for i in range(13)]  # more than one receive's 10
    for body in bodies:
        sqs.send_message(QueueUrl=dlq, MessageBody=body)

    assert redrive_events(sqs, dlq, target_arn, boto3.client) == 13
    received = []
    while batch := sqs.receive_message(QueueUrl=target, MaxNumberOfMessages=10).get("Messages", []):
        received += [m["Body"] for m in batch]
        for m in batch:
            sqs.delete_message(QueueUrl=target, ReceiptHandle=m["ReceiptHandle"])
    assert sorted(received) == sorted(bodies)  # the event as the rule delivers it, each once
    assert not sqs.receive_message(QueueUrl=dlq).get("Messages")
    assert not sqs.receive_message(QueueUrl=other).get("Messages")
    assert redrive_events(sqs, dlq, target_arn, boto3.client) == 0  # safe to repeat
    with pytest.raises(OpsError, match="cannot re-deliver to a apigateway target"):
        redrive_events(sqs, dlq, "arn:aws:apigateway:us-east-1::/restapis/x", boto3.client)


def test_format_1_secrets_move_out_of_the_key_list_in_two_steps_each_safe_to_repeat(aws: str) -> None:
    secrets, ssm, name = boto3.client("secretsmanager"), boto3.client("ssm"), "sume/keys"
    old = {"keys": {"acme": {"api_key": "sume_live_acme", "webhook_secret": "whsec_acme", "reads_per_minute": 60},
                    "globex": {"api_key_from": "ssm:/sume/keys/globex"},
                    "initech": {"api_key_from": "secretsmanager:sume/keys/api-keys/initech"}}}
    ssm.put_parameter(Name="/sume/keys/globex", Value="sume_live_globex", Type="SecureString")
    secrets.create_secret(Name=name, SecretString=json.dumps(old))

    done = migrate_keys(secrets, ssm, name, finish=False)
    assert all("sume_live" not in line and "whsec" not in line for line in done)  # ids and names, never values
    step1 = json.loads(secrets.get_secret_value(SecretId=name)["SecretString"])
    assert step1["keys"]["acme"] == {"api_key_from": "secretsmanager:sume/keys/api-keys/acme",
                                     "webhook_secret": "whsec_acme", "reads_per_minute": 60}
    assert step1["keys"]["globex"] == {"api_key_from": "secretsmanager:sume/keys/api-keys/globex"}
    assert step1["keys"]["initech"] == old["keys"]["initech"]
    # What the version before the split reads: no field it does not know, every key under the list's name.
    assert {f for e in step1["keys"].values() for f in e} <= {"api_key", "api_key_from", "webhook_secret",
                                                                "reads_per_minute"}
    for key_id, value in (("acme", "sume_live_acme"), ("globex", "sume_live_globex")):
        assert secrets.get_secret_value(SecretId=f"{name}/api-keys/{key_id}")["SecretString"] == value
    assert secrets.get_secret_value(SecretId=f"{name}/webhook-secrets/acme")["SecretString"] == "whsec_acme"
    assert migrate_keys(secrets, ssm, name, finish=False)  # again: the same list
    assert json.loads(secrets.get_secret_value(SecretId=name)["SecretString"]) == step1

    migrate_keys(secrets, ssm, name, finish=True)  # after deploying: the list holds no secret at all
    final = json.loads(secrets.get_secret_value(SecretId=name)["SecretString"])
    assert final["keys"]["acme"] == {"api_key_from": "secretsmanager:sume/keys/api-keys/acme", "reads_per_minute": 60,
                                     "webhook_secret_from": "secretsmanager:sume/keys/webhook-secrets/acme"}
    assert "sume_live" not in json.dumps(final) and "whsec" not in json.dumps(final)

    def secret(ref: str, source: str) -> object:
        return lambda: secrets.get_secret_value(SecretId=ref)["SecretString"]

    ring = KeyRing("main", read_config=lambda force: json.dumps(final), secret=secret, config_name=name)
    acme = ring.get("acme")
    assert acme.api_key() == "sume_live_acme" and acme.webhook_secret is not None
    assert acme.webhook_secret() == "whsec_acme" and ring.get("globex").api_key() == "sume_live_globex"
    assert migrate_keys(secrets, ssm, name, finish=True) == ["nothing to migrate: the key configuration is in format 2"]


def test_a_list_that_is_not_a_key_configuration_is_refused_not_rewritten() -> None:
    with pytest.raises(OpsError, match="nothing to migrate"):
        plan_migration({"acme": {}}, "sume/keys", lambda source, ref: "", finish=True)


def test_a_key_list_that_does_not_exist_yet_fails_loudly_saying_what_to_do(aws: str,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """SumeKeysSecretName set before its secret exists: no function serves the default key alone
    (every other key's jobs would be recorded key_removed); each call fails, counted KeyConfigInvalid."""
    from sume_poller.config.keys import KeyConfigError, Limits
    from sume_poller.config.settings import KeySettings
    from sume_poller.wiring.shared import key_ring

    ring = key_ring(KeySettings(default_id="main", config_secret="sume/not-yet"), Limits(), default=False)
    with pytest.raises(KeyConfigError, match='sume/not-yet does not exist: create that Secrets Manager secret'):
        ring.first()
    assert '"KeyConfigInvalid"' in capsys.readouterr().out
    boto3.client("secretsmanager").create_secret(Name="sume/not-yet", SecretString='{"keys": {}}')
    ring.invalidate()
    with pytest.raises(KeyConfigError, match="no Sume key"):  # read now: an empty list, no default key here
        ring.first()

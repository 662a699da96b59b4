"""AWS's published us-east-1 prices the cost figure uses (on-demand, no free tier: an account's free
tier is shared with everything else it runs), each with the page it was read from and the date.

The pages were read through the project's stored copies of public pages (the ``search`` tool's
``pages`` and ``docs`` corpora) on 2026-12-04. Where AWS's own page renders its price table
client-side and no stored copy shows the number, the value is taken from a third-party page that
quotes it (named beside it) or, where none does, the value used is argued in its comment.
"""

from __future__ import annotations

from dataclasses import dataclass

READ_ON = "2026-12-04"
HOURS_PER_MONTH = 730.0  # AWS's pricing pages and calculator count a month as 730 hours
SECONDS_PER_MONTH = HOURS_PER_MONTH * 3600


@dataclass(frozen=True)
class Price:
    value: float  # dollars per unit
    unit: str
    source: str


# -- Lambda (arm64) ------------------------------------------------------------------------------------
# https://aws.amazon.com/lambda/pricing/ (archived copy of 2026-06-18): requests and duration; the
# rate table is rendered client-side there, so the numbers are from
# https://git.mcrn.ar/mariano/lambda_local_runner/.../lambda-13-cost.md (x86 $0.0000166667, arm64
# $0.0000133334 per GB-s, $0.20 per 1M requests) and https://cloudchipr.com/blog/aws-lambda-pricing
# (arm64 first 7.5 billion GB-s $0.0000133334).
LAMBDA_REQUEST = Price(0.20 / 1e6, "request", "aws.amazon.com/lambda/pricing (via cloudchipr.com, git.mcrn.ar)")
LAMBDA_GB_SECOND_ARM = Price(0.0000133334, "GB-s arm64", "aws.amazon.com/lambda/pricing (via cloudchipr.com)")

# -- SQS -----------------------------------------------------------------------------------------------
# https://cloudburn.io/blog/amazon-sqs-pricing (March 2026, us-east-1): standard queue $0.40 per million
# requests (first 100 billion); https://unanswered.io/guide/aws-sqs-pricing-and-cost-optimization: "each
# 64 KB chunk of a message is billed as one request".
SQS_REQUEST = Price(0.40 / 1e6, "request (64 KB chunk)", "cloudburn.io/blog/amazon-sqs-pricing")

# -- DynamoDB on-demand ------------------------------------------------------------------------------
# https://airbyte.com/data-engineering-resources/dynamodb-pricing (US East): $0.625 per million WRU,
# $0.125 per million RRU; unit sizes from https://aws.eu/dynamodb/pricing/on-demand (1 KB write, 4 KB
# strongly consistent read, half a unit eventually consistent, transactional twice).
DDB_WRU = Price(0.625 / 1e6, "write request unit", "airbyte.com (AWS on-demand price, US East)")
DDB_RRU = Price(0.125 / 1e6, "read request unit", "airbyte.com (AWS on-demand price, US East)")
# Storage: https://aws.amazon.com/dynamodb/pricing/ (stored copy): "prices start from $0.25 per GB-month"
# (the first 25 GB free is free tier, not counted). Continuous backups (PITR, on in template.yaml):
# $0.20 per GB-month - not in a stored copy of the page (docs.aws.amazon.com/amazondynamodb/latest/
# developerguide/backup-restore-billing.html describes the meter, not the rate); AWS's us-east-1 list price.
DDB_STORAGE = Price(0.25, "GB-month", "aws.amazon.com/dynamodb/pricing")
DDB_PITR = Price(0.20, "GB-month", "DynamoDB continuous backups list price (rate not in a stored copy)")

# -- S3 Standard -------------------------------------------------------------------------------------
# https://cloudburn.io/blog/amazon-s3-pricing (US East, March 2026): S3 Standard $0.023 per GB-month. The
# request rates ($0.005 per 1,000 PUT/COPY/POST/LIST, $0.0004 per 1,000 GET) are S3 Standard's us-east-1
# list prices; aws.amazon.com/s3/pricing renders its table client-side and no stored copy shows them.
S3_STORAGE = Price(0.023, "GB-month", "cloudburn.io/blog/amazon-s3-pricing")
S3_PUT = Price(0.005 / 1000, "PUT/COPY/POST/LIST request", "S3 Standard list price (us-east-1)")
S3_GET = Price(0.0004 / 1000, "GET request", "S3 Standard list price (us-east-1)")

# -- EventBridge -------------------------------------------------------------------------------------
# https://cloudburn.io/blog/amazon-eventbridge-pricing (March 2026, US East): custom events $1.00 per
# million; https://hykell.com/.../aws-eventbridge-pricing-and-cost-management: metered in 64 KB chunks.
EVENTBRIDGE_EVENT = Price(1.00 / 1e6, "custom event (64 KB chunk)", "cloudburn.io/blog/amazon-eventbridge-pricing")

# -- Secrets Manager, SSM Parameter Store, KMS ---------------------------------------------------------
# https://awsready.net/learn/aws-secrets-manager-parameter-store/ and techoral.com: $0.40 per secret per
# month, $0.05 per 10,000 API calls; standard parameters and their standard throughput are free.
SECRET_MONTH = Price(0.40, "secret-month", "awsready.net (Secrets Manager $0.40/secret/month)")
SECRETS_CALL = Price(0.05 / 10_000, "API call", "awsready.net (Secrets Manager $0.05 per 10,000 calls)")
SSM_CALL = Price(0.0, "GetParameter, standard throughput", "techoral.com (standard parameters free)")
# A SecureString read with decryption is a KMS Decrypt with the AWS managed key aws/ssm: "you will be
# charged on any API request made to AWS-managed keys" (https://aws.amazon.com/fr/kms/pricing/, stored
# copy), $0.03 per 10,000 symmetric requests (https://www.wring.co/blog/aws-kms-pricing-guide).
KMS_REQUEST = Price(0.03 / 10_000, "request", "aws.amazon.com/kms/pricing; wring.co/blog/aws-kms-pricing-guide")

# -- CloudWatch --------------------------------------------------------------------------------------
# https://aws.amazon.com/cloudwatch/pricing/ (stored copy) names the dimensions; its tables render
# client-side. Numbers: https://signoz.io/guides/cloudwatch-pricing ($0.30 per custom metric-month for
# the first 10,000), https://www.factualminds.com/blog/amazon-cloudwatch-pricing-... (logs ingestion
# $0.50 per GB, dashboards $3 each), https://c3x.dev/resources/aws/aws_cloudwatch_metric_alarm ($0.10
# per standard-resolution alarm metric-month). Lambda's logs are "vended" logs, tiered from the same
# $0.50 per GB for the first 10 TB. Log storage $0.03 per GB-month (archived, compressed; priced here
# on the uncompressed bytes: an upper bound).
CW_METRIC_MONTH = Price(0.30, "custom metric-month", "signoz.io/guides/cloudwatch-pricing")
CW_LOG_INGEST = Price(0.50, "GB ingested", "factualminds.com (CloudWatch Logs ingestion)")
CW_LOG_STORAGE = Price(0.03, "GB-month stored", "CloudWatch Logs archived storage list price")
CW_ALARM_METRIC = Price(0.10, "standard alarm metric-month", "c3x.dev (standard resolution alarm)")
# Alarms on a Metrics Insights query are billed per metric the query analyzes; no stored copy gives
# their rate, so each metric a per-key query analyzes (one per key) is priced as a standard alarm metric.
CW_INSIGHTS_ALARM_METRIC = Price(0.10, "metric analyzed by a query alarm, per month",
                                 "assumed equal to a standard alarm metric (rate not in a stored copy)")
CW_DASHBOARD = Price(3.00, "dashboard-month", "factualminds.com (CloudWatch dashboards $3 each)")

# -- Step Functions ----------------------------------------------------------------------------------
# https://aws.amazon.com/step-functions/pricing/ (stored copy): US East (N. Virginia) $0.0250 per 1,000
# state transitions (Standard workflows).
SFN_TRANSITION = Price(0.025 / 1000, "state transition", "aws.amazon.com/step-functions/pricing")

# -- ElastiCache ---------------------------------------------------------------------------------------
# https://www.usage.ai/blogs/aws/database-savings-plans/elasticache/serverless-pricing/ (US East, June
# 2026, from AWS's Database Blog worked example): Valkey $0.0023 per million ECPUs and $0.084 per GB-hour,
# Redis OSS $0.0034 and $0.125. Minimum metered storage 100 MB (Valkey) and 1 GB (Redis OSS):
# https://aws.eu/it/elasticache/pricing and https://cur.vantage.sh/aws/amazonelasticache. One ECPU per KB
# a command transfers, more for commands that take more vCPU (same pages).
VALKEY_SERVERLESS_ECPU = Price(0.0023 / 1e6, "ECPU", "usage.ai (ElastiCache Serverless Valkey, US East)")
VALKEY_SERVERLESS_GB_HOUR = Price(0.084, "GB-hour (min 0.1 GB)", "usage.ai; aws.eu/it/elasticache/pricing (100 MB min)")
REDIS_SERVERLESS_ECPU = Price(0.0034 / 1e6, "ECPU", "usage.ai; thinkwithwp.com (AWS Database Blog example)")
REDIS_SERVERLESS_GB_HOUR = Price(0.125, "GB-hour (min 1 GB)", "usage.ai; cur.vantage.sh (1 GB min)")
VALKEY_MIN_GB, REDIS_MIN_GB = 0.1, 1.0
# One small node: cache.t4g.micro (0.5 GiB) on demand, Redis OSS $0.016 per hour; Valkey nodes are priced
# 20 % below Redis OSS ($0.0128). The node table on aws.amazon.com/elasticache/pricing renders
# client-side and no stored copy shows it; these are its us-east-1 list prices.
NODE_T4G_MICRO_VALKEY = Price(0.0128, "node-hour", "ElastiCache on-demand cache.t4g.micro, Valkey (list price)")

# -- the network ---------------------------------------------------------------------------------------
# https://basavytix.com/blog/aws-nat-gateway-pricing and https://cloudburn.io/blog/aws-nat-gateway-pricing
# (us-east-1): $0.045 per NAT gateway-hour and $0.045 per GB processed; a NAT gateway's public IPv4
# address $0.005 per hour (cloudburn.io). S3 and DynamoDB gateway endpoints are free (basavytix.com):
# the deploy docs route the table and bucket through them.
NAT_HOUR = Price(0.045, "NAT gateway-hour (per AZ)", "basavytix.com/blog/aws-nat-gateway-pricing")
NAT_GB = Price(0.045, "GB processed", "basavytix.com/blog/aws-nat-gateway-pricing")
PUBLIC_IPV4_HOUR = Price(0.005, "public IPv4 address-hour", "cloudburn.io/blog/aws-nat-gateway-pricing")

# -- a hosted Redis over TLS, outside AWS's bill ---------------------------------------------------------
# Upstash Redis pay-as-you-go, from its own docs (website-...upstash.vercel.app/docs/redis/overall/
# billing.md): $0.20 per 100K commands, storage $0.25 per GB-month with the first GB free, bandwidth free
# up to 200 GB a month. A script (EVALSHA) is one command.
UPSTASH_COMMAND = Price(0.20 / 100_000, "command", "upstash.com docs, Pricing & Billing (pay-as-you-go)")

# Redis Cloud Essentials (paid: 250 MB up, TLS - github.com/redis/docs content/operate/rc/subscriptions):
# "from $0.007/hour, $5/month minimum" (api-evangelist/redis plans, transcribing redis.io/pricing). No
# per-command charge; the smallest plan's memory far exceeds what a run holds.
REDIS_CLOUD_HOUR = Price(0.007, "hour (Essentials 250 MB)", "redis.io/pricing via api-evangelist/redis plans")
REDIS_CLOUD_MONTH_MIN = Price(5.00, "month minimum", "redis.io/pricing via api-evangelist/redis plans")

ALL = {name: value for name, value in dict(globals()).items() if isinstance(value, Price)}

"""A plain rank for `test_ranks_use_the_runs_keys.py`: writes a file into its own checkpoint
prefix and tries to read another team's checkpoint (argv[1], a key in the same bucket) with
whatever credentials its environment gives boto3. Exit 0: own write done, the other refused with
AccessDenied; 3: the other checkpoint was readable (the deployment's keys reached the rank)."""

from __future__ import annotations

import os
import sys

import boto3
from botocore.exceptions import ClientError

s3 = boto3.client("s3", endpoint_url=os.environ["TRAINYARD_S3_ENDPOINT_URL"], region_name="us-east-1")
bucket, _, root = os.environ["TRAINYARD_CHECKPOINT_URI"].removeprefix("s3://").partition("/")
s3.put_object(Bucket=bucket, Key=f"{root}/probe.txt", Body=b"written by the rank")
try:
    s3.get_object(Bucket=bucket, Key=sys.argv[1])
except ClientError as e:
    print(f"other team's checkpoint: {e.response['Error']['Code']}", flush=True)
    sys.exit(0 if e.response["Error"]["Code"] == "AccessDenied" else 4)
print("other team's checkpoint: readable", flush=True)
sys.exit(3)

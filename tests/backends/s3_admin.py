"""Bucket chores for tests/backends/s3_backend_test.cc, done with boto3 (an independent client).

    s3_admin.py create-bucket BUCKET     create it (an existing one of ours is fine)
    s3_admin.py uploads BUCKET           print how many multipart uploads are in progress
    s3_admin.py get BUCKET KEY           print the object's size and SHA-256 ("SIZE HEX")

Endpoint, keys and region come from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY
and AWS_REGION (what scripts/rgw.sh writes). Run with Debian's /usr/bin/python3.
"""
import hashlib
import os
import sys

import boto3
import botocore.config


def client():
    return boto3.client(
        "s3",
        endpoint_url=os.environ["AWS_ENDPOINT_URL"],
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
        config=botocore.config.Config(s3={"addressing_style": "path"},
                                      retries={"max_attempts": 3}))


def main(argv):
    op, bucket = argv[1], argv[2]
    s3 = client()
    if op == "create-bucket":
        try:
            s3.create_bucket(Bucket=bucket)
        except s3.exceptions.BucketAlreadyOwnedByYou:
            pass
    elif op == "uploads":
        resp = s3.list_multipart_uploads(Bucket=bucket)
        print(len(resp.get("Uploads", [])))
    elif op == "get":
        data = s3.get_object(Bucket=bucket, Key=argv[3])["Body"].read()
        print(len(data), hashlib.sha256(data).hexdigest())
    else:
        print("unknown operation " + op, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

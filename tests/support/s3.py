"""An S3-compatible server for tests: moto in server mode, on a free loopback port.

moto speaks the protocol (presigned GET/PUT, Range, multipart) but checks neither signatures nor
expiry: those are tested on the local store."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import boto3
import pytest

FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_EC2_METADATA_DISABLED": "true",  # no instance-metadata probe: that address is unreachable here
    "AWS_DEFAULT_REGION": "us-east-1",
}


@contextmanager
def moto_server(bucket: str) -> Iterator[str]:
    """Yields the endpoint URL of a fresh moto server holding an empty `bucket`."""
    from moto.server import ThreadedMotoServer

    with pytest.MonkeyPatch.context() as env:
        for key, value in FAKE_ENV.items():
            env.setenv(key, value)
        env.delenv("AWS_SESSION_TOKEN", raising=False)
        env.delenv("AWS_PROFILE", raising=False)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
        try:
            yield endpoint
        finally:
            server.stop()

"""The S3 object store (AWS or any S3-compatible server), through aioboto3.

Executors never see S3 credentials: the API hands them presigned URLs (DESIGN.md invariant 5).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aioboto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from minions.store.base import InvalidKey, ListedObject, ObjectNotFound, StoreError, check_range, validate_key

if TYPE_CHECKING:
    from types_aiobotocore_s3 import S3Client
    from types_aiobotocore_s3.type_defs import CompletedPartTypeDef

CHUNK_SIZE = 256 * 1024
# S3 wants every multipart part but the last to be >= 5 MiB; 8 MiB parts keep the request count
# low while a stream still costs at most one part of memory.
PART_SIZE = 8 * 1024 * 1024
MAX_PARTS = 10_000  # S3's limit per multipart upload
# SigV4 presigned URLs are valid for at most seven days.
MAX_PRESIGN_S = 7 * 24 * 3600
_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/key` -> (bucket, key); InvalidKey for anything else."""
    parts = urlsplit(uri)
    key = parts.path.lstrip("/")
    if parts.scheme != "s3" or not parts.netloc or not key or parts.query or parts.fragment:
        raise InvalidKey(f"not an s3://bucket/key URI: {uri!r}")
    return parts.netloc, key


def part_size(part_number: int) -> int:
    """Size of multipart part `part_number` (1-based): 8 MiB for the first thousand parts, then a
    little larger every thousand, so the 10,000-part limit still allows ~430 GiB while memory stays
    bounded by one part."""
    return PART_SIZE * (1 + (part_number - 1) // 1000)


class S3Store:
    """Objects under `s3://bucket/prefix`."""

    def __init__(self, root_uri: str, endpoint_url: str | None = None) -> None:
        parts = urlsplit(root_uri)
        if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
            raise ValueError(f"not an s3://bucket[/prefix] URI: {root_uri!r}")
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/")
        self._root_uri = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self.endpoint_url = endpoint_url or None
        self.region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        self._client: S3Client | None = None
        self._stack = AsyncExitStack()
        # Two first calls racing must not open two clients (one would leak its connection pool).
        self._client_lock = asyncio.Lock()

    @property
    def root_uri(self) -> str:
        return self._root_uri

    def uri_for(self, key: str) -> str:
        return f"{self._root_uri}/{validate_key(key)}"

    def _object_key(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def readable(self, uri: str) -> bool:
        try:
            parse_s3_uri(uri)
        except InvalidKey:
            return False
        return True

    async def _s3(self) -> S3Client:
        if self._client is not None:
            return self._client
        async with self._client_lock:
            if self._client is not None:
                return self._client
            config = Config(
                # Path style and SigV4 explicitly: S3-compatible servers (MinIO, moto) and buckets
                # with dots in their names need path style, and v4 is the only signature every
                # region accepts for presigned URLs.
                signature_version="s3v4",
                s3={"addressing_style": "path"},
            )
            client: S3Client = await self._stack.enter_async_context(
                aioboto3.Session().client("s3", endpoint_url=self.endpoint_url, region_name=self.region,
                                          config=config))
            self._client = client
            return client

    async def put_bytes(self, key: str, data: bytes) -> str:
        object_key = self._object_key(key)
        s3 = await self._s3()
        try:
            await s3.put_object(Bucket=self.bucket, Key=object_key, Body=data)
        except (ClientError, BotoCoreError) as e:
            raise StoreError(f"cannot write {self.uri_for(key)}: {e}") from e
        return self.uri_for(key)

    async def put_stream(self, key: str, chunks: AsyncIterator[bytes]) -> tuple[str, int]:
        """One PutObject when the stream fits in the first part, else a multipart upload whose
        parts are sent as they fill: memory is bounded by one part whatever the object's size."""
        object_key = self._object_key(key)
        uri = self.uri_for(key)
        s3 = await self._s3()
        buffer = bytearray()
        size = 0
        upload_id: str | None = None
        parts: list[CompletedPartTypeDef] = []
        try:
            async for chunk in chunks:
                buffer += chunk
                size += len(chunk)
                while len(buffer) >= part_size(len(parts) + 1):
                    if upload_id is None:
                        created = await s3.create_multipart_upload(Bucket=self.bucket, Key=object_key)
                        upload_id = created["UploadId"]
                    number = len(parts) + 1
                    if number > MAX_PARTS:
                        raise StoreError(f"cannot write {uri}: more than {MAX_PARTS} parts")
                    take = part_size(number)
                    body = bytes(buffer[:take])
                    del buffer[:take]
                    sent = await s3.upload_part(Bucket=self.bucket, Key=object_key, UploadId=upload_id,
                                                PartNumber=number, Body=body)
                    parts.append({"PartNumber": number, "ETag": sent["ETag"]})
            if upload_id is None:
                await s3.put_object(Bucket=self.bucket, Key=object_key, Body=bytes(buffer))
                return uri, size
            if buffer or not parts:
                number = len(parts) + 1
                sent = await s3.upload_part(Bucket=self.bucket, Key=object_key, UploadId=upload_id,
                                            PartNumber=number, Body=bytes(buffer))
                parts.append({"PartNumber": number, "ETag": sent["ETag"]})
            await s3.complete_multipart_upload(Bucket=self.bucket, Key=object_key, UploadId=upload_id,
                                               MultipartUpload={"Parts": parts})
            return uri, size
        except BaseException as e:
            if upload_id is not None:
                # An unfinished multipart upload is invisible but billed until aborted. Shielded so a
                # cancelled writer still cleans up.
                with contextlib.suppress(ClientError, BotoCoreError):
                    await asyncio.shield(s3.abort_multipart_upload(Bucket=self.bucket, Key=object_key,
                                                                   UploadId=upload_id))
            if isinstance(e, ClientError | BotoCoreError):
                raise StoreError(f"cannot write {uri}: {e}") from e
            raise

    async def size(self, uri: str) -> int | None:
        bucket, key = parse_s3_uri(uri)
        s3 = await self._s3()
        try:
            head = await s3.head_object(Bucket=bucket, Key=key)
        except ClientError as e:
            if _error_code(e) in _NOT_FOUND:
                return None
            raise StoreError(f"cannot stat {uri}: {e}") from e
        except BotoCoreError as e:
            raise StoreError(f"cannot stat {uri}: {e}") from e
        return int(head["ContentLength"])

    async def read(self, uri: str, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        check_range(start, end)
        if end is not None and end == start:
            return
        bucket, key = parse_s3_uri(uri)
        s3 = await self._s3()
        request: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if start > 0 or end is not None:
            # HTTP ranges are inclusive; ours are half-open.
            request["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        try:
            response = await s3.get_object(**request)
        except ClientError as e:
            code = _error_code(e)
            if code in _NOT_FOUND:
                raise ObjectNotFound(f"no object at {uri}") from e
            if code == "InvalidRange":
                # The range starts at or past the end (or the object is empty): no bytes, as a
                # local read of the same range gives.
                return
            raise StoreError(f"cannot read {uri}: {e}") from e
        except BotoCoreError as e:
            raise StoreError(f"cannot read {uri}: {e}") from e
        body = response["Body"]
        # Entering the body (not `as`: that yields the raw aiohttp response) releases the
        # connection however the consumer stops reading.
        async with body:
            try:
                async for chunk in body.iter_chunks(CHUNK_SIZE):
                    yield chunk
            except (ClientError, BotoCoreError) as e:
                raise StoreError(f"cannot read {uri}: {e}") from e

    async def read_bytes(self, uri: str, start: int, end: int) -> bytes:
        return b"".join([chunk async for chunk in self.read(uri, start, end)])  # one ranged GET

    async def presign_get(self, uri: str, expires_s: float) -> str:
        bucket, key = parse_s3_uri(uri)
        return await self._presign("get_object", bucket, key, expires_s)

    async def presign_input(self, uri: str, start: int, end: int, lease: uuid.UUID, expires_s: float) -> str:
        """A GET of bytes [start, end) with the Range header signed (X-Amz-SignedHeaders: host;range):
        S3 checks a signed header's value, so a request without `Range: bytes=start-(end-1)`, or with
        any other range, fails with 403 SignatureDoesNotMatch. S3 knows nothing of leases: `lease` is
        not in the URL, and only its lifetime (`expires_s`) bounds it."""
        check_range(start, end)
        if end == start:
            raise StoreError("an input URL's range must be non-empty")
        bucket, key = parse_s3_uri(uri)
        return await self._presign("get_object", bucket, key, expires_s, Range=f"bytes={start}-{end - 1}")

    async def presign_put(self, key: str, expires_s: float) -> str:
        return await self._presign("put_object", self.bucket, self._object_key(key), expires_s)

    async def _presign(self, operation: str, bucket: str, key: str, expires_s: float, **params: str) -> str:
        expires = math.ceil(expires_s)  # rounded up: never expire before the caller asked
        if not 0 < expires <= MAX_PRESIGN_S:
            # Clamping would hand out a URL that dies before the lease it serves.
            raise StoreError(f"presigned URLs last 1 s to 7 days, not {expires_s} s")
        s3 = await self._s3()
        url: str = await s3.generate_presigned_url(operation, Params={"Bucket": bucket, "Key": key, **params},
                                                   ExpiresIn=expires)
        return url

    async def delete(self, uri: str) -> None:
        """Remove an object; a missing one is not an error (S3 semantics)."""
        bucket, key = parse_s3_uri(uri)
        s3 = await self._s3()
        try:
            await s3.delete_object(Bucket=bucket, Key=key)
        except (ClientError, BotoCoreError) as e:
            raise StoreError(f"cannot delete {uri}: {e}") from e

    async def scan(self, prefix: str) -> AsyncIterator[ListedObject]:
        """Objects under the prefix, then its unfinished multipart uploads (invisible, but billed)."""
        root = f"{self.prefix}/" if self.prefix else ""
        s3 = await self._s3()
        try:
            async for page in s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                            Prefix=root + prefix):
                for item in page.get("Contents", []):
                    yield ListedObject(item["Key"][len(root):], int(item["Size"]),
                                       item["LastModified"].timestamp())
            async for page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket,
                                                                                  Prefix=root + prefix):
                for upload in page.get("Uploads", []):
                    yield ListedObject(upload["Key"][len(root):], 0, upload["Initiated"].timestamp(),
                                       partial=True, upload_id=upload["UploadId"])
        except (ClientError, BotoCoreError) as e:
            raise StoreError(f"cannot list {self._root_uri}/{prefix}: {e}") from e

    async def remove(self, found: ListedObject) -> None:
        if not found.partial:
            await self.delete(self.uri_for(found.key))
            return
        s3 = await self._s3()
        try:
            await s3.abort_multipart_upload(Bucket=self.bucket, Key=self._object_key(found.key),
                                            UploadId=found.upload_id)
        except ClientError as e:
            if _error_code(e) != "NoSuchUpload":
                raise StoreError(f"cannot abort an upload of {found.key}: {e}") from e
        except BotoCoreError as e:
            raise StoreError(f"cannot abort an upload of {found.key}: {e}") from e

    async def close(self) -> None:
        self._client = None
        await self._stack.aclose()


def _error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))

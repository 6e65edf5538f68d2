"""The object stores: the local folder (and its signed URLs served by the API routes) and S3 against
moto's server. Signing and expiry are tested on the local store only: moto checks neither."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import aiohttp
import boto3
import pytest
import pytest_asyncio
import yarl
from aiohttp import web
from aiohttp.test_utils import TestServer

from minions.services.api.appkeys import INPUT_READABLE, OUTPUT_WRITABLE, STORE
from minions.services.api.store.routes import add_routes, parse_range
from minions.services.api.store.url_signing import SignedLocalStore
from minions.store import InvalidKey, ObjectNotFound, StoreError, open_store, signing
from minions.store.base import validate_key
from minions.store.local import LocalStore
from minions.store.s3 import PART_SIZE, S3Store, parse_s3_uri
from tests.support.s3 import moto_server

KEY = "test-signing-key"
DATA = bytes(range(256)) * 1000  # 256,000 bytes, every offset distinguishable


async def collect(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in chunks])


async def stream_of(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


@pytest.fixture
def local(tmp_path: Path) -> SignedLocalStore:
    return SignedLocalStore(tmp_path / "store", KEY, "http://unused.invalid")


def temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".tmp")]


async def eventually(condition: Callable[[], bool], within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


# --- keys ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["inputs/a.jsonl", "outputs/t/1/attempt-2.jsonl", "a", "A-b_c.9", ".hidden"])
def test_valid_keys(key: str) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize("key", ["", "/etc/passwd", "../x", "a/../b", "a/./b", "a//b", "a/", "..", ".",
                                 "a b", "a%2fb", "ü", "a\\b", "a?b", "x" * 1025])
def test_invalid_keys(key: str, local: LocalStore) -> None:
    with pytest.raises(InvalidKey):
        validate_key(key)
    with pytest.raises(ValueError):  # InvalidKey is a ValueError too
        local.uri_for(key)


async def test_put_rejects_invalid_key(local: SignedLocalStore) -> None:
    with pytest.raises(InvalidKey):
        await local.put_bytes("../escape", b"x")
    with pytest.raises(InvalidKey):
        await local.presign_put("/abs", 60)
    assert not (local.root.parent / "escape").exists()


# --- local store -----------------------------------------------------------------------------------

async def test_local_uris(local: LocalStore, tmp_path: Path) -> None:
    root = local.root
    assert root.is_absolute() and root == tmp_path / "store"
    assert local.root_uri == f"file://{root}"
    assert local.uri_for("inputs/a.jsonl") == f"file://{root}/inputs/a.jsonl"
    assert local.key_for(f"file://{root}/inputs/a.jsonl") == "inputs/a.jsonl"
    assert local.key_for(f"file://localhost{root}/inputs/a.jsonl") == "inputs/a.jsonl"


async def test_local_readable_rejects_escapes(local: LocalStore) -> None:
    root = local.root_uri
    assert local.readable(f"{root}/inputs/a.jsonl")
    for uri in [
        f"{root}/../secret",
        f"{root}/inputs/../../secret",
        f"{root}/%2e%2e/secret",
        f"{root}/inputs/%2E%2E/%2E%2E/secret",
        f"{root}//etc/passwd",
        f"{root}",
        f"{root}/",
        f"{root}2/sibling",  # a folder whose name merely starts with the root's
        "file:///etc/passwd",
        f"file://otherhost{root[len('file://'):]}/a",
        f"{root}/a?x=1",
        "s3://bucket/key",
        "/plain/path",
    ]:
        assert not local.readable(uri), uri
        with pytest.raises(InvalidKey):
            await local.size(uri)


async def test_local_put_and_read(local: LocalStore) -> None:
    uri = await local.put_bytes("inputs/a.bin", DATA)
    assert uri == local.uri_for("inputs/a.bin")
    assert await local.size(uri) == len(DATA)
    assert await collect(local.read(uri)) == DATA
    assert await collect(local.read(uri, 1000)) == DATA[1000:]
    assert await collect(local.read(uri, 5, 17)) == DATA[5:17]
    assert await collect(local.read(uri, 0, len(DATA) + 100)) == DATA
    assert await collect(local.read(uri, len(DATA))) == b""
    assert await collect(local.read(uri, 7, 7)) == b""
    # Chunks are bounded (256 KiB), so a large range is streamed, not loaded.
    assert max([len(c) async for c in local.read(uri)]) <= 256 * 1024
    # read_bytes: the same bytes in one piece, clamped to the object as read() is.
    for start, end in ((5, 17), (0, len(DATA) + 100), (len(DATA), len(DATA) + 5), (7, 7)):
        assert await local.read_bytes(uri, start, end) == DATA[start:end]


async def test_local_missing_objects(local: LocalStore) -> None:
    missing = local.uri_for("nope/none.bin")
    assert await local.size(missing) is None
    with pytest.raises(ObjectNotFound):
        await collect(local.read(missing))
    with pytest.raises(ObjectNotFound):
        await local.read_bytes(missing, 0, 10)
    await local.put_bytes("dir/child", b"x")
    assert await local.size(local.uri_for("dir")) is None  # a folder is not an object
    with pytest.raises(ObjectNotFound):
        await collect(local.read(local.uri_for("dir")))
    await local.delete(missing)  # deleting nothing is fine, as on S3
    await local.delete(local.uri_for("dir/child"))
    assert await local.size(local.uri_for("dir/child")) is None


async def test_local_put_stream_is_atomic(local: LocalStore) -> None:
    uri = await local.put_bytes("outputs/o.jsonl", b"old")
    gate = asyncio.Event()
    proceed = asyncio.Event()

    async def slow() -> AsyncIterator[bytes]:
        yield b"a" * 700_000
        yield b"b" * 700_000  # past the 1 MiB write buffer: some bytes are on disk in a temp file
        gate.set()
        await proceed.wait()
        yield b"c" * 10

    writer = asyncio.create_task(local.put_stream("outputs/o.jsonl", slow()))
    await gate.wait()
    await asyncio.sleep(0.05)
    # Mid-write, readers still see the old object whole.
    assert await collect(local.read(uri)) == b"old"
    assert temp_files(local.root)
    proceed.set()
    assert await writer == (uri, 1_400_010)
    assert await local.size(uri) == 1_400_010
    body = await collect(local.read(uri))
    assert body == b"a" * 700_000 + b"b" * 700_000 + b"c" * 10
    assert temp_files(local.root) == []


async def test_local_failed_stream_leaves_nothing(local: LocalStore) -> None:
    uri = await local.put_bytes("outputs/o.jsonl", b"old")

    async def broken() -> AsyncIterator[bytes]:
        yield b"x" * 2_000_000
        raise ConnectionResetError("client went away")

    with pytest.raises(ConnectionResetError):
        await local.put_stream("outputs/o.jsonl", broken())
    with pytest.raises(ConnectionResetError):
        await local.put_stream("outputs/new.jsonl", broken())
    assert await collect(local.read(uri)) == b"old"
    assert await local.size(local.uri_for("outputs/new.jsonl")) is None
    assert temp_files(local.root) == []


async def test_local_put_stream_cancelled_leaves_nothing(local: LocalStore) -> None:
    started = asyncio.Event()

    async def endless() -> AsyncIterator[bytes]:
        yield b"x" * 100
        started.set()
        await asyncio.Event().wait()
        yield b"never"

    writer = asyncio.create_task(local.put_stream("outputs/c.jsonl", endless()))
    await started.wait()
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer
    assert await local.size(local.uri_for("outputs/c.jsonl")) is None
    assert temp_files(local.root) == []


async def test_local_empty_object(local: LocalStore) -> None:
    uri, size = await local.put_stream("empty", stream_of())
    assert size == 0
    assert await local.size(uri) == 0
    assert await collect(local.read(uri)) == b""


def test_local_needs_signing_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        SignedLocalStore(tmp_path, "", "http://x")


# --- signing ---------------------------------------------------------------------------------------

def test_signing_round_trip() -> None:
    expires = int(time.time()) + 60
    sig = signing.signature(KEY, "GET", "a/b", expires)
    assert signing.verify(KEY, "GET", "a/b", expires, sig)
    assert not signing.verify(KEY, "PUT", "a/b", expires, sig)
    assert not signing.verify(KEY, "GET", "a/c", expires, sig)
    assert not signing.verify(KEY, "GET", "a/b", expires + 1, sig)
    assert not signing.verify("other-key", "GET", "a/b", expires, sig)
    query = {"method": "GET", "expires": str(expires), "sig": sig}
    signing.check(KEY, "GET", "a/b", query)
    with pytest.raises(signing.UrlExpired):
        signing.check(KEY, "GET", "a/b", query, now=expires)
    for bad in [{**query, "sig": "0" * 64}, {**query, "method": "PUT"}, {**query, "expires": f"+{expires}"},
                {"method": "GET", "expires": str(expires)}, {}]:
        with pytest.raises(signing.SignatureError) as info:
            signing.check(KEY, "GET", "a/b", bad)
        assert info.value.code == "bad_signature"


def test_scoped_signing_round_trip() -> None:
    expires = int(time.time()) + 60
    lease = uuid.uuid4()
    scope = signing.Scope(lease, 100, 200)
    sig = signing.signature(KEY, "GET", "a/b", expires, scope)
    assert signing.verify(KEY, "GET", "a/b", expires, sig, scope)
    # Neither a whole-object signature nor one of another range or lease.
    assert not signing.verify(KEY, "GET", "a/b", expires, sig)
    assert sig != signing.signature(KEY, "GET", "a/b", expires)
    for other in (signing.Scope(lease, 100, 201), signing.Scope(lease, 99, 200), signing.Scope(uuid.uuid4(), 100, 200)):
        assert not signing.verify(KEY, "GET", "a/b", expires, sig, other)
    query = {"method": "GET", "expires": str(expires), "token": str(lease), "start": "100", "end": "200", "sig": sig}
    assert signing.check(KEY, "GET", "a/b", query) == scope
    assert signing.check(KEY, "GET", "a/b", {"method": "GET", "expires": str(expires),
                                             "sig": signing.signature(KEY, "GET", "a/b", expires)}) is None
    for bad in [{**query, "start": "0"}, {**query, "end": "999"}, {**query, "token": str(uuid.uuid4())},
                {**query, "start": "0100"}, {**query, "token": str(lease).upper()}, {**query, "start": "+100"},
                {k: v for k, v in query.items() if k != "end"}, {k: v for k, v in query.items() if k != "token"},
                {**query, "token": "not-a-uuid"}, {**query, "start": "200"},
                {k: v for k, v in query.items() if k not in ("token", "start", "end")}]:
        with pytest.raises(signing.SignatureError) as info:
            signing.check(KEY, "GET", "a/b", bad)
        assert info.value.code == "bad_signature", bad
    with pytest.raises(ValueError):
        signing.Scope(lease, 5, 5)
    with pytest.raises(ValueError):
        signing.signed_url("http://x", KEY, "PUT", "a/b", expires, scope)


async def test_presigned_local_input_url_shape(local: SignedLocalStore) -> None:
    store = SignedLocalStore(local.root, KEY, "http://api.example:8080/")
    lease = uuid.uuid4()
    before = time.time()
    url = await store.presign_input(store.uri_for("inputs/a.jsonl"), 10, 20, lease, 180)
    query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    assert (query["method"], query["token"], query["start"], query["end"]) == ("GET", str(lease), "10", "20")
    assert before + 180 <= int(query["expires"]) <= time.time() + 182
    assert query["sig"] == signing.signature(KEY, "GET", "inputs/a.jsonl", int(query["expires"]),
                                             signing.Scope(lease, 10, 20))


async def test_presigned_local_url_shape(local: SignedLocalStore) -> None:
    store = SignedLocalStore(local.root, KEY, "http://api.example:8080/")
    before = time.time()
    url = await store.presign_get(store.uri_for("inputs/a.jsonl"), 90.5)
    parts = urlsplit(url)
    assert f"{parts.scheme}://{parts.netloc}{parts.path}" == "http://api.example:8080/api/v1/store/inputs/a.jsonl"
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    assert query["method"] == "GET"
    assert before + 90.5 <= int(query["expires"]) <= time.time() + 92
    assert query["sig"] == signing.signature(KEY, "GET", "inputs/a.jsonl", int(query["expires"]))
    with pytest.raises(InvalidKey):
        await store.presign_get("file:///elsewhere/x", 60)


@pytest.mark.parametrize(("header", "size", "expected"), [
    ("bytes=0-9", 100, (0, 10)),
    ("bytes=90-200", 100, (90, 100)),
    ("bytes=10-", 100, (10, 100)),
    ("bytes=-10", 100, (90, 100)),
    ("bytes=-500", 100, (0, 100)),
    ("bytes=5-4", 100, None),
    ("bytes=0-1,5-6", 100, None),
    ("items=0-1", 100, None),
    ("bytes=-", 100, None),
])
def test_parse_range(header: str, size: int, expected: tuple[int, int] | None) -> None:
    assert parse_range(header, size) == expected


@pytest.mark.parametrize(("header", "size"), [("bytes=100-", 100), ("bytes=-0", 100), ("bytes=0-0", 0)])
def test_parse_range_unsatisfiable(header: str, size: int) -> None:
    with pytest.raises(ValueError):
        parse_range(header, size)


# --- signed URLs through the API routes ------------------------------------------------------------

async def _any_output_writable(key: str) -> bool:
    """A double of the API's lease check (which needs a database; tests/security covers it): these
    tests are about signatures, so every output key counts as the key of a live lease."""
    return key.startswith("outputs/")


# Input URLs' leases that the double of the API's lease check counts as live (tests/security covers
# the real one).
LIVE_LEASES: set[tuple[uuid.UUID, int, int]] = set()


async def _live_input(token: uuid.UUID, start: int, end: int) -> bool:
    return (token, start, end) in LIVE_LEASES


@pytest_asyncio.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[SignedLocalStore, aiohttp.ClientSession]]:
    """A LocalStore served by a real aiohttp server on 127.0.0.1, and a client session."""
    app = web.Application()
    add_routes(app)
    store = SignedLocalStore(tmp_path / "served", KEY, "http://placeholder.invalid")
    app[STORE] = store  # before start: a started application's state is frozen
    app[OUTPUT_WRITABLE] = _any_output_writable
    app[INPUT_READABLE] = _live_input
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    store.base_url = str(server.make_url("")).rstrip("/")  # the port is known only now
    try:
        async with aiohttp.ClientSession() as session:
            yield store, session
    finally:
        await server.close()


async def test_signed_get_with_range(served: tuple[SignedLocalStore, aiohttp.ClientSession]) -> None:
    store, session = served
    uri = await store.put_bytes("inputs/data.bin", DATA)
    url = await store.presign_get(uri, 60)
    async with session.get(url, headers={"Range": "bytes=1000-1999"}) as response:
        assert response.status == 206
        assert response.headers["Content-Range"] == f"bytes 1000-1999/{len(DATA)}"
        assert response.headers["Content-Length"] == "1000"
        assert await response.read() == DATA[1000:2000]
    async with session.get(url, headers={"Range": "bytes=-5"}) as response:
        assert response.status == 206
        assert await response.read() == DATA[-5:]
    async with session.get(url) as response:
        assert response.status == 200
        assert response.headers["Accept-Ranges"] == "bytes"
        assert await response.read() == DATA
    async with session.head(url) as response:
        assert response.status == 200
        assert response.headers["Content-Length"] == str(len(DATA))
    async with session.get(url, headers={"Range": f"bytes={len(DATA)}-"}) as response:
        assert response.status == 416
        assert response.headers["Content-Range"] == f"bytes */{len(DATA)}"
        assert (await response.json())["error"]["code"] == "range_not_satisfiable"


async def test_scoped_get_serves_its_range_alone(served: tuple[SignedLocalStore, aiohttp.ClientSession]) -> None:
    store, session = served
    uri = await store.put_bytes("inputs/data.bin", DATA)
    lease = uuid.uuid4()
    LIVE_LEASES.add((lease, 1000, 2000))
    url = await store.presign_input(uri, 1000, 2000, lease, 60)
    for headers in ({}, {"Range": "bytes=1000-1999"}, {"Range": "bytes=0-1,5-6"}):  # none, exact, ignored
        async with session.get(url, headers=headers) as response:
            assert response.status == 206, headers
            assert response.headers["Content-Range"] == f"bytes 1000-1999/{len(DATA)}"
            assert await response.read() == DATA[1000:2000]
    async with session.get(url, headers={"Range": "bytes=1500-1599"}) as response:  # inside: served
        assert response.status == 206
        assert await response.read() == DATA[1500:1600]
    async with session.head(url) as response:
        assert response.status == 206 and response.headers["Content-Length"] == "1000"
    for outside in ("bytes=0-", "bytes=999-1999", "bytes=1000-2000", "bytes=1500-", "bytes=-10", "bytes=0-0",
                    f"bytes={len(DATA)}-"):
        async with session.get(url, headers={"Range": outside}) as response:
            assert response.status == 416, outside
            error = (await response.json())["error"]
            assert error["code"] == "range_not_signed" and "[1000, 2000)" in error["message"]
    LIVE_LEASES.discard((lease, 1000, 2000))  # the lease ends
    async with session.get(url, headers={"Range": "bytes=1000-1999"}) as response:
        assert response.status == 403
        assert (await response.json())["error"]["code"] == "lease_ended"


async def test_signed_get_missing_is_404(served: tuple[SignedLocalStore, aiohttp.ClientSession]) -> None:
    store, session = served
    url = await store.presign_get(store.uri_for("inputs/none.bin"), 60)
    async with session.get(url) as response:
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "not_found"


async def test_signed_put_then_read(served: tuple[SignedLocalStore, aiohttp.ClientSession]) -> None:
    store, session = served
    url = await store.presign_put("outputs/t/1/attempt-1.jsonl", 60)
    body = b'{"id": "a1", "embedding": [0.1]}\n' * 50_000  # ~1.7 MB, several chunks
    async with session.put(url, data=io.BytesIO(body)) as response:
        assert response.status == 200
        assert (await response.json())["size"] == len(body)
    uri = store.uri_for("outputs/t/1/attempt-1.jsonl")
    assert await collect(store.read(uri)) == body
    # A chunked (unknown-length) upload works too.
    async with session.put(url, data=stream_of(b"one\n", b"two\n")) as response:
        assert response.status == 200
    assert await collect(store.read(uri)) == b"one\ntwo\n"


async def test_signed_url_refusals(served: tuple[SignedLocalStore, aiohttp.ClientSession]) -> None:
    store, session = served
    uri = await store.put_bytes("inputs/data.bin", DATA)
    get_url = await store.presign_get(uri, 60)
    put_url = await store.presign_put("inputs/data.bin", 60)

    async def refused(method: str, url: str | yarl.URL, code: str = "bad_signature") -> None:
        async with session.request(method, url, data=b"evil" if method == "PUT" else None) as response:
            assert response.status == 403, url
            assert (await response.json())["error"]["code"] == code

    sig = parse_qs(urlsplit(get_url).query)["sig"][0]
    tampered = get_url.replace(sig, ("0" if sig[0] != "0" else "1") + sig[1:])
    await refused("GET", tampered)
    await refused("GET", get_url.replace("inputs/data.bin", "inputs/other.bin"))
    await refused("GET", get_url.split("?")[0])  # no signature at all
    await refused("PUT", get_url)  # a GET URL is no PUT URL
    await refused("GET", put_url)
    await refused("GET", str(store.base_url) + "/api/v1/store/..%2Fescape?method=GET&expires=1&sig=00")
    expires = int(time.time()) - 1
    expired = (f"{store.base_url}/api/v1/store/inputs/data.bin?method=GET&expires={expires}"
               f"&sig={signing.signature(KEY, 'GET', 'inputs/data.bin', expires)}")
    await refused("GET", expired, code="url_expired")
    expired_put = (f"{store.base_url}/api/v1/store/inputs/data.bin?method=PUT&expires={expires}"
                   f"&sig={signing.signature(KEY, 'PUT', 'inputs/data.bin', expires)}")
    await refused("PUT", expired_put, code="url_expired")
    assert await collect(store.read(uri)) == DATA  # no refused PUT wrote anything


async def test_truncated_upload_is_not_committed(served: tuple[SignedLocalStore, aiohttp.ClientSession]) -> None:
    store, _ = served
    url = urlsplit(await store.presign_put("outputs/cut.jsonl", 60))
    assert url.hostname is not None and url.port is not None
    _, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write(f"PUT {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                 f"Content-Length: 100000\r\n\r\n".encode() + b"x" * 5000)
    await writer.drain()
    assert await eventually(lambda: bool(temp_files(store.root)))  # the upload has begun
    writer.close()  # the client dies mid-upload
    await writer.wait_closed()
    assert await eventually(lambda: not temp_files(store.root))
    assert await store.size(store.uri_for("outputs/cut.jsonl")) is None
    assert temp_files(store.root) == []


async def test_routes_404_without_local_store() -> None:
    app = web.Application()
    add_routes(app)
    app[STORE] = S3Store("s3://bucket/prefix", "http://127.0.0.1:9")
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session, session.get(server.make_url("/api/v1/store/a")) as r:
            assert r.status == 404
    finally:
        await server.close()


# --- factory ---------------------------------------------------------------------------------------

async def test_open_store(tmp_path: Path) -> None:
    folder = tmp_path / "by-uri"
    store = open_store(folder.as_uri())
    assert isinstance(store, LocalStore) and folder.is_dir()
    plain = open_store(str(tmp_path / "plain" / "deep"))
    assert isinstance(plain, LocalStore) and (tmp_path / "plain" / "deep").is_dir()
    s3 = open_store("s3://bucket/some/prefix/", s3_endpoint_url="http://s3:9000")
    assert isinstance(s3, S3Store)
    assert s3.root_uri == "s3://bucket/some/prefix"
    assert s3.uri_for("inputs/a") == "s3://bucket/some/prefix/inputs/a"
    assert s3.endpoint_url == "http://s3:9000"
    for bad in ["gs://bucket/x", "http://host/x", "", "file://host/x"]:
        with pytest.raises(ValueError):
            open_store(bad)


def test_parse_s3_uri() -> None:
    assert parse_s3_uri("s3://b/k/x.jsonl") == ("b", "k/x.jsonl")
    for bad in ["s3://b", "s3://b/", "s3:///k", "file:///x", "s3://b/k?x=1"]:
        with pytest.raises(InvalidKey):
            parse_s3_uri(bad)


# --- S3 (moto server) ------------------------------------------------------------------------------

BUCKET = "minions-test"


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    with moto_server(BUCKET) as endpoint:
        yield endpoint


@pytest_asyncio.fixture
async def s3(moto_endpoint: str) -> AsyncIterator[S3Store]:
    store = S3Store(f"s3://{BUCKET}/prefix", moto_endpoint)
    yield store
    await store.close()


def etag(endpoint: str, key: str) -> str:
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    return str(client.head_object(Bucket=BUCKET, Key=key)["ETag"])


async def test_s3_put_bytes_read_size(s3: S3Store) -> None:
    uri = await s3.put_bytes("inputs/a.bin", DATA)
    assert uri == f"s3://{BUCKET}/prefix/inputs/a.bin"
    assert s3.readable(uri) and s3.readable("s3://another-bucket/any/key")
    assert not s3.readable("file:///x")
    assert await s3.size(uri) == len(DATA)
    assert await collect(s3.read(uri)) == DATA
    assert await collect(s3.read(uri, 100, 300)) == DATA[100:300]
    assert await collect(s3.read(uri, 255_000)) == DATA[255_000:]
    assert await collect(s3.read(uri, len(DATA))) == b""
    assert await collect(s3.read(uri, 3, 3)) == b""
    assert await s3.read_bytes(uri, 100, 300) == DATA[100:300]


async def test_s3_missing(s3: S3Store) -> None:
    missing = s3.uri_for("nope/none.bin")
    assert await s3.size(missing) is None
    with pytest.raises(ObjectNotFound):
        await collect(s3.read(missing))
    with pytest.raises(ObjectNotFound):
        await s3.read_bytes(missing, 0, 10)
    await s3.delete(missing)
    uri = await s3.put_bytes("gone.bin", b"x")
    await s3.delete(uri)
    assert await s3.size(uri) is None


async def test_s3_put_stream_small_is_one_put(s3: S3Store, moto_endpoint: str) -> None:
    uri, size = await s3.put_stream("outputs/small.jsonl", stream_of(b"a\n", b"b\n"))
    assert (uri, size) == (s3.uri_for("outputs/small.jsonl"), 4)
    assert await collect(s3.read(uri)) == b"a\nb\n"
    assert "-" not in etag(moto_endpoint, "prefix/outputs/small.jsonl")
    uri, size = await s3.put_stream("outputs/empty", stream_of())
    assert size == 0 and await s3.size(uri) == 0
    assert await collect(s3.read(uri)) == b""


async def test_s3_put_stream_multipart(s3: S3Store, moto_endpoint: str) -> None:
    total = 20 * 1024 * 1024 + 12345
    blob = os.urandom(total)

    async def chunks() -> AsyncIterator[bytes]:
        for offset in range(0, total, 1_000_000):  # chunk size unrelated to the part size
            yield blob[offset:offset + 1_000_000]

    uri, size = await s3.put_stream("outputs/big.bin", chunks())
    assert size == total
    assert await s3.size(uri) == total
    assert etag(moto_endpoint, "prefix/outputs/big.bin").strip('"').endswith("-3")  # 8 + 8 + 4 MiB parts
    # Across the first part boundary.
    assert await collect(s3.read(uri, PART_SIZE - 10, PART_SIZE + 10)) == blob[PART_SIZE - 10:PART_SIZE + 10]
    digest = hashlib.sha256()
    async for chunk in s3.read(uri):
        digest.update(chunk)
    assert digest.digest() == hashlib.sha256(blob).digest()


async def test_s3_failed_multipart_is_aborted(s3: S3Store, moto_endpoint: str) -> None:
    async def broken() -> AsyncIterator[bytes]:
        yield b"x" * (PART_SIZE + 1)
        raise ConnectionResetError("gone")

    with pytest.raises(ConnectionResetError):
        await s3.put_stream("outputs/broken.bin", broken())
    assert await s3.size(s3.uri_for("outputs/broken.bin")) is None
    uploads = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").list_multipart_uploads(
        Bucket=BUCKET, Prefix="prefix/outputs/broken.bin")
    assert not uploads.get("Uploads")


async def test_s3_presigned_get_with_range(s3: S3Store) -> None:
    uri = await s3.put_bytes("inputs/ranged.bin", DATA)
    url = await s3.presign_get(uri, 300)
    async with aiohttp.ClientSession() as session:
        # encoded=True: aiohttp must not re-encode the signature's %2F.
        async with session.get(yarl.URL(url, encoded=True), headers={"Range": "bytes=1000-1999"}) as response:
            assert response.status == 206
            assert response.headers["Content-Range"] == f"bytes 1000-1999/{len(DATA)}"
            assert await response.read() == DATA[1000:2000]


async def test_s3_input_url_signs_its_range(s3: S3Store) -> None:
    uri = await s3.put_bytes("inputs/scoped.bin", DATA)
    url = await s3.presign_input(uri, 1000, 2000, uuid.uuid4(), 180)
    query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    # The Range header is signed (S3 refuses a request without it, or with another: moto checks no
    # signature, so this is asserted on the URL), and the URL lives as long as asked.
    assert query["X-Amz-SignedHeaders"] == "host;range"
    assert query["X-Amz-Expires"] == "180"
    async with aiohttp.ClientSession() as session, session.get(
            yarl.URL(url, encoded=True), headers={"Range": "bytes=1000-1999"}) as response:
        assert response.status == 206
        assert await response.read() == DATA[1000:2000]


async def test_s3_presigned_put(s3: S3Store) -> None:
    url = await s3.presign_put("outputs/t/1/attempt-1.jsonl", 300)
    body = b'{"id": "a1", "text": "hi"}\n' * 1000
    async with aiohttp.ClientSession() as session, session.put(yarl.URL(url, encoded=True), data=body) as r:
        assert r.status == 200
    assert await collect(s3.read(s3.uri_for("outputs/t/1/attempt-1.jsonl"))) == body


async def test_s3_presign_limits(s3: S3Store) -> None:
    with pytest.raises(StoreError):
        await s3.presign_put("x", 8 * 24 * 3600)
    with pytest.raises(InvalidKey):
        await s3.presign_put("../x", 60)


async def test_local_concurrent_small_writes_land_each_and_fail_alone(local: LocalStore) -> None:
    await local.put_bytes("taken/file", b"x")  # a file where the next key wants a folder
    keys = [f"results/{i}.jsonl" for i in range(20)]
    outcomes = await asyncio.gather(*(local.put_bytes(k, k.encode()) for k in keys),
                                    local.put_bytes("taken/file/child", b"y"), return_exceptions=True)
    assert outcomes[:20] == [local.uri_for(k) for k in keys]
    assert isinstance(outcomes[20], StoreError)
    for k in keys:
        assert await local.read_bytes(local.uri_for(k), 0, 100) == k.encode()
    # Nothing half-written is left behind, and later writes go through as well.
    assert not [p for p in local.root.rglob("*.tmp")]
    assert await local.put_bytes("results/late.jsonl", b"z") == local.uri_for("results/late.jsonl")

"""Google Cloud Storage objects (``gs://bucket/object``) through ``RemoteFile.open``,
``read_file_to_device``, ``load_checkpoint`` and ``RemotePrefix``, against a GCS stand-in on
127.0.0.1 (the requests of object_store's GCS client: HEAD and ranged GETs of
``/bucket/object``, the object's name percent-encoded, and listings), which ``GOOGLE_BASE_URL``
points the client at: signed with a bearer token, unsigned for public objects; byte for
byte."""

from __future__ import annotations

import http.server
import os
import threading
import urllib.parse

import numpy as np
import pytest

import gpumapio
from conftest import LoopbackServer
from gpumapio import RemoteFile
from gpumapio.remote_file import RemoteEndpointType as Kind
from gpumapio.remote_file import infer_remote_endpoint_type

TOKEN = "gcs-test-token"


class _Gcs(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def _reply(self, status, headers=(), body=b""):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _object(self):
        path = urllib.parse.unquote(self.path.split("?")[0])
        auth = self.headers.get("Authorization")
        self.server.requests.append((path, auth is not None))
        if auth != f"Bearer {TOKEN}" and path not in self.server.public:
            self._reply(401, body=b"<Error><Code>AccessDenied</Code></Error>")
            return None
        data = self.server.objects.get(path)
        if data is None:
            self._reply(404, body=b"<Error><Code>NoSuchKey</Code></Error>")
        return data

    def _meta(self, length):
        return [("ETag", '"gcs-etag-1"'), ("Last-Modified", "Tue, 24 Nov 2026 12:00:00 GMT"),
                ("Content-Length", str(length))]

    def do_HEAD(self):
        data = self._object()
        if data is not None:
            self.send_response(200)
            for name, value in self._meta(len(data)):
                self.send_header(name, value)
            self.end_headers()

    def _listing(self, bucket, query):
        """A ListObjectsV2 page (GCS's XML API answers S3's): every key under ``prefix``, the
        levels below ``delimiter`` as common prefixes, all in one page."""
        prefix, delimiter = query.get("prefix", [""])[0], query.get("delimiter", [""])[0]
        keys, levels = [], set()
        for path in sorted(self.server.objects):
            key = path.removeprefix(f"/{bucket}/")
            if path == key or not key.startswith(prefix):
                continue
            rest = key[len(prefix):]
            if delimiter and delimiter in rest:
                levels.add(prefix + rest.split(delimiter, 1)[0] + delimiter)
            else:
                keys.append(key)
        contents = "".join(
            f"<Contents><Key>{k}</Key><Size>{len(self.server.objects[f'/{bucket}/{k}'])}</Size>"
            "<LastModified>2026-11-24T12:00:00.000Z</LastModified><ETag>\"e\"</ETag></Contents>"
            for k in keys)
        common = "".join(f"<CommonPrefixes><Prefix>{p}</Prefix></CommonPrefixes>" for p in sorted(levels))
        body = (f"<?xml version='1.0' encoding='UTF-8'?><ListBucketResult><Name>{bucket}</Name>"
                f"<Prefix>{prefix}</Prefix><KeyCount>{len(keys)}</KeyCount><IsTruncated>false</IsTruncated>"
                f"{contents}{common}</ListBucketResult>").encode()
        self._reply(200, [("Content-Type", "application/xml")], body)

    def do_GET(self):
        path, _, query = self.path.partition("?")
        path, query = urllib.parse.unquote(path), urllib.parse.parse_qs(query)
        if "list-type" in query:
            self.server.requests.append((path, self.headers.get("Authorization") is not None))
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self._reply(401, body=b"<Error><Code>AccessDenied</Code></Error>")
                return
            self._listing(path.strip("/"), query)
            return
        data = self._object()
        if data is None:
            return
        start, end = self.headers["Range"].removeprefix("bytes=").split("-")
        start, end = int(start), min(int(end), len(data) - 1)
        body = data[start:end + 1]
        self.send_response(206)
        for name, value in self._meta(len(body)):
            self.send_header(name, value)
        self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def gcs(monkeypatch, tmp_path):
    """The stand-in, the client pointed at it, no Google credentials anywhere, and no metadata
    server."""
    srv = LoopbackServer(("127.0.0.1", 0), _Gcs)
    srv.objects, srv.public, srv.requests = {}, set(), []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    for name in ["GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH",
                 "GOOGLE_SERVICE_ACCOUNT_KEY", "GOOGLE_BEARER_TOKEN", "SERVICE_ACCOUNT"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GOOGLE_BASE_URL", f"http://127.0.0.1:{srv.server_address[1]}")
    # A signed try with no credentials asks the metadata server: here a port that refuses at
    # once, not a name to resolve on a machine without a network.
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    yield srv
    srv.shutdown()
    srv.server_close()


def test_public_and_private_objects_are_read_byte_for_byte(gcs, monkeypatch, rng):
    data = rng.integers(0, 256, size=300_007, dtype="u1").tobytes()
    gcs.objects["/gpumap-bkt/pub/a b.bin"] = data
    gcs.objects["/gpumap-bkt/private/w.bin"] = data
    gcs.public.add("/gpumap-bkt/pub/a b.bin")
    assert infer_remote_endpoint_type("gs://gpumap-bkt/pub/a%20b.bin") is Kind.GCS
    # No credentials: unsigned, and no request carried any.
    f = RemoteFile.open("gs://gpumap-bkt/pub/a%20b.bin", request_size=65_536)
    assert f.remote_endpoint_type() is Kind.GCS_PUBLIC
    assert f.url == "gs://gpumap-bkt/pub/a%20b.bin"
    out = np.empty(len(data) - 3, dtype="u1")
    assert f.read(out, file_offset=3) == out.size
    assert out.tobytes() == data[3:]
    assert gcs.requests and not any(signed for _, signed in gcs.requests)
    with pytest.raises(PermissionError) as info:
        RemoteFile.open("gs://gpumap-bkt/private/w.bin", http_max_attempts=1)
    assert info.value.status == 401
    # With a token: signed, a private object read, and the token in no message.
    monkeypatch.setenv("GOOGLE_BEARER_TOKEN", TOKEN)
    f = RemoteFile.open("gs://gpumap-bkt/private/w.bin")
    assert f.remote_endpoint_type() is Kind.GCS
    futures = [f.pread(out[i:i + 1000], 1000, i) for i in range(0, 100_000, 1000)]
    assert sum(fut.get() for fut in futures) == 100_000
    assert out[:100_000].tobytes() == data[:100_000]
    with pytest.raises(FileNotFoundError) as info:
        RemoteFile.open("gs://gpumap-bkt/missing.bin")
    assert "gs://gpumap-bkt/missing.bin" in str(info.value) and TOKEN not in str(info.value)
    with pytest.raises(ValueError):
        RemoteFile.open("gs://Bad_Bucket/x")


def test_a_checkpoint_and_a_read_come_from_gs_urls(gcs, monkeypatch, tmp_path, rng):
    pytest.importorskip("safetensors.numpy")
    from test_checkpoint import _model, _same, _save_sharded

    tensors = _model(rng)
    directory = _save_sharded(tensors, str(tmp_path / "ckpt"))
    for name in os.listdir(directory):
        with open(os.path.join(directory, name), "rb") as f:
            gcs.objects[f"/gpumap-bkt/ckpt/{name}"] = f.read()
    monkeypatch.setenv("GOOGLE_BEARER_TOKEN", TOKEN)
    got = gpumapio.load_checkpoint("gs://gpumap-bkt/ckpt/model.safetensors.index.json", "cpu", framework="numpy")
    assert set(got) == set(tensors)
    for name, array in got.items():
        _same(array, tensors[name])
    # By its prefix, listed as a directory is.
    listed_before = sum(1 for path, _ in gcs.requests if path == "/gpumap-bkt")
    got = gpumapio.load_checkpoint("gs://gpumap-bkt/ckpt/", "cpu", framework="numpy")
    assert set(got) == set(tensors)
    for name, array in got.items():
        _same(array, tensors[name])
    assert sum(1 for path, _ in gcs.requests if path == "/gpumap-bkt") > listed_before
    prefix = gpumapio.RemotePrefix("gs://gpumap-bkt/ckpt/")
    assert not prefix.unsigned and prefix.url == "gs://gpumap-bkt/ckpt/"
    assert sorted(name for name, _ in prefix.list()) == sorted(os.listdir(directory))
    index = gcs.objects["/gpumap-bkt/ckpt/model.safetensors.index.json"]
    read = gpumapio.read_file_to_device("gs://gpumap-bkt/ckpt/model.safetensors.index.json", offset=7, output="numpy")
    assert read.tobytes() == index[7:]

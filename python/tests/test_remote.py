"""gpumapio.RemoteFile against servers on 127.0.0.1 only: a range server (conftest.py; faults
injected: 503s, stalls, bodies cut short), moto's S3 server and a WebHDFS namenode (below);
byte for byte against the source bytes."""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
import urllib.parse

import numpy as np
import pytest

import gpumapio
from conftest import LoopbackServer, ReplyingHandler
from gpumapio import RemoteFile

from conftest import need_gpu


@pytest.fixture
def served(server, rng):
    data = rng.integers(0, 256, size=(2 << 20) + 4099, dtype="u1").tobytes()
    server.objects["/data/object.bin"] = data
    return server, f"{server.url}/data/object.bin", data


def test_http_reads_are_byte_exact_at_odd_offsets(served):
    _, url, data = served
    with RemoteFile.open_http(url, request_size=65537, max_in_flight=8) as f:
        assert f.nbytes() == len(data)
        assert f.url == url
        for offset, size in [(0, len(data)), (1, 4095), (4095, 3 * 65537 + 1), (len(data) - 1, 1)]:
            out = np.zeros(size, dtype="u1")
            assert f.read(out, size, offset) == size
            assert out.tobytes() == data[offset : offset + size]
        # size defaults to the buffer's; pread returns a future.
        out = bytearray(100_000)
        futures = [f.pread(memoryview(out)[i * 50_000 : (i + 1) * 50_000], None, i * 70_000) for i in range(2)]
        assert [fut.get() for fut in futures] == [50_000, 50_000]
        assert bytes(out[:50_000]) == data[:50_000]
        assert bytes(out[50_000:]) == data[70_000:120_000]


def test_thousands_of_preads_of_several_requests_each_complete(served):
    # Each pread is four requests, run on the I/O pool and shared among the read lanes. A
    # pool thread waiting for its lanes once ran the pool's other queued preads meanwhile,
    # each waiting in turn, until its stack overflowed (a segfault at about 2,000 preads).
    _, url, data = served
    count, size = 3000, 16 << 10
    out = np.zeros((count, size), dtype="u1")
    offsets = [(i * 7919) % (len(data) - size) for i in range(count)]
    with RemoteFile.open_http(url, request_size=4096, max_in_flight=8) as f:
        futures = [f.pread(out[i], size, offset) for i, offset in enumerate(offsets)]
        assert [fut.get() for fut in futures] == [size] * count
    for i in range(0, count, 97):
        assert out[i].tobytes() == data[offsets[i] : offsets[i] + size]


def test_kvikio_constructors_agree(served):
    _, url, data = served
    for f in [RemoteFile.open(url), RemoteFile.open_s3_presigned_url(url), RemoteFile.open_http(url, nbytes=len(data))]:
        out = np.empty(1000, dtype="u1")
        f.read(out, file_offset=123)
        assert out.tobytes() == data[123:1123]
        assert f.nbytes() == len(data)


def test_open_checks_the_endpoint_type(served, monkeypatch):
    _, url, data = served
    kinds = gpumapio.RemoteEndpointType
    assert RemoteFile.open(url, kinds.HTTP).nbytes() == len(data)
    assert RemoteFile.open(url, kinds.AUTO, [kinds.HTTP], len(data)).nbytes() == len(data)
    presigned = url + "?X-Amz-Signature=abc"
    assert RemoteFile.open(presigned, kinds.S3_PRESIGNED_URL).nbytes() == len(data)
    assert RemoteFile.open(presigned, allow_list=[kinds.HTTP]).nbytes() == len(data)
    for kind in [kinds.S3, kinds.WEBHDFS, kinds.S3_PUBLIC]:
        with pytest.raises(ValueError, match="not a"):
            RemoteFile.open(url, kind)
    with pytest.raises(ValueError, match="allow list"):
        RemoteFile.open(url, allow_list=[kinds.S3])
    with pytest.raises(ValueError, match="not a S3 endpoint"):
        RemoteFile.open(url, "s3")


def test_503s_are_retried_then_reported(served):
    server, url, data = served
    f = RemoteFile.open_http(url, http_max_attempts=3)
    server.faults[:] = [503, 503]
    out = np.empty(10_000, dtype="u1")
    assert f.read(out) == 10_000
    assert out.tobytes() == data[:10_000]
    server.faults[:] = [503, 503, 503]
    with pytest.raises(OSError) as info:
        f.read(out)
    assert info.value.status == 503 and info.value.url == url
    assert "after 3 attempts" in str(info.value)
    # Not among the retried codes: at once.
    f = RemoteFile.open_http(url, http_status_codes=[503])
    server.faults[:] = [500]
    before = server.gets
    with pytest.raises(OSError, match="500"):
        f.read(out)
    assert server.gets - before == 1


@pytest.mark.parametrize("codes, shown", [([99999], "99999"), ([-1], "-1"), ([True], "True"), ([503.0], "503.0"), ([600], "600")])
def test_status_codes_that_are_not_statuses_are_named(served, codes, shown):
    _, url, _ = served
    with pytest.raises(ValueError, match=f"{re.escape(shown)} is not an HTTP status code"):
        RemoteFile.open_http(url, http_status_codes=codes)
    with pytest.raises(TypeError, match="http_status_codes has incorrect type"):
        RemoteFile.open_http(url, http_status_codes=503)


def test_retry_settings_come_from_the_defaults_when_not_given(served):
    server, url, data = served
    out = np.empty(10_000, dtype="u1")
    # One attempt from the defaults: the first 503 is the answer, and it is also the
    # RuntimeError that code written for KvikIO catches.
    with gpumapio.defaults.set("http_max_attempts", 1):
        f = RemoteFile.open_http(url)
    server.faults[:] = [503]
    before = server.gets
    with pytest.raises(RuntimeError) as info:
        f.read(out)
    assert isinstance(info.value, OSError) and info.value.status == 503
    assert server.gets - before == 1
    # 500 retried only where the defaults list it; the defaults take any int, as KvikIO's do,
    # and one that is no HTTP status matches no answer (it once failed every open).
    with gpumapio.defaults.set({"http_max_attempts": 2, "http_status_codes": [99999, 500, -1]}):
        f = RemoteFile.open_http(url)
    server.faults[:] = [500]
    assert f.read(out) == 10_000 and out.tobytes() == data[:10_000]
    # An explicit keyword wins over the defaults.
    with gpumapio.defaults.set("http_max_attempts", 1):
        f = RemoteFile.open_http(url, http_max_attempts=2)
    server.faults[:] = [503]
    assert f.read(out) == 10_000


def test_timeouts_and_broken_bodies_are_errors(served):
    server, url, _ = served
    f = RemoteFile.open_http(url, http_timeout=0.3, http_max_attempts=1)
    server.faults[:] = [3.0]
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        f.read(np.empty(100, dtype="u1"))
    assert time.monotonic() - start < 2.5
    server.faults[:] = ["truncate"]
    with pytest.raises(ConnectionError):
        f.read(np.empty(100_000, dtype="u1"))


def test_missing_objects_bad_urls_and_closed_files(served):
    server, url, _ = served
    with pytest.raises(FileNotFoundError) as info:
        RemoteFile.open(f"{server.url}/nope.bin?X-Amz-Signature=topsecret")
    assert info.value.status == 404 and "topsecret" not in str(info.value)
    assert isinstance(info.value, RuntimeError)
    for bad in ["ftp://h/x", "s3://bucket", "https://u:pw@h/x", "http://h/a\r\nX: y"]:
        with pytest.raises(ValueError):
            RemoteFile.open(bad)
    # An http(s) URL is an S3 object's to open_s3_url, path style: one without a key is not.
    with pytest.raises(ValueError, match="names a bucket but no key"):
        RemoteFile.open_s3_url(f"{server.url}/bucket-only")
    with pytest.raises(ValueError):
        RemoteFile.open_http("s3://bucket/key")
    f = RemoteFile.open(url)
    with pytest.raises(ValueError):
        f.read(np.empty(10, dtype="u1"), 10, f.nbytes() - 5)
    f.close()
    with pytest.raises(ValueError, match="closed"):
        f.nbytes()


def test_reads_release_the_gil(served):
    server, url, _ = served
    f = RemoteFile.open_http(url)
    server.faults[:] = [0.5]
    started, done = threading.Event(), threading.Event()

    def read():
        started.set()
        f.read(np.empty(1000, dtype="u1"))
        done.set()

    reader = threading.Thread(target=read)
    reader.start()
    started.wait()
    spins = 0
    while not done.is_set():
        spins += 1
    reader.join()
    # The read waits half a second on the server; had it held the GIL, this thread would
    # have had no turn meanwhile.
    assert spins > 100_000


def test_read_file_to_device_takes_urls(served):
    _, url, data = served
    out = gpumapio.read_file_to_device(url, offset=10, size=5000, output="numpy")
    assert out.tobytes() == data[10:5010]


def test_s3_through_moto(moto_s3, monkeypatch):
    endpoint, data, _ = moto_s3
    files = [
        RemoteFile.open_s3("gpumap-bucket", "dir/object.bin", aws_endpoint_url=endpoint, request_size=100_000),
        RemoteFile.open_s3_url("s3://gpumap-bucket/dir/object.bin", aws_endpoint_url=endpoint),
    ]
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    files.append(RemoteFile.open("s3://gpumap-bucket/dir/object.bin"))
    for f in files:
        assert f.nbytes() == len(data)
        out = np.empty(len(data) - 77, dtype="u1")
        assert f.read(out, file_offset=77) == len(out)
        assert out.tobytes() == data[77:]
    with pytest.raises(FileNotFoundError):
        RemoteFile.open("s3://gpumap-bucket/missing.bin")
    # S3's error code and message, not the first line of its XML (`<?xml ...?>`).
    w = gpumapio.RemoteWriter("s3://no-such-bucket/x.bin")
    w.write(b"x")
    with pytest.raises(OSError, match="NoSuchBucket"):
        w.finish()
    out = gpumapio.read_file_to_device("s3://gpumap-bucket/dir/object.bin", output="numpy")
    assert out.tobytes() == data


def test_reads_into_gpu_memory(served):
    cupy = need_gpu("cupy")
    _, url, data = served
    f = RemoteFile.open_http(url, request_size=(1 << 20) + 1)
    out = cupy.empty(len(data) - 9, dtype=cupy.uint8)
    assert f.read(out, file_offset=9) == len(out)
    assert cupy.asnumpy(out).tobytes() == data[9:]
    out[:] = 0
    assert f.pread(out, file_offset=0).get() == len(out)
    assert cupy.asnumpy(out).tobytes() == data[: len(out)]
    got = gpumapio.read_file_to_device(url, output="cupy")
    assert cupy.asnumpy(got).tobytes() == data
    # Small reads into views of one array, all started at once: each a task of the remote
    # runtime, taking turns within the file's requests in flight.
    f = RemoteFile.open_http(url, max_in_flight=3)
    offsets = [(k * 7919 * 13) % (len(data) - 5000) for k in range(64)]
    many = cupy.zeros(64 * 5000, dtype=cupy.uint8)
    futures = [f.pread(many[k * 5000 : (k + 1) * 5000], file_offset=o) for k, o in enumerate(offsets)]
    assert [x.get() for x in futures] == [5000] * 64
    host = cupy.asnumpy(many).tobytes()
    for k, o in enumerate(offsets):
        assert host[k * 5000 : (k + 1) * 5000] == data[o : o + 5000], k


class _WebHdfsHandler(ReplyingHandler):
    """A WebHDFS namenode and datanode in one: ``GETFILESTATUS`` and ``OPEN`` (redirected once,
    as a namenode does, to the same path with ``datanode=true``)."""

    def do_GET(self):
        path, _, query = self.path.partition("?")
        params = dict(urllib.parse.parse_qsl(query))
        self.server.requests.append(params)
        data = self.server.files.get(path)
        if data is None:
            return self.reply(404, b'{"RemoteException":{"exception":"FileNotFoundException"}}')
        if params.get("op") == "GETFILESTATUS":
            return self.reply(200, json.dumps({"FileStatus": {"length": len(data), "type": "FILE"}}).encode())
        if params.get("op") == "OPEN" and "datanode" not in params:
            return self.reply(307, headers=[("Location", f"{path}?{query}&datanode=true")])
        if params.get("op") == "OPEN":
            offset, length = int(params["offset"]), int(params["length"])
            return self.reply(200, data[offset : offset + length])
        self.reply(400)


@pytest.fixture
def webhdfs(rng):
    srv = LoopbackServer(("127.0.0.1", 0), _WebHdfsHandler)
    srv.files = {"/webhdfs/v1/user/me/data.bin": rng.integers(0, 256, size=(1 << 20) + 77, dtype="u1").tobytes()}
    srv.requests = []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}/webhdfs/v1/user/me/data.bin?user.name=me"
    srv.shutdown()
    srv.server_close()


def test_webhdfs_files_read_as_kvikio_reads_them(webhdfs):
    srv, url = webhdfs
    data = srv.files["/webhdfs/v1/user/me/data.bin"]
    kinds = gpumapio.RemoteEndpointType
    for f in [RemoteFile.open_webhdfs(url, request_size=100_000), RemoteFile.open(url), RemoteFile.open(url, kinds.WEBHDFS)]:
        assert f.nbytes() == len(data)
        out = np.empty(300_001, dtype="u1")
        assert f.read(out, file_offset=77) == out.size
        assert out.tobytes() == data[77 : 77 + out.size]
        assert "me" not in f.url.split("?")[-1]
    # Every request carried the URL's own user.name; reads went through the redirect.
    assert all(r.get("user.name") == "me" for r in srv.requests)
    assert any(r.get("datanode") == "true" for r in srv.requests)
    with pytest.raises(FileNotFoundError, match="missing"):
        RemoteFile.open_webhdfs(url.replace("data.bin", "missing.bin"))
    with pytest.raises(ValueError, match="WebHDFS"):
        RemoteFile.open_webhdfs(url.replace("/webhdfs/v1", ""))

"""Shared fixtures. GPU tests skip visibly (reason in pytest's -rs summary) without a GPU,
CuPy or PyTorch, and fail instead when GPUMAP_REQUIRE_GPU=1."""

from __future__ import annotations

import http.server
import importlib
import os
import threading
import time

import pytest

import gpumapio

REQUIRE_GPU = os.environ.get("GPUMAP_REQUIRE_GPU") == "1"


def _skip_or_fail(reason: str):
    if REQUIRE_GPU:
        pytest.fail(f"GPUMAP_REQUIRE_GPU=1 but {reason}")
    pytest.skip(reason)


def need_gpu(module: str | None = None):
    """GPU 0 and, if named, the module (``cupy`` or ``torch``) with CUDA; skips or fails."""
    if gpumapio.gpu_count() == 0:
        _skip_or_fail(f"no GPU: {gpumapio.capabilities()['cuda_reason']}")
    if module is None:
        return None
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        _skip_or_fail(f"{module} does not import: {e}")
    if module == "torch" and not mod.cuda.is_available():
        _skip_or_fail("torch has no CUDA here")
    return mod


def need_cufile():
    """cuFile usable here (driver, library, udev); skips or, under GPUMAP_REQUIRE_CUFILE=1, fails."""
    caps = gpumapio.capabilities()
    if not caps["cufile_usable"]:
        reason = f"cuFile unusable: {caps['cufile_reason']}"
        if os.environ.get("GPUMAP_REQUIRE_CUFILE") == "1":
            pytest.fail(f"GPUMAP_REQUIRE_CUFILE=1 but {reason}")
        pytest.skip(reason)


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(20261122)


@pytest.fixture
def data_file(tmp_path, rng):
    """A file of 3 MiB + 4099 random bytes (odd on purpose) and its contents."""
    data = rng.integers(0, 256, size=(3 << 20) + 4099, dtype="u1").tobytes()
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    return path, data


@pytest.fixture(autouse=True)
def _restore_defaults():
    """Every test starts and ends with the same settings."""
    names = ["compat_mode", "num_threads", "task_size", "gds_threshold", "bounce_buffer_size",
             "auto_direct_io_read", "auto_direct_io_write", "http_max_attempts", "http_status_codes",
             "http_timeout"]
    saved = {n: gpumapio.defaults.get(n) for n in names}
    yield
    gpumapio.defaults.set(saved)


class ReplyingHandler(http.server.BaseHTTPRequestHandler):
    """A quiet HTTP/1.1 handler of the tests' servers, with one way to answer."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body=b"", headers=()):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def refused_not_waited_on(fifo, call, what):
    """Runs ``call()``, which opens the FIFO ``fifo``, on a thread of its own, and returns what
    it raised; fails the test (after letting the stuck open return) where it waited instead."""
    result: list[BaseException | None] = []

    def attempt():
        try:
            call()
            result.append(None)
        except BaseException as e:  # noqa: BLE001 - returned to the test
            result.append(e)

    worker = threading.Thread(target=attempt, daemon=True)  # a hang must not hold up pytest
    worker.start()
    worker.join(10)
    if worker.is_alive():
        with open(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK), "wb"):
            pass  # let the stuck open return, then fail
        pytest.fail(f"{what} waited on a FIFO")
    return result[0]


# A ranged-GET HTTP server on 127.0.0.1 (remote-file tests): objects by path, and faults to
# inject per GET (an int status, a float delay in seconds, or "truncate").
class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # A head and a body written apart would wait for the client's delayed ACK (40 ms) each.
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def _object(self):
        data = self.server.objects.get(self.path.split("?")[0])
        if data is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
        return data

    def do_HEAD(self):
        data = self._object()
        if data is not None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()

    def do_GET(self):
        self.server.gets += 1
        fault = self.server.faults.pop(0) if self.server.faults else None
        if isinstance(fault, int):
            self.send_response(fault)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if isinstance(fault, float):
            time.sleep(fault)
        data = self._object()
        if data is None:
            return
        start, end = self.headers["Range"].removeprefix("bytes=").split("-")
        start, end = int(start), min(int(end), len(data) - 1)
        body = data[start : end + 1]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if fault == "truncate":
            self.wfile.write(body[: len(body) // 2])
            self.close_connection = True
            return
        self.wfile.write(body)


class LoopbackServer(http.server.ThreadingHTTPServer):
    """The base of every stand-in server in the tests.

    A load opens dozens of connections at once (a strided piece is a ranged GET per run);
    socketserver's listen backlog of 5 drops their SYNs on a busy machine, and a connect then
    times out (ETIMEDOUT), which is final, not retried.
    """

    request_queue_size = 1024
    daemon_threads = True


@pytest.fixture
def server():
    """The server: ``objects`` (path -> bytes), ``faults``, ``gets`` (count), ``url``."""
    srv = LoopbackServer(("127.0.0.1", 0), _Handler)
    srv.objects, srv.faults, srv.gets = {}, [], 0
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()



@pytest.fixture
def moto_s3(monkeypatch):
    """moto's S3 server on 127.0.0.1 with one object (``gpumap-bucket/dir/object.bin``), its
    endpoint and the object's bytes, credentials in the environment, and ``put(key, bytes)``
    to add objects; skipped where moto or boto3 does not import."""
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    for name, value in [("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1")]:
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    srv.start()
    host, port = srv.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    import numpy as np

    data = np.random.default_rng(7).integers(0, 256, size=(1 << 20) + 333, dtype="u1").tobytes()
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="gpumap-bucket")
    client.put_object(Bucket="gpumap-bucket", Key="dir/object.bin", Body=data)
    srv.put = lambda key, body: client.put_object(Bucket="gpumap-bucket", Key=key, Body=body)
    yield endpoint, data, srv.put
    srv.stop()

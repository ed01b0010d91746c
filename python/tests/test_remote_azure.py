"""Azure Blob Storage blobs (``az://container/blob``) through ``RemoteFile.open``,
``read_file_to_device``, ``load_checkpoint``, ``RemotePrefix``, ``RemoteWriter`` and the Zarr
store, against an Azure Blob stand-in on 127.0.0.1 that speaks what object_store's Azure client
sends (``AZURE_STORAGE_ENDPOINT`` points the client at it, so requests go to
``/{container}/{blob}``, the blob's name percent-encoded):

- HEAD and ranged GETs of blobs, each answer with ``ETag`` and ``Last-Modified``;
- List Blobs (``?restype=container&comp=list``), paged with ``maxresults`` and ``marker``;
- Put Blob (one PUT), Put Block and Put Block List (a writer's parts, committed in order);
- Blob Batch (``?restype=container&comp=batch``), the multipart body of DELETE subrequests by
  which object_store deletes.

Requests are signed with a bearer token (``AZURE_STORAGE_TOKEN``) or go unsigned: the stand-in
serves unsigned reads of public blobs and containers only, and refuses others as an account
without anonymous access does (409 ``PublicAccessNotPermitted``). What is checked: the choice
between signed and unsigned requests and the fall-back after a refusal, errors by kind, and
every byte read or written."""

from __future__ import annotations

import asyncio
import collections
import http.server
import itertools
import os
import threading
import urllib.parse
import uuid
import xml.etree.ElementTree as ElementTree
from concurrent.futures import ThreadPoolExecutor
from xml.sax.saxutils import escape

import numpy as np
import pytest

import gpumapio
from conftest import LoopbackServer
from gpumapio import RemoteFile, RemotePrefix, RemoteWriter
from gpumapio.remote_file import RemoteEndpointType as Kind
from gpumapio.remote_file import infer_remote_endpoint_type

ACCOUNT = "gpumapacct"
TOKEN = "azure-test-token"
CONTAINER = "gpumap-ctr"  # private: unsigned requests are refused
PUBLIC_CONTAINER = "gpumap-pub"  # blobs and listings served to unsigned requests too
LAST_MODIFIED = "Tue, 24 Nov 2026 12:00:00 GMT"
# The smallest part a writer takes (S3's minimum, which gpumap applies to every store).
PART = 5 << 20

# One request as the stand-in saw it: the blob's (or container's) path percent-decoded, the
# query's parameters, and whether it carried an Authorization header.
Seen = collections.namedtuple("Seen", "method path query signed")


def _error_body(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code>'
            f"<Message>{escape(message)}</Message></Error>").encode()


class _Azure(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # A head and a body written apart would wait for the client's delayed ACK (40 ms) each.
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    # -- the request ------------------------------------------------------------------------

    def _start(self):
        """Reads the request's body (always: the connection is kept alive), splits the
        target, and records the request."""
        self.body = self._read_body()
        path, _, query = self.path.partition("?")
        self.target = urllib.parse.unquote(path)
        self.query = {k: v[0] for k, v in urllib.parse.parse_qs(query, keep_blank_values=True).items()}
        self.server.requests.append(
            Seen(self.command, self.target, self.query, self.headers.get("Authorization") is not None))

    def _read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _container(self):
        return self.target.strip("/").split("/", 1)[0]

    # -- answers ----------------------------------------------------------------------------

    def _reply(self, status, headers=(), body=b"", reason=None):
        self.send_response(status, reason)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("x-ms-request-id", str(uuid.uuid4()))
        self.send_header("x-ms-version", "2023-11-03")
        if not any(name == "Content-Length" for name, _ in headers):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status, code, message):
        """Azure's error answer: the code in a header (all a HEAD's answer can carry) and, but
        for a HEAD, in an XML document; the message as the reason phrase."""
        body = b"" if self.command == "HEAD" else _error_body(code, message)
        self._reply(status, [("x-ms-error-code", code), ("Content-Type", "application/xml")], body, message)

    def _allowed(self, public):
        """Whether the request may go on; else the refusal is sent. A bearer token must be the
        one; no Authorization at all is anonymous access, which serves public blobs and
        containers only."""
        auth = self.headers.get("Authorization")
        if auth is None:
            if public:
                return True
            self._error(409, "PublicAccessNotPermitted", "Public access is not permitted on this storage account.")
            return False
        if auth == f"Bearer {TOKEN}":
            return True
        self._error(403, "AuthenticationFailed",
                    "Server failed to authenticate the request. Make sure the value of Authorization "
                    "header is formed correctly including the signature.")
        return False

    def _is_public(self):
        return self.target in self.server.public or self._container() in self.server.public_containers

    def _meta(self, path):
        return [("ETag", self.server.etags[path]), ("Last-Modified", LAST_MODIFIED)]

    # -- reads ------------------------------------------------------------------------------

    def do_HEAD(self):
        self._start()
        self._read_blob()

    def do_GET(self):
        self._start()
        if self.query.get("restype") == "container" and self.query.get("comp") == "list":
            self._list()
        else:
            self._read_blob()

    def _read_blob(self):
        if not self._allowed(self._is_public()):
            return
        path = self.target
        with self.server.lock:
            data, etag = self.server.blobs.get(path), self.server.etags.get(path)
        if data is None:
            self._error(404, "BlobNotFound", "The specified blob does not exist.")
            return
        if self.headers.get("If-Match") not in (None, "*", etag):
            self._error(412, "ConditionNotMet", "The condition specified using HTTP conditional header(s) is not met.")
            return
        headers = [("ETag", etag), ("Last-Modified", LAST_MODIFIED), ("Content-Type", "application/octet-stream"),
                   ("x-ms-blob-type", "BlockBlob"), ("Accept-Ranges", "bytes")]
        asked = self.headers.get("x-ms-range") or self.headers.get("Range")
        if asked is None or self.command == "HEAD":
            self._reply(200, headers + [("Content-Length", str(len(data)))], data)
            return
        first, _, last = asked.removeprefix("bytes=").partition("-")
        start, end = int(first), min(int(last) if last else len(data) - 1, len(data) - 1)
        if start >= len(data):
            self._error(416, "InvalidRange", "The range specified is invalid for the current size of the resource.")
            return
        body = data[start:end + 1]
        self._reply(206, headers + [("Content-Range", f"bytes {start}-{end}/{len(data)}"),
                                    ("Content-Length", str(len(body)))], body)

    def _list(self):
        """List Blobs: the blobs whose names start with ``prefix``, the levels below
        ``delimiter`` as BlobPrefix entries, in name order; a page holds ``maxresults`` entries
        at most (and at most the server's ``page_size``), and ``NextMarker`` names the next."""
        container = self._container()
        if not self._allowed(container in self.server.public_containers):
            return
        prefix, delimiter = self.query.get("prefix", ""), self.query.get("delimiter", "")
        entries, levels = [], set()
        with self.server.lock:
            blobs = {path: len(data) for path, data in self.server.blobs.items()}
            etags = dict(self.server.etags)
        for path in blobs:
            name = path.removeprefix(f"/{container}/")
            if name == path or not name.startswith(prefix):
                continue
            rest = name[len(prefix):]
            if delimiter and delimiter in rest:
                level = prefix + rest.split(delimiter, 1)[0] + delimiter
                if level not in levels:
                    levels.add(level)
                    entries.append((level, True))
            else:
                entries.append((name, False))
        entries.sort()
        for bound in (self.query.get("marker"), self.query.get("startFrom")):
            if bound:
                entries = [e for e in entries if e[0] >= bound]
        page = min(int(self.query.get("maxresults", 5000)), self.server.page_size)
        shown, after = entries[:page], entries[page:]
        items = []
        for name, is_level in shown:
            if is_level:
                items.append(f"<BlobPrefix><Name>{escape(name)}</Name></BlobPrefix>")
                continue
            path = f"/{container}/{name}"
            etag = etags[path].strip('"')  # unquoted in a listing, as Azure writes it
            items.append(
                f"<Blob><Name>{escape(name)}</Name><Properties><Last-Modified>{LAST_MODIFIED}</Last-Modified>"
                f"<Etag>{etag}</Etag><Content-Length>{blobs[path]}</Content-Length>"
                "<Content-Type>application/octet-stream</Content-Type><BlobType>BlockBlob</BlobType>"
                "</Properties></Blob>")
        next_marker = f"<NextMarker>{escape(after[0][0])}</NextMarker>" if after else "<NextMarker />"
        body = (f'<?xml version="1.0" encoding="utf-8"?><EnumerationResults ServiceEndpoint="{self.server.url}/" '
                f'ContainerName="{container}"><Prefix>{escape(prefix)}</Prefix>'
                f"<MaxResults>{page}</MaxResults><Delimiter>{escape(delimiter)}</Delimiter>"
                f"<Blobs>{''.join(items)}</Blobs>{next_marker}</EnumerationResults>").encode()
        self._reply(200, [("Content-Type", "application/xml")], body)

    # -- writes -----------------------------------------------------------------------------

    def do_PUT(self):
        self._start()
        if not self._allowed(False):
            return
        path, comp = self.target, self.query.get("comp")
        if comp == "block":
            if path in self.server.fail_blocks:
                self._error(500, "InternalError", "The server encountered an internal error.")
                return
            with self.server.lock:
                self.server.blocks[(path, self.query["blockid"])] = self.body
            self._reply(201)
        elif comp == "blocklist":
            self._commit(path)
        elif comp is None:
            if self.headers.get("x-ms-blob-type") != "BlockBlob":
                self._error(400, "MissingRequiredHeader", "An HTTP header that's mandatory for this request is not specified.")
                return
            if self.headers.get("If-None-Match") == "*" and path in self.server.blobs:
                self._error(409, "BlobAlreadyExists", "The specified blob already exists.")
                return
            self.server.store(path, self.body)
            self._reply(201, self._meta(path))
        else:
            self._error(400, "UnsupportedQueryParameter", f"comp={comp} is not served here.")

    def _commit(self, path):
        """Put Block List: the blob becomes the blocks named, in order; ``Uncommitted`` takes
        a block put since, ``Committed`` one of the blob's present blocks, ``Latest`` either
        (the uncommitted one first). The blob's uncommitted blocks are discarded."""
        wanted = [(element.tag, element.text or "") for element in ElementTree.fromstring(self.body)]
        with self.server.lock:
            committed = self.server.committed.get(path, {})
            pieces = []
            for tag, block_id in wanted:
                uncommitted = self.server.blocks.get((path, block_id))
                piece = {"Uncommitted": uncommitted, "Committed": committed.get(block_id),
                         "Latest": uncommitted if uncommitted is not None else committed.get(block_id)}.get(tag)
                if piece is None:
                    self._error(400, "InvalidBlockList", "The specified block list is invalid.")
                    return
                pieces.append((block_id, piece))
            for key in [k for k in self.server.blocks if k[0] == path]:
                del self.server.blocks[key]
            self.server.committed[path] = dict(pieces)
        self.server.store(path, b"".join(piece for _, piece in pieces))
        self._reply(201, self._meta(path))

    # -- deletes ----------------------------------------------------------------------------

    def do_POST(self):
        self._start()
        if self.query.get("restype") != "container" or self.query.get("comp") != "batch":
            self._error(400, "UnsupportedQueryParameter", "Only blob batches are served here.")
            return
        if not self._allowed(False):
            return
        content_type = self.headers.get("Content-Type", "")
        if not content_type.startswith("multipart/mixed; boundary="):
            self._error(400, "InvalidHeaderValue", "A batch is multipart/mixed.")
            return
        marker = b"--" + content_type.removeprefix("multipart/mixed; boundary=").encode()
        parts = self.body.split(marker)
        if parts[0].strip() or not parts[-1].startswith(b"--"):
            self._error(400, "InvalidInput", "The batch's body is not multipart.")
            return
        parts = parts[1:-1]
        if len(parts) > 256:
            self._error(400, "ExceedsMaxBatchRequestCount", "The batch operation exceeds the maximum of 256 subrequests.")
            return
        answers = [self._subrequest(part) for part in parts]
        boundary = f"batchresponse_{uuid.uuid4()}"
        body = b"".join(f"--{boundary}\r\nContent-Type: application/http\r\nContent-ID: {cid}\r\n\r\n".encode() + answer
                        for cid, answer in answers) + f"--{boundary}--\r\n".encode()
        self._reply(202, [("Content-Type", f"multipart/mixed; boundary={boundary}")], body)

    def _subrequest(self, part):
        """One DELETE of a batch, carried out: its Content-ID and its answer (an HTTP response,
        as Azure writes it in the batch's answer)."""
        head, _, request = part.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        part_headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n"))
        lines = request.decode().split("\r\n")
        method, target, _ = lines[0].split(" ")
        headers = {}
        for line in lines[1:]:
            if not line:
                break
            name, _, value = line.partition(": ")
            headers[name.lower()] = value
        path = urllib.parse.unquote(target)
        self.server.requests.append(Seen(method, path, {}, "authorization" in headers))
        cid = part_headers["Content-ID"]
        if method != "DELETE" or not path.startswith(f"/{self._container()}/"):
            return cid, self._sub_answer(400, "InvalidInput", "One of the request inputs is not valid.")
        if headers.get("authorization") != f"Bearer {TOKEN}":
            return cid, self._sub_answer(403, "AuthenticationFailed", "Server failed to authenticate the request.")
        with self.server.lock:
            existed = self.server.blobs.pop(path, None) is not None
            self.server.etags.pop(path, None)
            self.server.committed.pop(path, None)
        if not existed:
            return cid, self._sub_answer(404, "BlobNotFound", "The specified blob does not exist.")
        self.server.deleted.append(path)
        return cid, b"HTTP/1.1 202 Accepted\r\nx-ms-delete-type-permanent: true\r\nx-ms-version: 2023-11-03\r\n\r\n"

    @staticmethod
    def _sub_answer(status, code, message):
        body = _error_body(code, message)
        return (f"HTTP/1.1 {status} {message}\r\nx-ms-error-code: {code}\r\nx-ms-version: 2023-11-03\r\n"
                f"Content-Length: {len(body)}\r\nContent-Type: application/xml\r\n\r\n").encode() + body + b"\r\n"


class _Server(LoopbackServer):
    """The stand-in's state: ``blobs`` (path -> bytes), their ``etags``, uncommitted ``blocks``
    ((path, block id) -> bytes), ``public`` blob paths and ``public_containers``, the blob paths
    whose block PUTs fail (``fail_blocks``), ``page_size``, and every request (``requests``) and
    blob deleted (``deleted``)."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Azure)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.lock = threading.Lock()
        self.blobs, self.etags, self.blocks, self.committed = {}, {}, {}, {}
        self.public, self.public_containers, self.fail_blocks = set(), {PUBLIC_CONTAINER}, set()
        self.page_size = 5000
        self.requests, self.deleted = [], []
        self._versions = itertools.count(0x8DD0C0FFEE00000)

    def store(self, path, data):
        """Writes a blob, with a new ETag as Azure gives each write."""
        with self.lock:
            self.blobs[path] = bytes(data)
            self.etags[path] = f'"0x{next(self._versions):X}"'

    def seen(self, path, method=None, comp=None):
        return [r for r in self.requests
                if r.path == path and method in (None, r.method) and comp in (None, r.query.get("comp"))]


@pytest.fixture
def azure(monkeypatch, tmp_path):
    """The stand-in, the client pointed at it (account ``gpumapacct``), no Azure credentials
    anywhere, and no managed identity to ask."""
    srv = _Server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    # Every credential object_store finds (AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_TOKEN,
    # AZURE_CLIENT_SECRET, AZURE_USE_AZURE_CLI, AZURE_STORAGE_USE_EMULATOR, ...) is an AZURE_*
    # variable: none is left.
    for name in list(os.environ):
        if name.startswith(("AZURE_", "AZURITE_")) or name in ("IDENTITY_ENDPOINT", "IDENTITY_HEADER", "MSI_ENDPOINT"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", ACCOUNT)
    monkeypatch.setenv("AZURE_STORAGE_ENDPOINT", srv.url)
    # A signed try with no credentials asks the machine's managed identity (169.254.169.254):
    # here a port that refuses at once, not an address that may hang without a network.
    monkeypatch.setenv("AZURE_MSI_ENDPOINT", "http://127.0.0.1:9/token")
    monkeypatch.setenv("IDENTITY_ENDPOINT", "http://127.0.0.1:9/token")
    yield srv
    srv.shutdown()
    srv.server_close()


def _read_all(f):
    out = np.empty(f.nbytes(), dtype="u1")
    assert f.read(out) == out.size
    return out.tobytes()


# -- reads ----------------------------------------------------------------------------------


def test_public_blobs_are_read_unsigned_without_credentials(azure, rng):
    data = rng.integers(0, 256, size=300_007, dtype="u1").tobytes()
    azure.store(f"/{CONTAINER}/pub/a b.bin", data)
    azure.public.add(f"/{CONTAINER}/pub/a b.bin")
    url = f"az://{CONTAINER}/pub/a%20b.bin"
    assert (Kind.AZURE.value, Kind.AZURE_PUBLIC.value) == (8, 9)
    assert infer_remote_endpoint_type(url) is Kind.AZURE
    assert infer_remote_endpoint_type("az://ctr/k") is Kind.AZURE
    # No credentials: unsigned first, served, and no request carried any.
    f = RemoteFile.open(url, request_size=65_536)
    assert f.remote_endpoint_type() is Kind.AZURE_PUBLIC
    assert f.url == url and f.nbytes() == len(data)
    out = np.empty(len(data) - 3, dtype="u1")
    assert f.read(out, file_offset=3) == out.size
    assert out.tobytes() == data[3:]
    gets = azure.seen(f"/{CONTAINER}/pub/a b.bin", "GET")
    assert len(gets) >= 4, "ranged GETs of request_size bytes, the space of the name decoded"
    assert azure.requests and not any(r.signed for r in azure.requests)


def test_private_blobs_are_read_signed_with_a_token_and_a_refused_token_falls_back(azure, monkeypatch, rng):
    data = rng.integers(0, 256, size=250_001, dtype="u1").tobytes()
    azure.store(f"/{CONTAINER}/private/w.bin", data)
    azure.store(f"/{CONTAINER}/pub/p.bin", data[::-1])
    azure.public.add(f"/{CONTAINER}/pub/p.bin")
    monkeypatch.setenv("AZURE_STORAGE_TOKEN", TOKEN)
    # Credentials configured: signed first, and every request signed.
    f = RemoteFile.open(f"az://{CONTAINER}/private/w.bin")
    assert f.remote_endpoint_type() is Kind.AZURE
    out = np.zeros(100_000, dtype="u1")
    futures = [f.pread(out[i:i + 1000], 1000, i) for i in range(0, 100_000, 1000)]
    odd = np.zeros(12_345, dtype="u1")
    futures.append(f.pread(odd, 12_345, 154_321))
    assert [fut.get() for fut in futures] == [1000] * 100 + [12_345]
    assert out.tobytes() == data[:100_000] and odd.tobytes() == data[154_321:166_666]
    assert _read_all(f) == data
    assert all(r.signed for r in azure.requests)
    # A public blob with credentials is read signed too.
    assert RemoteFile.open(f"az://{CONTAINER}/pub/p.bin").remote_endpoint_type() is Kind.AZURE
    # A token the account refuses (403): the unsigned try after it reads a public blob...
    monkeypatch.setenv("AZURE_STORAGE_TOKEN", "not-the-token")
    before = len(azure.requests)
    f = RemoteFile.open(f"az://{CONTAINER}/pub/p.bin")
    assert f.remote_endpoint_type() is Kind.AZURE_PUBLIC
    assert _read_all(f) == data[::-1]
    signed = [r.signed for r in azure.requests[before:]]
    assert signed[0] and not any(signed[1:]), "one signed HEAD refused, then unsigned requests"
    # ...and a private blob's error is the signed refusal, which names no token.
    with pytest.raises(PermissionError) as info:
        RemoteFile.open(f"az://{CONTAINER}/private/w.bin", http_max_attempts=1)
    assert info.value.status == 403
    assert "not-the-token" not in str(info.value) and TOKEN not in str(info.value)


def test_a_private_blob_without_credentials_is_refused_as_azure_refuses_anonymous_access(azure, rng):
    azure.store(f"/{CONTAINER}/private/w.bin", rng.integers(0, 256, size=1000, dtype="u1").tobytes())
    # Unsigned first (no credentials), refused with 409 PublicAccessNotPermitted; the signed
    # try after it finds no managed identity; the error is the refusal.
    with pytest.raises(PermissionError) as info:
        RemoteFile.open(f"az://{CONTAINER}/private/w.bin", http_max_attempts=1)
    assert info.value.status == 409
    assert f"az://{CONTAINER}/private/w.bin" in str(info.value)
    assert azure.requests[0] == Seen("HEAD", f"/{CONTAINER}/private/w.bin", {}, False)


def test_missing_blobs_bad_container_names_and_no_account_are_errors(azure, monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_TOKEN", TOKEN)
    with pytest.raises(FileNotFoundError) as info:
        RemoteFile.open(f"az://{CONTAINER}/missing.bin")
    assert f"az://{CONTAINER}/missing.bin" in str(info.value) and TOKEN not in str(info.value)
    assert info.value.status == 404
    asked = len(azure.requests)
    # Azure's rules for container names (3-63 lowercase letters, digits, single '-'),
    # checked before any request.
    for bad in ["az://Bad_Ctr/x", "az://ab/x", "az://con--tainer/x", "az://-ctr/x"]:
        with pytest.raises(ValueError):
            RemoteFile.open(bad)
    with pytest.raises(ValueError):
        RemotePrefix("az://Bad_Ctr/prefix/")
    with pytest.raises(ValueError):
        infer_remote_endpoint_type("az://ctr")
    assert len(azure.requests) == asked
    # No storage account: named, signed or not.
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME")
    with pytest.raises(ValueError, match="AZURE_STORAGE_ACCOUNT_NAME"):
        RemoteFile.open(f"az://{CONTAINER}/missing.bin")
    monkeypatch.delenv("AZURE_STORAGE_TOKEN")
    with pytest.raises(ValueError, match="AZURE_STORAGE_ACCOUNT_NAME"):
        RemoteFile.open(f"az://{CONTAINER}/missing.bin", http_max_attempts=1)
    assert len(azure.requests) == asked


# -- prefixes and checkpoints ---------------------------------------------------------------


def test_a_prefix_lists_in_name_order_page_by_page(azure, monkeypatch):
    blobs = {"tree/a.bin": b"abc", "tree/b c.bin": b"hello", "tree/sub/x.bin": b"x" * 7,
             "tree/sub/deeper/y.bin": b"y" * 11, "tree/z&<q>.bin": b"escaped", "treehouse/n.bin": b"neighbour"}
    for name, body in blobs.items():
        azure.store(f"/{CONTAINER}/{name}", body)
    # Pages of two entries: the listing goes on by NextMarker.
    azure.page_size = 2
    monkeypatch.setenv("AZURE_STORAGE_TOKEN", TOKEN)
    p = RemotePrefix(f"az://{CONTAINER}/tree/")
    assert not p.unsigned and p.url == f"az://{CONTAINER}/tree/"
    want = sorted((name.removeprefix("tree/"), len(body)) for name, body in blobs.items() if name.startswith("tree/"))
    assert list(p.list()) == want
    assert list(p.list("sub/")) == [("sub/deeper/y.bin", 11), ("sub/x.bin", 7)]
    assert p.list_dir() == ([("a.bin", 3), ("b c.bin", 5), ("z&<q>.bin", 7)], ["sub"])
    assert p.list_dir("sub") == ([("sub/x.bin", 7)], ["sub/deeper"])
    assert p.size("b c.bin") == 5 and p.size("missing.bin") is None
    assert _read_all(p.open("z&<q>.bin")) == b"escaped"
    listings = azure.seen(f"/{CONTAINER}", "GET", "list")
    assert any("marker" in r.query for r in listings), "a page asked by its marker"
    assert all(r.signed for r in listings)
    # No credentials: a private container refuses the unsigned page (409), so the prefix signs;
    # a public one serves it, so the prefix stays unsigned.
    monkeypatch.delenv("AZURE_STORAGE_TOKEN")
    before = len(azure.requests)
    assert not RemotePrefix(f"az://{CONTAINER}/tree/").unsigned
    assert [(r.path, r.signed) for r in azure.requests[before:]] == [(f"/{CONTAINER}", False)]
    azure.store(f"/{PUBLIC_CONTAINER}/tree/a.bin", b"public")
    public = RemotePrefix(f"az://{PUBLIC_CONTAINER}/tree/")
    assert public.unsigned
    assert list(public.list()) == [("a.bin", 6)]
    assert public.open("a.bin").remote_endpoint_type() is Kind.AZURE_PUBLIC
    assert not any(r.signed for r in azure.requests[before:])


def _put_checkpoint(azure, container, tmp_path, rng):
    pytest.importorskip("safetensors.numpy")
    from test_checkpoint import _model, _save_sharded

    tensors = _model(rng)
    directory = _save_sharded(tensors, str(tmp_path / "ckpt"))
    for name in os.listdir(directory):
        with open(os.path.join(directory, name), "rb") as f:
            azure.store(f"/{container}/ckpt/{name}", f.read())
    return tensors, directory


def test_a_checkpoint_and_a_read_come_from_az_urls(azure, monkeypatch, tmp_path, rng):
    tensors, directory = _put_checkpoint(azure, CONTAINER, tmp_path, rng)
    from test_checkpoint import _same

    monkeypatch.setenv("AZURE_STORAGE_TOKEN", TOKEN)
    got = gpumapio.load_checkpoint(f"az://{CONTAINER}/ckpt/model.safetensors.index.json", "cpu", framework="numpy")
    assert set(got) == set(tensors)
    for name, array in got.items():
        _same(array, tensors[name])
    # By its prefix, listed as a directory is.
    listed_before = len(azure.seen(f"/{CONTAINER}", "GET", "list"))
    got = gpumapio.load_checkpoint(f"az://{CONTAINER}/ckpt/", "cpu", framework="numpy")
    assert set(got) == set(tensors)
    for name, array in got.items():
        _same(array, tensors[name])
    assert len(azure.seen(f"/{CONTAINER}", "GET", "list")) > listed_before
    prefix = RemotePrefix(f"az://{CONTAINER}/ckpt/")
    assert not prefix.unsigned and prefix.url == f"az://{CONTAINER}/ckpt/"
    assert list(prefix.list()) == sorted((name, os.path.getsize(os.path.join(directory, name)))
                                         for name in os.listdir(directory))
    index = azure.blobs[f"/{CONTAINER}/ckpt/model.safetensors.index.json"]
    read = gpumapio.read_file_to_device(f"az://{CONTAINER}/ckpt/model.safetensors.index.json", offset=7, output="numpy")
    assert read.tobytes() == index[7:]
    assert all(r.signed for r in azure.requests)


def test_a_public_checkpoint_loads_without_credentials(azure, tmp_path, rng):
    tensors, _ = _put_checkpoint(azure, PUBLIC_CONTAINER, tmp_path, rng)
    from test_checkpoint import _same

    for where in [f"az://{PUBLIC_CONTAINER}/ckpt/model.safetensors.index.json", f"az://{PUBLIC_CONTAINER}/ckpt/"]:
        got = gpumapio.load_checkpoint(where, "cpu", framework="numpy")
        assert set(got) == set(tensors)
        for name, array in got.items():
            _same(array, tensors[name])
    assert RemotePrefix(f"az://{PUBLIC_CONTAINER}/ckpt/").unsigned
    assert azure.requests and not any(r.signed for r in azure.requests)


def test_fsspecs_abfs_names_read_as_az_and_hadoops_are_refused_naming_the_account_variable(azure, tmp_path, rng):
    tensors, _ = _put_checkpoint(azure, PUBLIC_CONTAINER, tmp_path, rng)
    from test_checkpoint import _same

    # adlfs's abfs://container/path (and abfss://) name the blob az:// names: read, shown as az://.
    index = "ckpt/model.safetensors.index.json"
    f = RemoteFile.open(f"abfs://{PUBLIC_CONTAINER}/{index}")
    assert f.url == f"az://{PUBLIC_CONTAINER}/{index}"
    assert _read_all(f) == azure.blobs[f"/{PUBLIC_CONTAINER}/{index}"]
    assert infer_remote_endpoint_type(f"abfss://{PUBLIC_CONTAINER}/{index}") is Kind.AZURE
    got = gpumapio.load_checkpoint(f"abfss://{PUBLIC_CONTAINER}/ckpt/", "cpu", framework="numpy")
    assert set(got) == set(tensors)
    for name, array in got.items():
        _same(array, tensors[name])
    assert RemotePrefix(f"abfs://{PUBLIC_CONTAINER}/ckpt/").url == f"az://{PUBLIC_CONTAINER}/ckpt/"
    # Hadoop's form names the account in the URL; gpumapio takes it from the environment.
    before = len(azure.requests)
    for url in [f"abfss://{PUBLIC_CONTAINER}@{ACCOUNT}.dfs.core.windows.net/{index}",
                f"abfs://{PUBLIC_CONTAINER}@{ACCOUNT}.dfs.core.windows.net/ckpt/"]:
        with pytest.raises(ValueError, match="AZURE_STORAGE_ACCOUNT_NAME"):
            RemoteFile.open(url)
        with pytest.raises(ValueError, match="AZURE_STORAGE_ACCOUNT_NAME"):
            RemotePrefix(url)
    assert len(azure.requests) == before


# -- writes and deletes ---------------------------------------------------------------------


def test_a_blob_of_several_blocks_is_committed_in_order(azure, monkeypatch, rng):
    monkeypatch.setenv("AZURE_STORAGE_TOKEN", TOKEN)
    data = rng.integers(0, 256, size=2 * PART + 4099, dtype="u1")
    path = f"/{CONTAINER}/w/big.bin"
    w = RemoteWriter(f"az://{CONTAINER}/w/big.bin", part_size=PART)
    assert w.part_size == PART and w.url == f"az://{CONTAINER}/w/big.bin"
    # Pieces written last first, from threads: the blocks go out in any order, and the block
    # list must name them in the blob's order.
    cuts = list(range(0, data.size, 999_983)) + [data.size]
    pieces = list(zip(cuts[:-1], cuts[1:]))
    with ThreadPoolExecutor(4) as pool:
        counts = list(pool.map(lambda p: w.write(data[p[0]:p[1]], file_offset=p[0]), pieces[::-1]))
    assert sum(counts) == data.size == w.nbytes()
    assert path not in azure.blobs, "nothing is committed before finish"
    assert w.finish() == data.size
    assert azure.blobs[path] == data.tobytes()
    assert len(azure.seen(path, "PUT", "block")) == 3
    assert len(azure.seen(path, "PUT", "blocklist")) == 1
    assert not [k for k in azure.blocks if k[0] == path], "the committed blocks are no longer uncommitted"
    assert _read_all(RemoteFile.open(f"az://{CONTAINER}/w/big.bin")) == data.tobytes()
    with pytest.raises(ValueError, match="finished"):
        w.write(b"x", file_offset=0)


def test_small_blobs_are_one_put_and_deletes_take_written_and_missing_names(azure, monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_TOKEN", TOKEN)
    p = RemotePrefix(f"az://{CONTAINER}/w/")
    with p.create("small.bin") as w:
        assert w.write(b"world", file_offset=6) == 5
        w.write(bytearray(b"hello "), size=6)
    with p.create("dir/empty.bin"):
        pass
    with p.create("dir/odd name+1.bin") as w:
        w.write(b"\x00\xff" * 50_001)
    assert azure.blobs[f"/{CONTAINER}/w/small.bin"] == b"hello world"
    assert azure.blobs[f"/{CONTAINER}/w/dir/empty.bin"] == b""
    assert azure.blobs[f"/{CONTAINER}/w/dir/odd name+1.bin"] == b"\x00\xff" * 50_001
    for name in ["small.bin", "dir/empty.bin", "dir/odd name+1.bin"]:
        assert [r.query for r in azure.seen(f"/{CONTAINER}/w/{name}", "PUT")] == [{}], "one Put Blob, no blocks"
    assert p.size("small.bin") == 11 and p.size("dir/empty.bin") == 0
    assert _read_all(p.open("dir/odd name+1.bin")) == b"\x00\xff" * 50_001
    azure.store(f"/{CONTAINER}/wx/keep.bin", b"neighbour")
    # Names written and names never written (more than a batch's 256): none is an error.
    missing = [f"gone/{i}.bin" for i in range(300)]
    p.delete(["small.bin", "never-written.bin", "dir/empty.bin", "dir/odd name+1.bin"] + missing)
    assert sorted(azure.deleted) == sorted(f"/{CONTAINER}/w/{n}" for n in ["small.bin", "dir/empty.bin", "dir/odd name+1.bin"])
    assert [k for k in azure.blobs if k.startswith(f"/{CONTAINER}/w/")] == []
    assert azure.blobs[f"/{CONTAINER}/wx/keep.bin"] == b"neighbour"
    assert p.size("small.bin") is None and list(p.list()) == []
    batches = azure.seen(f"/{CONTAINER}", "POST", "batch")
    assert len(batches) >= 2 and all(r.signed for r in batches)
    p.delete(["small.bin"])  # again: gone already, no error


def test_a_failed_upload_stores_no_blob(azure, monkeypatch, rng):
    monkeypatch.setenv("AZURE_STORAGE_TOKEN", TOKEN)
    path = f"/{CONTAINER}/w/fail.bin"
    azure.store(path, b"the blob before")
    azure.fail_blocks.add(path)
    data = rng.integers(0, 256, size=2 * PART + 1, dtype="u1")
    # One attempt per request: the block's 500 is final.
    w = RemoteWriter(f"az://{CONTAINER}/w/fail.bin", part_size=PART, http_max_attempts=1)
    with pytest.raises(OSError) as info:
        w.write(data)
        w.finish()
    assert getattr(info.value, "status", None) == 500
    w.close()
    assert azure.seen(path, "PUT", "block"), "a block was sent, and refused"
    assert azure.seen(path, "PUT", "blocklist") == []
    assert azure.blobs[path] == b"the blob before"


# -- Zarr -----------------------------------------------------------------------------------


def test_a_zarr_array_is_written_and_read_through_the_store(azure, monkeypatch):
    zarr = pytest.importorskip("zarr", minversion="3")
    from gpumapio.zarr import RemoteStore, open_store

    monkeypatch.setenv("AZURE_STORAGE_TOKEN", TOKEN)
    url = f"az://{PUBLIC_CONTAINER}/data.zarr/"
    store = open_store(url)
    assert isinstance(store, RemoteStore) and not store._prefix.unsigned
    data = np.random.default_rng(3).standard_normal((301, 77)).astype("f4")
    zarr.create_array(store, shape=data.shape, chunks=(64, 32), dtype="f4")[:] = data
    # Keys as zarr lays them out, every chunk a blob.
    keys = {k for k in azure.blobs if k.startswith(f"/{PUBLIC_CONTAINER}/data.zarr/")}
    assert f"/{PUBLIC_CONTAINER}/data.zarr/zarr.json" in keys and len(keys) == 1 + 5 * 3
    back = zarr.open_array(open_store(url, read_only=True), mode="r")
    np.testing.assert_array_equal(back[:], data)
    np.testing.assert_array_equal(back[17:250, 5:70], data[17:250, 5:70])
    # A reader with no credentials: the public container lists to it, so it reads unsigned.
    monkeypatch.delenv("AZURE_STORAGE_TOKEN")
    before = len(azure.requests)
    unsigned = open_store(url, read_only=True)
    assert unsigned._prefix.unsigned
    np.testing.assert_array_equal(zarr.open_array(unsigned, mode="r")[:], data)
    assert not any(r.signed for r in azure.requests[before:])
    monkeypatch.setenv("AZURE_STORAGE_TOKEN", TOKEN)
    asyncio.run(open_store(url).delete_dir("c"))
    assert {k for k in azure.blobs if k.startswith(f"/{PUBLIC_CONTAINER}/data.zarr/")} == {
        f"/{PUBLIC_CONTAINER}/data.zarr/zarr.json"}

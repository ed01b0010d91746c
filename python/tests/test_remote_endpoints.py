"""KvikIO's ways of opening S3 objects, on moto's S3 server (127.0.0.1 only): its constructors'
arguments in its order, ``open_s3_url`` with ``http(s)://`` URLs, ``open_s3_public`` and the
``S3_PUBLIC`` endpoint type (unsigned requests: moto serves public-read objects to them and
refuses private ones), ``AUTO``'s fall-back between signed and unsigned requests,
``remote_endpoint_type()`` and ``infer_remote_endpoint_type``; prefixes (checkpoints, the Zarr
store) of a public bucket read with no credentials; byte for byte."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

import gpumapio
from gpumapio import RemoteFile
from gpumapio.remote_file import RemoteEndpointType as Kind
from gpumapio.remote_file import infer_remote_endpoint_type

PRIVATE = "dir/object.bin"
PUBLIC = "pub/object.bin"


@pytest.fixture
def served(server, rng):
    data = rng.integers(0, 256, size=100_003, dtype="u1").tobytes()
    server.objects["/data/object.bin"] = data
    return server, f"{server.url}/data/object.bin", data


@pytest.fixture
def bucket(moto_s3):
    """moto's bucket with a private object and a public-read one (the same bytes)."""
    boto3 = pytest.importorskip("boto3")
    endpoint, data, _ = moto_s3
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.put_object(Bucket="gpumap-bucket", Key=PUBLIC, Body=data, ACL="public-read")
    return endpoint, data


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    """No AWS credentials anywhere: neither in the environment nor in the AWS files."""
    _drop_credentials(monkeypatch, tmp_path)


def _drop_credentials(monkeypatch, tmp_path):
    for name in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))


def reads_exactly(f, data):
    assert f.nbytes() == len(data)
    out = np.empty(len(data) - 101, dtype="u1")
    assert f.read(out, file_offset=101) == out.size
    assert out.tobytes() == data[101:]


def test_open_s3_takes_kvikios_arguments_in_its_order(bucket, monkeypatch):
    endpoint, data = bucket
    # KvikIO's positional order: nbytes, region, key id, secret, endpoint, session token.
    f = RemoteFile.open_s3("gpumap-bucket", PRIVATE, None, "us-east-1", "testing", "testing", endpoint)
    reads_exactly(f, data)
    assert f.remote_endpoint_type() is Kind.S3
    f = RemoteFile.open_s3_url(
        "s3://gpumap-bucket/" + PRIVATE, nbytes=len(data), aws_region_name="us-east-1",
        aws_access_key_id="AKIAGIVEN", aws_secret_access_key="given-secret", aws_endpoint_url=endpoint,
        aws_session_token=None,
    )
    reads_exactly(f, data)
    with pytest.raises(ValueError, match='aws_region_name "us-east-1" and aws_region "eu-west-1" disagree'):
        RemoteFile.open_s3("gpumap-bucket", PRIVATE, aws_region_name="us-east-1", aws_region="eu-west-1")
    # One half of the key pair given: the other comes from the environment, else it is named.
    reads_exactly(RemoteFile.open_s3("gpumap-bucket", PRIVATE, aws_access_key_id="AKIAX", aws_endpoint_url=endpoint), data)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ValueError, match="aws_secret_access_key is needed"):
        RemoteFile.open_s3("gpumap-bucket", PRIVATE, aws_access_key_id="AKIAX", aws_endpoint_url=endpoint)
    with pytest.raises(ValueError, match="S3 credentials"):
        RemoteFile.open_s3("gpumap-bucket", PRIVATE, None, None, "AKIAX", "bad\nsecret", endpoint)


def test_open_s3_url_reads_http_urls_path_style_on_their_host(bucket, monkeypatch):
    endpoint, data = bucket
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # the URL's host wins
    f = RemoteFile.open_s3_url(f"{endpoint}/gpumap-bucket/{PRIVATE}")
    reads_exactly(f, data)
    assert f.remote_endpoint_type() is Kind.S3
    assert f.url == "s3://gpumap-bucket/" + PRIVATE
    for bad in [f"{endpoint}/gpumap-bucket", f"{endpoint}/gpumap-bucket/{PRIVATE}?versionId=3",
                "https://ec2.us-east-1.amazonaws.com/b/k", "ftp://host/b/k"]:
        with pytest.raises(ValueError):
            RemoteFile.open_s3_url(bad)


def test_public_objects_are_read_with_unsigned_requests(bucket, no_credentials, monkeypatch, tmp_path):
    endpoint, data = bucket
    # A profile whose credentials gpumap refuses to fetch fails any signed open: unsigned ones
    # look for none.
    (tmp_path / "config").write_text("[profile runs-a-process]\ncredential_process = /bin/false\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_PROFILE", "runs-a-process")
    for f in [
        RemoteFile.open_s3_public(f"{endpoint}/gpumap-bucket/{PUBLIC}"),
        RemoteFile.open_s3_public("s3://gpumap-bucket/" + PUBLIC, aws_endpoint_url=endpoint, request_size=100_000),
    ]:
        reads_exactly(f, data)
        assert f.remote_endpoint_type() is Kind.S3_PUBLIC
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    f = RemoteFile.open("s3://gpumap-bucket/" + PUBLIC, Kind.S3_PUBLIC)
    reads_exactly(f, data)
    # moto refuses unsigned requests for a private object, as S3 does.
    with pytest.raises(PermissionError) as info:
        RemoteFile.open_s3_public(f"{endpoint}/gpumap-bucket/{PRIVATE}")
    assert info.value.status == 403
    with pytest.raises(ValueError, match="credential_process"):
        RemoteFile.open("s3://gpumap-bucket/" + PRIVATE, Kind.S3)


def test_auto_without_credentials_reads_public_objects_unsigned(bucket, no_credentials, monkeypatch):
    endpoint, data = bucket
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    f = RemoteFile.open("s3://gpumap-bucket/" + PUBLIC)
    reads_exactly(f, data)
    assert f.remote_endpoint_type() is Kind.S3_PUBLIC
    # A private object: refused unsigned, and signed there is nothing to sign with; the
    # unsigned refusal is the one reported.
    with pytest.raises(PermissionError) as info:
        RemoteFile.open("s3://gpumap-bucket/" + PRIVATE, http_max_attempts=1, http_timeout=5)
    assert info.value.status == 403
    # A size given does not keep the unsigned open from asking: a refusal shows at open.
    f = RemoteFile.open("s3://gpumap-bucket/" + PUBLIC, nbytes=len(data))
    assert f.remote_endpoint_type() is Kind.S3_PUBLIC
    reads_exactly(f, data)
    with pytest.raises(PermissionError):
        RemoteFile.open("s3://gpumap-bucket/" + PRIVATE, nbytes=len(data), http_max_attempts=1, http_timeout=5)
    # Without S3_PUBLIC allowed, AUTO opens signed only.
    with pytest.raises(ValueError, match="allow list"):
        RemoteFile.open("s3://gpumap-bucket/" + PUBLIC, allow_list=[Kind.HTTP])


def test_auto_with_credentials_opens_signed(bucket, monkeypatch):
    endpoint, data = bucket
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    f = RemoteFile.open("s3://gpumap-bucket/" + PRIVATE)
    reads_exactly(f, data)
    assert f.remote_endpoint_type() is Kind.S3
    # S3_PUBLIC first in the allow list: it is what AUTO takes, and moto refuses unsigned
    # requests for a private object (KvikIO's open fails there too).
    with pytest.raises(PermissionError):
        RemoteFile.open("s3://gpumap-bucket/" + PRIVATE, Kind.AUTO, [Kind.S3_PUBLIC, Kind.S3])
    f = RemoteFile.open("s3://gpumap-bucket/" + PUBLIC, Kind.AUTO, [Kind.S3_PUBLIC, Kind.S3])
    assert f.remote_endpoint_type() is Kind.S3_PUBLIC


def test_endpoint_types_are_told_from_the_url(served):
    _, url, data = served
    assert RemoteFile.open_http(url).remote_endpoint_type() is Kind.HTTP
    presigned = url + "?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=abc"
    assert RemoteFile.open(presigned).remote_endpoint_type() is Kind.S3_PRESIGNED_URL
    assert RemoteFile.open_s3_presigned_url(presigned).remote_endpoint_type() is Kind.S3_PRESIGNED_URL
    for text, kind in [
        ("s3://bkt/key.bin", Kind.S3),
        ("https://bkt.s3.us-east-2.amazonaws.com/key.bin", Kind.S3),
        ("https://s3.amazonaws.com/bkt/key.bin", Kind.S3),
        ("https://bkt.s3.us-east-2.amazonaws.com/key.bin?X-Amz-Algorithm=A&X-Amz-Signature=B", Kind.S3_PRESIGNED_URL),
        ("http://nn:9870/webhdfs/v1/a.bin", Kind.WEBHDFS),
        ("https://example.org/a.bin", Kind.HTTP),
    ]:
        assert infer_remote_endpoint_type(text) is kind, text
        assert gpumapio.remote_file.infer_remote_endpoint_type(text) is kind
    for text in ["s3://bkt", "https://example.org/", "ftp://example.org/x"]:
        with pytest.raises(ValueError):
            infer_remote_endpoint_type(text)
    with pytest.raises(ValueError) as info:
        infer_remote_endpoint_type("https://user:hunter2@example.org/x")
    assert "hunter2" not in str(info.value)
    with pytest.raises(ValueError, match="not an endpoint type"):
        RemoteFile.open(url, "S3_PRIVATE")
    with pytest.raises(ValueError, match="AUTO is not an endpoint type an allow list holds"):
        RemoteFile.open(url, allow_list=[Kind.AUTO])


def test_a_public_checkpoint_loads_by_its_index_url_without_credentials(bucket, no_credentials, monkeypatch, tmp_path, rng):
    pytest.importorskip("safetensors.numpy")
    boto3 = pytest.importorskip("boto3")
    from test_checkpoint import _model, _same, _save_sharded

    endpoint, _ = bucket
    tensors = _model(rng)
    directory = _save_sharded(tensors, str(tmp_path / "ckpt"))
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    for name in os.listdir(directory):
        # A prefix of its own: moto's objects outlive its server within the process, and other
        # tests list `ckpt/`.
        client.upload_file(os.path.join(directory, name), "gpumap-bucket", f"public-ckpt/{name}",
                           ExtraArgs={"ACL": "public-read"})
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    # By its index's URL, and by its prefix: moto lists the bucket to unsigned requests, so
    # the prefix opens unsigned.
    for where in ["s3://gpumap-bucket/public-ckpt/model.safetensors.index.json", "s3://gpumap-bucket/public-ckpt/"]:
        got = gpumapio.load_checkpoint(where, "cpu", framework="numpy")
        assert set(got) == set(tensors)
        for name, array in got.items():
            _same(array, tensors[name])
    assert gpumapio.RemotePrefix("s3://gpumap-bucket/public-ckpt/").unsigned


def test_a_public_bucket_is_read_through_the_zarr_store_without_credentials(moto_s3, monkeypatch, tmp_path):
    zarr = pytest.importorskip("zarr")
    boto3 = pytest.importorskip("boto3")
    from gpumapio.zarr import RemoteStore

    endpoint, _, _ = moto_s3
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="gpumap-public", ACL="public-read")
    expected = np.arange(60_000, dtype="<f4").reshape(300, 200)
    # Written signed (with the environment's credentials), then read by a process that has none.
    written = RemoteStore("s3://gpumap-public/array.zarr/")
    assert not written._prefix.unsigned
    zarr.create_array(written, shape=expected.shape, chunks=(64, 64), dtype="<f4")[...] = expected
    _drop_credentials(monkeypatch, tmp_path)
    store = RemoteStore("s3://gpumap-public/array.zarr/", read_only=True)
    assert store._prefix.unsigned
    np.testing.assert_array_equal(zarr.open_array(store, mode="r")[...], expected)
    said = RemoteStore("s3://gpumap-public/array.zarr/", read_only=True, unsigned=True)
    np.testing.assert_array_equal(zarr.open_array(said, mode="r")[50:250, 10:190], expected[50:250, 10:190])
    assert "unsigned" in pickle.loads(pickle.dumps(said))._settings


def test_a_prefix_signs_or_not_as_told(bucket):
    endpoint, _ = bucket
    signed = gpumapio.RemotePrefix("s3://gpumap-bucket/", aws_endpoint_url=endpoint)
    assert not signed.unsigned
    unsigned = gpumapio.RemotePrefix("s3://gpumap-bucket/pub/", aws_endpoint_url=endpoint, unsigned=True)
    assert unsigned.unsigned
    assert unsigned.list_dir("")[0] == [("object.bin", 1_048_909)]
    assert unsigned.open("object.bin").remote_endpoint_type() is Kind.S3_PUBLIC


def test_credentials_no_request_can_carry_are_refused_not_panicked_on(bucket, monkeypatch):
    endpoint, _ = bucket
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "tok\x01en")
    with pytest.raises(ValueError, match="AWS_SESSION_TOKEN") as info:
        RemoteFile.open("s3://gpumap-bucket/" + PRIVATE)
    assert "tok" not in str(info.value).replace("AWS_SESSION_TOKEN", "")
    # A temporary key given without its token takes the environment's, checked the same way.
    with pytest.raises(ValueError, match="AWS_SESSION_TOKEN"):
        RemoteFile.open_s3("gpumap-bucket", PRIVATE, None, None, "ASIAEXAMPLE", "secret", endpoint)
    monkeypatch.delenv("AWS_SESSION_TOKEN")
    with pytest.raises(ValueError, match="S3 credentials"):
        RemoteFile.open_s3("gpumap-bucket", PRIVATE, None, None, "ASIAEXAMPLE", "secret", endpoint, "tok\x7f")

"""Checkpoints at URLs: load_checkpoint and load_safetensors over the range server on 127.0.0.1
(conftest.py) and over moto's S3 server, checked byte for byte against the same checkpoint
loaded from local files; host memory (NumPy), so it runs everywhere."""

from __future__ import annotations

import os

import pytest

st_numpy = pytest.importorskip("safetensors.numpy")

from gpumapio import CheckpointError, TensorParallel, load_checkpoint, load_safetensors  # noqa: E402
from gpumapio.safetensors import read_header  # noqa: E402
from test_checkpoint import _model, _same, _save_sharded  # noqa: E402


def _publish(server, directory, prefix="/ckpt"):
    """Every file of ``directory`` served under ``prefix``; the URL of the prefix."""
    for name in os.listdir(directory):
        with open(os.path.join(directory, name), "rb") as f:
            server.objects[f"{prefix}/{name}"] = f.read()
    return f"{server.url}{prefix}"


@pytest.fixture
def published(server, tmp_path, rng):
    tensors = _model(rng)
    directory = _save_sharded(tensors, str(tmp_path / "ckpt"))
    return _publish(server, directory), directory, tensors


@pytest.mark.parametrize("form", ["index", "directory", "one shard"])
def test_http_checkpoints_load_as_local_ones(published, form):
    url, directory, tensors = published
    source = {
        "index": f"{url}/model.safetensors.index.json",
        "directory": f"{url}/",
        "one shard": f"{url}/model-00002-of-00003.safetensors",
    }[form]
    got = load_checkpoint(source, "cpu", framework="numpy")
    if form == "one shard":
        local = load_checkpoint(os.path.join(directory, "model-00002-of-00003.safetensors"), "cpu", framework="numpy")
        assert list(got) == list(local) and 0 < len(got) < len(tensors)
    else:
        local = load_checkpoint(directory, "cpu", framework="numpy")
        assert list(got) == list(local) and set(got) == set(tensors)
    for name, array in got.items():
        _same(array, tensors[name])


def test_filters_slices_and_casts_read_from_urls(published):
    url, directory, tensors = published
    index = f"{url}/model.safetensors.index.json"
    wanted = ["model.layers.1.mlp.up_proj.weight", "model.norm.weight"]
    got = load_checkpoint(index, "cpu", framework="numpy", tensors=wanted)
    assert list(got) == wanted
    for name in wanted:
        _same(got[name], tensors[name])
    # Column splits are strided runs: one ranged read per run.
    tp = TensorParallel(rank=1, world_size=2, rules={"*.q_proj.weight": "column", "*.down_proj.weight": "row"})
    remote = load_checkpoint(index, "cpu", framework="numpy", tp=tp)
    local = load_checkpoint(directory, "cpu", framework="numpy", tp=tp)
    assert list(remote) == list(local)
    for name in local:
        _same(remote[name], local[name])
    cast = load_checkpoint(index, "cpu", framework="numpy", dtype="float16", tensors=wanted)
    _same(cast["model.layers.1.mlp.up_proj.weight"], tensors["model.layers.1.mlp.up_proj.weight"].astype("<f2"))


def test_load_safetensors_and_read_header_take_urls(published):
    url, directory, tensors = published
    shard = "model-00001-of-00003.safetensors"
    remote_infos, remote_meta = read_header(f"{url}/{shard}")
    local_infos, local_meta = read_header(os.path.join(directory, shard))
    assert remote_infos == local_infos and remote_meta == local_meta
    got = load_safetensors(f"{url}/{shard}", "cpu", framework="numpy")
    assert list(got) == list(local_infos)
    for name, array in got.items():
        _same(array, tensors[name])
    some = list(local_infos)[1:3]
    got = load_safetensors(f"{url}/{shard}", "cpu", framework="numpy", tensors=some)
    for name in some:
        _same(got[name], tensors[name])


def test_missing_shards_and_bad_urls_name_what_is_wrong(server, published):
    url, _, _ = published
    del server.objects["/ckpt/model-00003-of-00003.safetensors"]
    with pytest.raises(CheckpointError, match=r"shard 'model-00003-of-00003.safetensors'.*is not a file in http://"):
        load_checkpoint(f"{url}/model.safetensors.index.json", "cpu", framework="numpy")
    with pytest.raises(CheckpointError, match=r"neither model.safetensors.index.json nor model.safetensors"):
        load_checkpoint(f"{server.url}/elsewhere/", "cpu", framework="numpy")
    with pytest.raises(FileNotFoundError):
        load_safetensors(f"{server.url}/no/such.safetensors", "cpu", framework="numpy")
    # A header cut short by the server: the length check names the object.
    server.objects["/cut.safetensors"] = server.objects["/ckpt/model-00001-of-00003.safetensors"][:20]
    with pytest.raises(ValueError, match=r"cut.safetensors: header length"):
        read_header(f"{server.url}/cut.safetensors")
    # Shorter than the header's length: named as such, as a local file is.
    server.objects["/tiny.safetensors"] = b"\x01\x00"
    for call in (read_header, lambda u: load_safetensors(u, "cpu", framework="numpy")):
        with pytest.raises(ValueError, match=r"tiny.safetensors: 2 bytes is too short"):
            call(f"{server.url}/tiny.safetensors")
    # An index naming a shard by URL is refused: shards are relative to the index.
    server.objects["/bad/model.safetensors.index.json"] = (
        b'{"weight_map": {"x": "http://127.0.0.1:1/elsewhere.safetensors"}}'
    )
    with pytest.raises(CheckpointError, match=r"outside the index's directory"):
        load_checkpoint(f"{server.url}/bad/", "cpu", framework="numpy")


def test_s3_checkpoints_through_moto(moto_s3, monkeypatch, tmp_path, rng):
    endpoint, _, put = moto_s3
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    tensors = _model(rng, layers=2)
    directory = _save_sharded(tensors, str(tmp_path / "ckpt"), shards=2)
    for name in os.listdir(directory):
        with open(os.path.join(directory, name), "rb") as f:
            put(f"models/llama/{name}", f.read())
    got = load_checkpoint("s3://gpumap-bucket/models/llama/", "cpu", framework="numpy")
    assert set(got) == set(tensors)
    for name, array in got.items():
        _same(array, tensors[name])


def test_s3_prefixes_are_listed_as_directories(moto_s3, monkeypatch, tmp_path, rng):
    """A prefix with no index: its *.safetensors objects, found by listing, make the checkpoint,
    as a local directory's files do; neighbours of the prefix and deeper levels are not read."""
    endpoint, _, put = moto_s3
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    tensors = _model(rng, layers=2)
    directory = _save_sharded(tensors, str(tmp_path / "ckpt"), shards=2)
    for name in os.listdir(directory):
        if name.endswith(".safetensors"):
            with open(os.path.join(directory, name), "rb") as f:
                put(f"plain/{name}", f.read())
    put("plain/README.md", b"not a shard")
    put("plain/old/model.safetensors", b"a level below: not read")
    put("plainer/model-9.safetensors", b"a neighbour: not read")
    got = load_checkpoint("s3://gpumap-bucket/plain/", "cpu", framework="numpy")
    local = load_checkpoint(directory, "cpu", framework="numpy")
    assert list(got) == list(local) and set(got) == set(tensors)
    for name, array in got.items():
        _same(array, tensors[name])
    with pytest.raises(CheckpointError, match=r"s3://gpumap-bucket/nothing/: no \*.safetensors file"):
        load_checkpoint("s3://gpumap-bucket/nothing/", "cpu", framework="numpy")
    put("two/a.safetensors.index.json", b"{}")
    put("two/b.safetensors.index.json", b"{}")
    with pytest.raises(CheckpointError, match="2 index files"):
        load_checkpoint("s3://gpumap-bucket/two/", "cpu", framework="numpy")


def test_a_urls_query_is_never_shown_and_names_go_in_its_path(server, published):
    """A presigned URL's query is a credential: errors show it as ``?…``, as RemoteFile.url
    does. A directory URL with a query reads the files beside it with the query kept."""
    url, directory, tensors = published
    secret = "X-Amz-Signature=TOPSECRET123"
    server.objects["/cut.safetensors"] = server.objects["/ckpt/model-00001-of-00003.safetensors"][:20]
    for call in (load_checkpoint, load_safetensors):
        with pytest.raises(ValueError) as caught:
            call(f"{server.url}/cut.safetensors?{secret}", "cpu", framework="numpy")
        assert "TOPSECRET123" not in str(caught.value) and "cut.safetensors?…" in str(caught.value)
    del server.objects["/ckpt/model-00003-of-00003.safetensors"]
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(f"{url}/model.safetensors.index.json?{secret}", "cpu", framework="numpy")
    assert "TOPSECRET123" not in str(caught.value) and "model-00003-of-00003.safetensors" in str(caught.value)
    # The server ignores queries: the directory's index and shards are found under its path.
    server.objects["/ckpt/model-00003-of-00003.safetensors"] = open(
        os.path.join(directory, "model-00003-of-00003.safetensors"), "rb"
    ).read()
    got = load_checkpoint(f"{url}/?{secret}", "cpu", framework="numpy")
    assert set(got) == set(tensors)

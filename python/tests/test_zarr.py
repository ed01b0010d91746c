"""The Zarr v3 store on NumPy buffers (GPU buffers are in test_gpu.py)."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

zarr = pytest.importorskip("zarr", minversion="3")

from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest  # noqa: E402
from zarr.core.buffer.core import default_buffer_prototype  # noqa: E402

from gpumapio.zarr import GDSStore, GpumapStore  # noqa: E402


def test_array_round_trip_both_ways(tmp_path, rng):
    data = rng.standard_normal((97, 61)).astype("f4")
    ours = zarr.create_array(GpumapStore(tmp_path / "a.zarr"), shape=data.shape, chunks=(10, 16), dtype="f4")
    ours[:] = data
    # zarr's own LocalStore reads what ours wrote, and the reverse
    theirs = zarr.open_array(zarr.storage.LocalStore(tmp_path / "a.zarr"), mode="r")
    np.testing.assert_array_equal(theirs[:], data)
    local = zarr.create_array(zarr.storage.LocalStore(tmp_path / "b.zarr"), shape=data.shape, chunks=(7, 9), dtype="f4")
    local[:] = data
    back = zarr.open_array(GpumapStore(tmp_path / "b.zarr", read_only=True), mode="r")
    np.testing.assert_array_equal(back[:], data)
    np.testing.assert_array_equal(back[13:41, 5:50], data[13:41, 5:50])
    assert GDSStore is GpumapStore


def test_byte_ranges_and_missing_keys(tmp_path):
    asyncio.run(_byte_ranges_and_missing_keys(tmp_path))


async def _byte_ranges_and_missing_keys(tmp_path):
    store = await GpumapStore.open(tmp_path / "s")
    proto = default_buffer_prototype()
    payload = bytes(range(256)) * 40
    await store.set("k", proto.buffer.from_bytes(payload))
    assert (await store.get("k", proto)).to_bytes() == payload
    for request, want in [
        (RangeByteRequest(10, 1000), payload[10:1000]),
        (OffsetByteRequest(9000), payload[9000:]),
        (SuffixByteRequest(77), payload[-77:]),
        (RangeByteRequest(10_000, 20_000), payload[10_000:]),
            (RangeByteRequest(20_000, 30_000), b""),
        (OffsetByteRequest(50_000), b""),
    ]:
        got = await store.get("k", proto, request)
        assert got.to_bytes() == want, request
    for request in [OffsetByteRequest(-3), RangeByteRequest(-5, 3), RangeByteRequest(5, 2), SuffixByteRequest(-1)]:
        with pytest.raises(ValueError, match="byte"):
            await store.get("k", proto, request)
    assert await store.get("missing", proto) is None
    assert await store.get("", proto) is None  # a directory
    parts = await store.get_partial_values(proto, [("k", RangeByteRequest(0, 3)), ("missing", None)])
    assert parts[0].to_bytes() == payload[:3] and parts[1] is None
    await store.set_if_not_exists("k", proto.buffer.from_bytes(b"other"))
    assert (await store.get("k", proto)).to_bytes() == payload
    assert sorted([k async for k in store.list()]) == ["k"]
    assert "GpumapStore" in repr(store)


def test_sync_interface(tmp_path):
    store = GpumapStore(tmp_path / "s")
    if not hasattr(store, "get_sync"):
        pytest.skip("this zarr has no synchronous store interface")
    proto = default_buffer_prototype()
    store.set_sync("x/y", proto.buffer.from_bytes(b"abc"))
    assert store.get_sync("x/y", prototype=proto).to_bytes() == b"abc"
    assert store.get_sync("nope") is None


# Keys that named paths outside the store, or not a value in it, through `root / key` (zarr's
# LocalStore checks none of them): each must now be a ValueError naming the key.
BAD_KEYS = ["../escape", "a/../../escape", "/abs", "a//b", "./a", "a/./b", "a/..", "a\\b", "a\x00b",
            "\ud800", "x" * 256, "a/", ""]


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
def test_keys_cannot_leave_the_store(tmp_path, key):
    store = GpumapStore(tmp_path / "store")
    proto = default_buffer_prototype()
    key = key.replace("/abs", str(tmp_path / "abs"))  # an absolute path inside the test's directory
    with pytest.raises(ValueError, match="zarr key|empty key") as refused:
        store.set_sync(key, proto.buffer.from_bytes(b"outside"))
    if key:
        assert repr(key)[:40] in str(refused.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"], "nothing written beside the store"
    assert not any(p.is_file() for p in (tmp_path / "store").rglob("*"))
    for call in (
        lambda: store.get_sync(key, prototype=proto),
        lambda: asyncio.run(store.delete(key)),
        lambda: asyncio.run(store.getsize(key)),
    ):
        if key:  # "" is the root for get (None, a directory) and may not be deleted
            with pytest.raises(ValueError):
                call()


def test_prefixes_may_end_with_a_slash_and_the_root_is_empty(tmp_path):
    async def go():
        store = await GpumapStore.open(tmp_path / "s")
        proto = default_buffer_prototype()
        await store.set("g/a/zarr.json", proto.buffer.from_bytes(b"{}"))
        assert [k async for k in store.list_prefix("g/")] == ["g/a/zarr.json"]
        assert [k async for k in store.list_dir("g/")] == ["a"]
        assert [k async for k in store.list_dir("")] == ["g"]
        assert await store.get("", proto) is None and not await store.exists("")
        with pytest.raises(ValueError, match="'../'"):
            [k async for k in store.list_dir("../")]
        await store.delete_dir("g/")
        assert [k async for k in store.list_prefix("")] == []

    asyncio.run(go())


def test_names_up_to_the_file_system_limit_are_written(tmp_path):
    # The temporary file of a write was named after the key plus 41 bytes, so a key whose last
    # name had 215 to 255 bytes failed with ENAMETOOLONG although the key itself fits.
    store = GpumapStore(tmp_path / "s")
    proto = default_buffer_prototype()
    for key in ["x" * 255, "g/" + "é" * 127]:
        store.set_sync(key, proto.buffer.from_bytes(b"long"))
        assert store.get_sync(key, prototype=proto).to_bytes() == b"long"
    assert sorted(p.name for p in (tmp_path / "s").rglob("*") if p.is_file()) == sorted(["x" * 255, "é" * 127])


def test_symlinks_that_lead_outside_the_root_are_refused(tmp_path):
    # A key whose names are all fine could still reach outside through a symlink in the root.
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_bytes(b"SECRET")
    store = GpumapStore(tmp_path / "store")
    proto = default_buffer_prototype()
    store.set_sync("g/a", proto.buffer.from_bytes(b"inside"))
    (tmp_path / "store" / "out").symlink_to(tmp_path / "outside")
    (tmp_path / "store" / "leaf").symlink_to(tmp_path / "outside" / "secret")
    (tmp_path / "store" / "same").symlink_to(tmp_path / "store" / "g")  # stays inside: fine
    for key in ("out/secret", "out/new", "out/new/deeper", "leaf", "out"):
        for call in (
            lambda: store.get_sync(key, prototype=proto),
            lambda: store.set_sync(key, proto.buffer.from_bytes(b"planted")),
            lambda: store.delete_sync(key),
            lambda: asyncio.run(store.delete(key)),
            lambda: asyncio.run(store.exists(key)),
            lambda: asyncio.run(store.getsize(key)),
        ):
            with pytest.raises(ValueError, match=f"zarr key '{key}' leads outside"):
                call()
    with pytest.raises(ValueError, match="leads outside"):
        asyncio.run(store.delete_dir("out"))
    assert sorted(p.name for p in (tmp_path / "outside").iterdir()) == ["secret"]
    assert (tmp_path / "outside" / "secret").read_bytes() == b"SECRET"
    assert store.get_sync("same/a", prototype=proto).to_bytes() == b"inside"
    store.set_sync("same/b", proto.buffer.from_bytes(b"also inside"))
    assert (tmp_path / "store" / "g" / "b").read_bytes() == b"also inside"


def test_listings_skip_the_temporary_files_of_writes(tmp_path, monkeypatch):
    import gpumapio.zarr as gz

    store = GpumapStore(tmp_path / "s")
    proto = default_buffer_prototype()
    store.set_sync("arr/c/0", proto.buffer.from_bytes(b"v"))

    async def listings():
        return ([k async for k in store.list()], [k async for k in store.list_prefix("arr")],
                [k async for k in store.list_dir("arr/c")])

    # A write in flight: listed while its temporary file exists, before the rename.
    seen = []
    replace = os.replace

    def listing_replace(src, dst):
        assert os.path.exists(src)
        seen.append(asyncio.run(listings()))
        replace(src, dst)

    monkeypatch.setattr(gz.os, "replace", listing_replace)
    store.set_sync("arr/c/1", proto.buffer.from_bytes(b"w"))
    monkeypatch.undo()
    assert seen == [(["arr/c/0"], ["arr/c/0"], ["0"])]
    # One left behind by a writer that died.
    (tmp_path / "s" / "arr" / "c" / f".{'0a' * 16}.partial").write_bytes(b"half")
    lists = asyncio.run(listings())
    assert [sorted(x) for x in lists] == [["arr/c/0", "arr/c/1"], ["arr/c/0", "arr/c/1"], ["0", "1"]]
    # No key may hold such a name; names only like it are keys.
    for key in (f".{'0a' * 16}.partial", f"g/.{'f' * 32}.partial/x"):
        with pytest.raises(ValueError, match="temporary files"):
            store.set_sync(key, proto.buffer.from_bytes(b"x"))
    alike = [".zarray", ".x.partial", f".{'0A' * 16}.partial", f"{'0a' * 16}.partial", f".{'0a' * 15}.partial"]
    for key in alike:
        store.set_sync(key, proto.buffer.from_bytes(b"x"))
    assert sorted(asyncio.run(listings())[0]) == sorted(["arr/c/0", "arr/c/1", *alike])


def test_keys_too_deep_or_too_long_for_a_write_are_value_errors(tmp_path):
    # A key 1500 names deep failed with RecursionError (Path.mkdir(parents=True)); one whose path
    # fit while its write's temporary file's did not, with ENAMETOOLONG.
    root = tmp_path / "s"
    store = GpumapStore(root)
    proto = default_buffer_prototype()
    value = proto.buffer.from_bytes(b"v")
    store.set_sync("/".join(["c"] * 256), value)
    assert store.get_sync("/".join(["c"] * 256), prototype=proto).to_bytes() == b"v"
    for depth in (257, 1500):
        with pytest.raises(ValueError, match=rf"zarr key 'c/c/.* {depth} names deep"):
            store.set_sync("/".join(["c"] * depth), value)
    # A path of 4094 bytes: names of 255 bytes, and a last one of 10 or 11, shorter than the
    # temporary file's name.
    budget = 4094 - len(os.fsencode(root))
    for last in (10, 11):
        remaining = budget - (last + 1)
        if remaining % 256 != 1:
            break
    names = ["d" * 255] * (remaining // 256) + (["d" * (remaining % 256 - 1)] if remaining % 256 else [])
    key = "/".join([*names, "x" * last])
    assert len(os.fsencode(root / key)) == 4094
    with pytest.raises(ValueError, match=r"zarr key 'ddd.*temporary file"):
        store.set_sync(key, value)
    assert not (root / ("d" * 255)).exists()


def test_getsize_of_a_directory_is_file_not_found(tmp_path):
    store = GpumapStore(tmp_path / "s")
    proto = default_buffer_prototype()
    store.set_sync("grp/zarr.json", proto.buffer.from_bytes(b"{}"))
    assert asyncio.run(store.getsize("grp/zarr.json")) == 2
    for key in ("grp", "grp/zarr.json/x", "missing"):
        with pytest.raises(FileNotFoundError):
            asyncio.run(store.getsize(key))

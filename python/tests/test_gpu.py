"""GPU memory through CuPy and PyTorch, compared byte for byte with what is on disk. Every test
skips visibly without a GPU (or without CuPy / PyTorch) and fails instead under
GPUMAP_REQUIRE_GPU=1; the cuFile tests also need cuFile (GPUMAP_REQUIRE_CUFILE=1 to insist)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import gpumapio
import gpumapio as kvikio
from conftest import need_cufile, need_gpu

ODD = [1, 4095, 4097, 65537, (1 << 20) + 3, (3 << 20) + 1]


def _modes():
    modes = [kvikio.CompatMode.ON, kvikio.CompatMode.AUTO]
    if gpumapio.capabilities()["cufile_usable"]:
        modes.append(kvikio.CompatMode.OFF)
    return modes


@pytest.mark.parametrize("mode", [m.name for m in _modes()])
@pytest.mark.parametrize("size", ODD)
def test_cupy_read_and_write(data_file, tmp_path, mode, size):
    cp = need_gpu("cupy")
    path, data = data_file
    offset = 4093
    with kvikio.defaults.set("compat_mode", kvikio.CompatMode[mode]):
        dst = cp.zeros(size, dtype=cp.uint8)
        with kvikio.CuFile(path, "r") as f:
            got = f.read(dst, size, offset)
        want = data[offset : offset + size]
        assert got == len(want)
        assert cp.asnumpy(dst[:got]).tobytes() == want
        out = tmp_path / f"out-{mode}-{size}.bin"
        with kvikio.CuFile(out, "w") as f:
            assert f.write(dst[:got], got, 7) == got
        assert out.read_bytes() == b"\0" * 7 + want


def test_cupy_small_futures_are_coalesced_and_correct(data_file, rng):
    cp = need_gpu("cupy")
    path, data = data_file
    n, block = 2048, 4096
    offsets = (rng.integers(0, len(data) // block, size=n) * block).tolist()
    dst = cp.zeros(n * block, dtype=cp.uint8)
    with kvikio.CuFile(path, "r") as f:
        futures = [f.pread(dst[i * block : (i + 1) * block], block, o) for i, o in enumerate(offsets)]
        assert sum(fu.get() for fu in futures) == n * block
    host = cp.asnumpy(dst)
    for i, o in enumerate(offsets):
        assert host[i * block : (i + 1) * block].tobytes() == data[o : o + block]


def test_cupy_small_preads_waited_in_any_order_from_threads_some_dropped(data_file, rng):
    """Small reads queued to be coalesced, each waited by whichever thread gets it (which then
    reads it itself if no drainer has yet), in random orders; a fifth are dropped unwaited and
    still land."""
    cp = need_gpu("cupy")
    path, data = data_file
    sizes = [1, 100, 4096, 4097, 65536]
    count = 500
    offsets = rng.integers(0, len(data) + 10_000, size=count).tolist()
    dsts = [cp.full(sizes[i % len(sizes)], 0xCD, dtype=cp.uint8) for i in range(count)]
    dropped = set(rng.choice(count, size=count // 5, replace=False).tolist())
    hands = [[] for _ in range(4)]
    got = {}
    errors = []
    with kvikio.CuFile(path, "r") as f:
        for i, (dst, offset) in enumerate(zip(dsts, offsets)):
            future = f.pread(dst, dst.nbytes, offset)
            if i not in dropped:
                hands[int(rng.integers(0, 4))].append((i, future))
            del future
        for hand in hands:
            rng.shuffle(hand)

        def wait(hand):
            try:
                for i, future in hand:
                    got[i] = future.get()
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=wait, args=(hand,)) for hand in hands]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors

    def expected(i):
        want = data[offsets[i] : offsets[i] + dsts[i].nbytes]
        return want + b"\xcd" * (dsts[i].nbytes - len(want))

    for i in range(count):
        if i in dropped:
            continue
        assert got[i] == min(dsts[i].nbytes, max(0, len(data) - offsets[i])), i
        assert cp.asnumpy(dsts[i]).tobytes() == expected(i), i
    # The dropped ones finish in the background.
    deadline = time.monotonic() + 30
    for i in sorted(dropped):
        while cp.asnumpy(dsts[i]).tobytes() != expected(i):
            assert time.monotonic() < deadline, f"dropped read {i} never landed"
            time.sleep(0.01)


def test_cupy_future_from_other_threads(data_file):
    cp = need_gpu("cupy")
    path, data = data_file
    dst = cp.zeros(len(data), dtype=cp.uint8)
    with kvikio.CuFile(path, "r") as f:
        future = f.pread(dst)
        got = []
        threads = [threading.Thread(target=lambda: got.append(future.get())) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert got == [len(data)] * 4
    assert cp.asnumpy(dst).tobytes() == data


def test_exporter_stream_is_synchronized(tmp_path):
    cp = need_gpu("cupy")
    n = 64 << 20
    path = tmp_path / "s.bin"
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        a = cp.empty(n, dtype=cp.uint8)
        for value in range(1, 40):  # queue plenty of work on the stream
            a.fill(value)
        # CuPy names `stream` in __cuda_array_interface__; gpumap must wait for it.
        with kvikio.CuFile(path, "w") as f:
            assert f.write(a) == n
    data = np.fromfile(path, dtype=np.uint8)
    assert (data == 39).all()


class DLPackOnly:
    def __init__(self, array):
        self.array = array

    def __dlpack__(self, *args, **kwargs):
        return self.array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_cupy_through_dlpack(data_file):
    cp = need_gpu("cupy")
    path, data = data_file
    dst = cp.zeros((333, 7), dtype=cp.int16)
    with kvikio.CuFile(path, "r") as f:
        assert f.read(DLPackOnly(dst), file_offset=5) == dst.nbytes
    assert cp.asnumpy(dst).tobytes() == data[5 : 5 + dst.nbytes]


def test_torch_tensors(data_file, tmp_path):
    torch = need_gpu("torch")
    path, data = data_file
    t = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    view = t[12345 : 12345 + 500_000]  # a view with a storage offset
    with kvikio.CuFile(path, "r") as f:
        assert f.read(view, file_offset=99) == 500_000
    assert view.cpu().numpy().tobytes() == data[99 : 99 + 500_000]
    assert not t[:12345].any().item()
    floats = torch.randn(4097, device="cuda")
    out = tmp_path / "t.bin"
    with kvikio.CuFile(out, "w") as f:
        assert f.pwrite(floats).get() == floats.numel() * 4
    assert out.read_bytes() == floats.cpu().numpy().tobytes()


def test_raw_read_async_on_foreign_and_own_streams(data_file):
    cp = need_gpu("cupy")
    path, data = data_file
    dst = cp.zeros(1 << 20, dtype=cp.uint8)
    s = cp.cuda.Stream(non_blocking=True)
    with kvikio.CuFile(path, "r") as f:
        fut = f.raw_read_async(dst, s.ptr, 100_000, 3, 10)
        assert fut.check_bytes_done() == 100_000
        assert cp.asnumpy(dst[10:100_010]).tobytes() == data[3:100_003]
        own = gpumapio.cufile_driver.Stream()
        fut = f.raw_read_async(dst, own, 1 << 20, 0, 0)
        assert fut.check_bytes_done() == 1 << 20
        own.synchronize()
    assert cp.asnumpy(dst).tobytes() == data[: 1 << 20]


def test_read_file_to_device_outputs(data_file):
    cp = need_gpu("cupy")
    path, data = data_file
    out = gpumapio.read_file_to_device(path)
    assert isinstance(out, cp.ndarray) and cp.asnumpy(out).tobytes() == data
    part = gpumapio.read_file_to_device(path, offset=17, size=1 << 20, output="cupy")
    assert cp.asnumpy(part).tobytes() == data[17 : 17 + (1 << 20)]
    torch = need_gpu("torch")
    t = gpumapio.read_file_to_device(path, output="torch")
    assert t.is_cuda and t.cpu().numpy().tobytes() == data


def test_load_safetensors_on_cuda_matches_safetensors(tmp_path):
    torch = need_gpu("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    g = torch.Generator().manual_seed(7)
    tensors = {
        f"layer{i}.weight": torch.randn(257, 129 + i, generator=g).to(dt)
        for i, dt in enumerate([torch.float32, torch.float16, torch.bfloat16, torch.float64] * 3)
    }
    tensors["ids"] = torch.arange(1001, dtype=torch.int64)
    tensors["mask"] = torch.rand(33, generator=g) > 0.5
    tensors["scalar"] = torch.tensor(2.5)
    tensors["empty"] = torch.zeros(0, 3)
    path = tmp_path / "m.safetensors"
    st_torch.save_file(tensors, str(path))
    ref = st_torch.load_file(str(path), device="cuda")
    got = gpumapio.load_safetensors(path, device="cuda")
    assert got.keys() == ref.keys()
    storages = {t.untyped_storage().data_ptr() for t in got.values() if t.numel()}
    assert len(storages) == 1, "one allocation"
    for name in ref:
        assert got[name].device.type == "cuda" and got[name].dtype == ref[name].dtype
        assert torch.equal(got[name], ref[name]), name
    sub = gpumapio.load_safetensors(path, device=0, tensors=["ids", "layer3.weight"])
    assert set(sub) == {"ids", "layer3.weight"}
    assert torch.equal(sub["layer3.weight"], ref["layer3.weight"])


def test_zarr_gpu_buffers(tmp_path):
    cp = need_gpu("cupy")
    zarr = pytest.importorskip("zarr", minversion="3")
    from gpumapio.zarr import GpumapStore

    data = np.arange(100_000, dtype="f4").reshape(250, 400)
    z = zarr.create_array(
        GpumapStore(tmp_path / "g.zarr"), shape=data.shape, chunks=(64, 128), dtype="f4", compressors=None
    )
    z[:] = data
    with zarr.config.enable_gpu():
        g = zarr.open_array(GpumapStore(tmp_path / "g.zarr"), mode="r")
        block = g[10:200, 5:333]
        assert isinstance(block, cp.ndarray)
        np.testing.assert_array_equal(cp.asnumpy(block), data[10:200, 5:333])
        w = zarr.create_array(
            GpumapStore(tmp_path / "w.zarr"), shape=(300,), chunks=(64,), dtype="i4", compressors=None
        )
        w[:] = cp.arange(300, dtype=cp.int32)
    back = zarr.open_array(zarr.storage.LocalStore(tmp_path / "w.zarr"), mode="r")
    np.testing.assert_array_equal(back[:], np.arange(300, dtype=np.int32))


def test_cufile_low_level(data_file, tmp_path):
    cp = need_gpu("cupy")
    need_cufile()
    from gpumapio import cufile_driver

    path, data = data_file
    cufile_driver.driver_open()
    props = cufile_driver.properties()
    assert props.library
    dst = cp.zeros(1 << 20, dtype=cp.uint8)
    with cufile_driver.Handle(path, "r") as h:
        assert h.read(dst, 65536, 4096, 4096) == 65536
        assert cp.asnumpy(dst[4096 : 4096 + 65536]).tobytes() == data[4096 : 4096 + 65536]
        pieces = [cp.zeros(4096, dtype=cp.uint8) for _ in range(8)]
        results = h.read_batch([(p, i * 8192) for i, p in enumerate(pieces)])
        assert results == [4096] * 8
        for i, p in enumerate(pieces):
            assert cp.asnumpy(p).tobytes() == data[i * 8192 : i * 8192 + 4096]
        stream = cufile_driver.Stream()
        fut = h.read_async(dst, stream, 1 << 20, 0, 0)
        assert fut.check_bytes_done() == 1 << 20
        assert cp.asnumpy(dst).tobytes() == data[: 1 << 20]
    with cufile_driver.buf_register(dst) as reg:
        assert reg.length == dst.nbytes
        with kvikio.CuFile(path, "r") as f:
            assert f.read(dst) == dst.nbytes
    out = tmp_path / "cf.bin"
    with cufile_driver.Handle(out, "w") as h:
        assert h.write(dst, 8192, 0, 0) == 8192
        fut = h.write_async(dst, cufile_driver.Stream(), 4096, 8192, 0)
        assert fut.check_bytes_done() == 4096
    assert out.read_bytes() == data[:8192] + data[:4096]
    kvikio.buffer.memory_register(dst)
    kvikio.buffer.memory_deregister(dst)


def test_cufile_driver_set_reaches_the_driver():
    need_gpu()
    need_cufile()
    from gpumapio import cufile_driver

    props = cufile_driver.properties
    old = {name: cufile_driver.get(name) for name in ("poll_mode", "poll_thresh_size",
                                                        "max_device_cache_size", "max_pinned_memory_size")}
    new = {"poll_mode": not old["poll_mode"], "poll_thresh_size": old["poll_thresh_size"] + 4,
           "max_device_cache_size": old["max_device_cache_size"], "max_pinned_memory_size": old["max_pinned_memory_size"]}
    with cufile_driver.set(new):
        for name, value in new.items():
            assert cufile_driver.get(name) == value
    for name, value in old.items():
        assert getattr(props, name) == value


def test_numpy_fromfile_like_cupy(tmp_path):
    cp = need_gpu("cupy")
    from gpumapio import numpy as gnp

    a = np.arange(100_003, dtype="<f4")
    path = tmp_path / "f.bin"
    a.tofile(path)
    got = gnp.fromfile(path, dtype="<f4", like=cp.empty(()))
    assert isinstance(got, cp.ndarray)
    np.testing.assert_array_equal(cp.asnumpy(got), a)
    gnp.tofile(got[::2], tmp_path / "g.bin")  # not contiguous: made so first
    assert (tmp_path / "g.bin").read_bytes() == a[::2].tobytes()

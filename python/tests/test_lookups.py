"""Kernels of one's own looking rows up in the GPU page cache (``lookup_scope``, the header of
``gpumapio.include_dir()``), and gathers whose misses are read in place
(``zero_copy="misses"``): the header shipped is the library's, a host cache has no scope, and on
the GPU a CuPy kernel following the header finds resident rows byte for byte."""

from __future__ import annotations

import os
import pathlib
import sys

import numpy as np
import pytest

import gpumapio
from conftest import need_gpu

MIB = 1 << 20
REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python" / "examples"))


def test_the_shipped_header_is_the_librarys():
    shipped = pathlib.Path(gpumapio.include_dir()) / "gpumap_table.h"
    source = REPO / "crates" / "gpumap" / "kernels" / "gpumap_table.h"
    assert shipped.read_bytes() == source.read_bytes(), (
        "python/gpumapio/include/gpumap_table.h differs from crates/gpumap/kernels/gpumap_table.h: copy it"
    )


def test_a_host_cache_has_no_lookup_scope(tmp_path):
    path = tmp_path / "t.bin"
    path.write_bytes(bytes(range(256)) * 64)
    m = gpumapio.map(path, device="host", budget=2 * MIB, frame_size=2 * MIB, extent_size=4096)
    with pytest.raises(gpumapio.UnavailableError, match="lookup scope"):
        m.lookup_scope()
    cache = gpumapio.DeviceCache(budget=2 * MIB, frame_size=2 * MIB, extent_size=4096, device="host")
    with pytest.raises(gpumapio.UnavailableError, match="lookup scope"):
        cache.lookup_scope()


def test_misses_in_place_on_host_match_the_file(tmp_path, rng):
    data = rng.integers(0, 256, size=5000 * 300, dtype="u1")
    path = tmp_path / "rows.bin"
    data.tofile(path)
    m = gpumapio.map(path, device="host", budget=2 * MIB, frame_size=2 * MIB, extent_size=4096,
                     zero_copy="misses")
    for seed in range(3):
        idx = np.random.default_rng(seed).integers(0, 5000, size=2000)
        out = np.empty((idx.size, 300), dtype="u1")
        m.gather_rows(idx, 300, out)
        assert np.array_equal(out, data.reshape(5000, 300)[idx])
    assert m.stats()["rows_read_through"] > 0
    with pytest.raises(ValueError, match="zero_copy"):
        gpumapio.map(path, device="host", zero_copy="sometimes")


def test_own_kernel_finds_resident_rows(tmp_path):
    cp = need_gpu("cupy")
    import lookup_kernel

    rng = np.random.default_rng(3)
    rows, row_size = 20_000, 512
    table = rng.standard_normal(rows * row_size // 4, dtype=np.float32)
    path = tmp_path / "table.f32"
    table.tofile(path)
    reference = table.reshape(rows, row_size // 4)
    m = gpumapio.map(path, budget=4 * MIB, frame_size=2 * MIB, extent_size=4096)
    kernel = cp.RawKernel(lookup_kernel.KERNEL, "sum_rows", options=("-I" + gpumapio.include_dir(),))
    stream = cp.cuda.Stream(non_blocking=True)
    ids = rng.integers(0, 2000, size=5000)
    indices = cp.asarray(ids, dtype=cp.int64)
    first, missed_first = lookup_kernel.sums_with_own_kernel(cp, kernel, m, indices, row_size, stream)
    assert missed_first > 0, "a fresh cache holds nothing"
    second, missed_second = lookup_kernel.sums_with_own_kernel(cp, kernel, m, indices, row_size, stream)
    # The first batch's misses were gathered through the cache: the second finds them resident.
    assert missed_second == 0
    want = reference[ids].sum(axis=1)
    for sums in (first, second):
        np.testing.assert_allclose(cp.asnumpy(sums), want, rtol=1e-4, atol=1e-3)
    # The scope of a shared cache numbers each map.
    cache = gpumapio.DeviceCache(budget=4 * MIB, frame_size=2 * MIB, extent_size=4096)
    a, b = cache.open(path), cache.open(path)
    with cache.lookup_scope(stream=stream) as scope:
        assert scope.table != 0
        assert scope.file_number(a) != scope.file_number(b)
        with pytest.raises(ValueError, match="another cache"):
            scope.file_number(m)


def test_own_kernel_example_runs():
    need_gpu("cupy")
    import subprocess

    example = REPO / "python" / "examples" / "lookup_kernel.py"
    done = subprocess.run([sys.executable, str(example), "--size", "64MiB", "--budget", "16MiB",
                           "--batch", "20000", "--batches", "3"], capture_output=True, text=True,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every sum checked against NumPy" in done.stdout


def test_misses_in_place_on_the_gpu_match_the_file(tmp_path, rng):
    cp = need_gpu("cupy")
    data = rng.integers(0, 256, size=20_000 * 512, dtype="u1")
    path = tmp_path / "rows.bin"
    data.tofile(path)
    m = gpumapio.map(path, budget=2 * MIB, frame_size=2 * MIB, extent_size=4096, zero_copy="misses")
    stream = cp.cuda.Stream(non_blocking=True)
    for seed in range(4):
        ids = np.random.default_rng(seed).integers(0, 4000 if seed % 2 else 20_000, size=30_000)
        for dtype in (cp.int32, cp.int64):
            out = cp.empty((ids.size, 512), dtype=cp.uint8)
            m.gather_rows(cp.asarray(ids, dtype=dtype), 512, out, stream=stream)
            assert np.array_equal(cp.asnumpy(out), data.reshape(20_000, 512)[ids])
        m.wait_for_admissions()
    stats = m.stats()
    assert stats["rows_read_through"] > 0 and stats["hits"] > 0, stats

"""zarr's own store conformance suite (``zarr.testing.store.StoreTests``) against
``gpumapio.zarr.GDSStore``, with zarr's host buffers here and its GPU buffers (CuPy) where a GPU
is present. Runs with whatever zarr 3.x is installed (CI installs the newest); every store lives
in pytest's tmp_path."""

from __future__ import annotations

import pathlib

import pytest

pytest.importorskip("zarr")
pytest.importorskip("pytest_asyncio", reason="zarr's StoreTests are async tests (pytest-asyncio)")

from zarr.core.buffer import cpu  # noqa: E402
from zarr.testing.store import StoreTests  # noqa: E402

from gpumapio.zarr import GDSStore  # noqa: E402


class _GDSStoreSuite(StoreTests[GDSStore, cpu.Buffer]):
    """The parts zarr leaves to each store: how the suite reads and writes keys behind the
    store's back (straight to the files), and what the store says about itself."""

    store_cls = GDSStore

    async def get(self, store: GDSStore, key: str) -> cpu.Buffer:
        return self.buffer_cls.from_bytes((pathlib.Path(store.root) / key).read_bytes())

    async def set(self, store: GDSStore, key: str, value) -> None:
        path = pathlib.Path(store.root) / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(value.to_bytes())

    @pytest.fixture
    def store_kwargs(self, tmp_path) -> dict:
        return {"root": str(tmp_path)}

    def test_store_repr(self, store: GDSStore) -> None:
        assert repr(store) == f"GpumapStore('{store}')"
        assert str(store) == f"file://{pathlib.Path(store.root).as_posix()}"

    def test_store_supports_writes(self, store: GDSStore) -> None:
        assert store.supports_writes

    def test_store_supports_listing(self, store: GDSStore) -> None:
        assert store.supports_listing


class TestGDSStoreHostBuffers(_GDSStoreSuite):
    buffer_cls = cpu.Buffer


def _gpu_buffer_class():
    """zarr's GPU buffer class, or a visible skip (a failure under GPUMAP_REQUIRE_GPU=1)."""
    from conftest import need_gpu

    need_gpu("cupy")
    from zarr.core.buffer import gpu

    return gpu.Buffer


class TestGDSStoreGPUBuffers(_GDSStoreSuite):
    """The same suite with the values the tests write held in GPU memory (CuPy)."""

    @pytest.fixture(autouse=True)
    def _gpu_buffers(self):
        type(self).buffer_cls = _gpu_buffer_class()
        yield

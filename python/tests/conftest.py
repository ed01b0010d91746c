"""Shared fixtures. GPU tests skip visibly (reason in pytest's -rs summary) without a GPU,
CuPy or PyTorch, and fail instead when GPUMAP_REQUIRE_GPU=1."""

from __future__ import annotations

import importlib
import os

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

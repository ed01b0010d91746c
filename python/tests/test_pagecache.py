"""gpumapio.pagecache: residency, warm, evict, drop_all, lock, and KvikIO's calls."""

from __future__ import annotations

import errno
import os

import pytest

from gpumapio import pagecache


@pytest.fixture
def cached_file(tmp_path):
    path = tmp_path / "pc.bin"
    path.write_bytes(os.urandom(1 << 20))
    return path


def _known_or_skip(r: pagecache.Residency) -> int:
    if r.cached_pages is None:
        pytest.skip(f"the kernel will not report residency here: {r.unknown_reason}")
    return r.cached_pages


def test_residency_is_a_dataclass_with_counts(cached_file):
    r = pagecache.residency(cached_file)
    assert isinstance(r, pagecache.Residency)
    assert r.offset == 0 and r.length == 1 << 20 and r.file_size == 1 << 20
    assert r.page_size == pagecache.page_size()
    assert r.total_pages == (1 << 20) // r.page_size
    assert r.method in ("cachestat", "mincore")
    cached = _known_or_skip(r)
    assert 0 <= cached <= r.total_pages
    assert r.cached_bytes == cached * r.page_size
    part = pagecache.residency(cached_file, 4096, 8192, method="mincore")
    assert part.total_pages == 8192 // part.page_size and part.method == "mincore"


def test_evict_then_warm(cached_file):
    report = pagecache.evict(cached_file)
    assert isinstance(report, pagecache.EvictReport)
    assert report.before.total_pages == report.after.total_pages
    after = _known_or_skip(report.after)
    if after > report.after.total_pages // 2:
        pytest.skip(f"this file system keeps pages on DONTNEED ({after} still cached)")
    pagecache.warm(cached_file, wait=True)
    warm = pagecache.residency(cached_file)
    assert warm.cached_pages == warm.total_pages
    assert warm.fraction == 1.0


def test_file_descriptors_and_file_objects(cached_file):
    with open(cached_file, "rb") as f:
        by_obj = pagecache.residency(f)
        by_fd = pagecache.residency(f.fileno())
        assert by_obj.total_pages == by_fd.total_pages
        assert f.tell() == 0
        pagecache.warm(f, 0, 4096)


def test_ranges_past_the_end_and_bad_arguments(cached_file, tmp_path):
    with pytest.raises(ValueError, match="outside"):
        pagecache.residency(cached_file, 1 << 20, 1)
    with pytest.raises(FileNotFoundError):
        pagecache.residency(tmp_path / "missing")
    with pytest.raises(IsADirectoryError):
        pagecache.residency(tmp_path)
    with pytest.raises(TypeError):
        pagecache.residency(3.5)
    for flag in (True, False):  # not descriptors 1 and 0
        with pytest.raises(TypeError, match="bool"):
            pagecache.residency(flag)
        with pytest.raises(TypeError, match="bool"):
            pagecache.evict(flag)
    with pytest.raises(ValueError):
        pagecache.residency(cached_file, method="guess")
    with pytest.raises(OSError):
        pagecache.residency(10_000)  # not an open descriptor


def test_lock_and_unlock(cached_file):
    try:
        locked = pagecache.lock(cached_file, 0, 64 << 10)
    except OSError as e:
        assert e.errno in (errno.ENOMEM, errno.EPERM, errno.EAGAIN)
        pytest.skip(f"mlock refused here: {e}")
    with locked:
        assert locked.locked and locked.length == 64 << 10
        assert locked.locked_bytes >= 64 << 10
        r = pagecache.residency(cached_file, 0, 64 << 10)
        if r.cached_pages is not None:
            assert r.cached_pages == r.total_pages
    assert not locked.locked
    locked.unlock()  # again: nothing
    assert "LockedRange" in repr(locked)


def test_drop_all_works_or_says_why():
    try:
        pagecache.drop_all()
    except OSError as e:
        assert e.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
        assert "drop_caches" in str(e)
        assert pagecache.drop_system_page_cache(False) is False


def test_kvikio_page_cache_calls(cached_file):
    import gpumapio as kvikio

    try:
        cached, total = kvikio.get_page_cache_info(cached_file)
    except PermissionError as e:
        pytest.skip(f"residency unknown here: {e}")
    assert total == (1 << 20) // pagecache.page_size() and 0 <= cached <= total
    kvikio.drop_file_page_cache(cached_file)

"""Hostile numbers (issue 20): no memory is allocated by a caller's size before the size is
checked against the file, and allocations that fail are ``MemoryError`` (never an abort).

Cases that aborted the interpreter run in a child process, so a regression is a failed test.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gpumapio

MIB = 1 << 20


def run_child(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_map_read_longer_than_the_file_is_refused_before_any_allocation(tmp_path):
    path = tmp_path / "small.bin"
    path.write_bytes(os.urandom(3 * MIB))
    run = run_child(
        """
        import sys, gpumapio
        m = gpumapio.map(sys.argv[1], device="host")
        for offset, length in [(0, 2**62), (2**63, 2**63), (2**64 - 1, 1), (3 << 20, 1)]:
            try:
                m.read(offset, length)
            except ValueError as e:
                print("ValueError:", e)
            else:
                print("NO ERROR")
        """,
        str(path),
    )
    assert run.returncode == 0, f"the child died with status {run.returncode}:\n{run.stderr[-3000:]}"
    lines = run.stdout.splitlines()
    assert len(lines) == 4 and all(line.startswith("ValueError:") for line in lines), run.stdout
    assert all(str(3 * MIB) in line for line in lines), "each message names the file's length"


def test_a_map_read_too_large_for_memory_is_a_memory_error(tmp_path):
    """A range inside a (sparse) 1 TiB file, under an address-space limit: the bytes object
    cannot be allocated, which must be a MemoryError, not an abort."""
    path = tmp_path / "huge.bin"
    with open(path, "wb") as f:
        try:
            f.truncate(1 << 40)
        except OSError as e:
            pytest.skip(f"this file system holds no sparse 1 TiB file: {e}")
    run = run_child(
        """
        import resource, sys, gpumapio
        m = gpumapio.map(sys.argv[1], device="host", budget=8 << 20, frame_size=2 << 20)
        assert m.read(1 << 39, 4096) == bytes(4096)
        with open("/proc/self/status") as status:
            vm = next(int(l.split()[1]) * 1024 for l in status if l.startswith("VmSize:"))
        # Room for what the process has and a few GiB more, far from the 1 TiB asked for.
        resource.setrlimit(resource.RLIMIT_AS, (vm + (4 << 30), resource.RLIM_INFINITY))
        try:
            m.read(0, 1 << 40)
        except MemoryError as e:
            print("MemoryError:", e)
        else:
            print("NO ERROR")
        print(m.read(4096, 8) == bytes(8))
        """,
        str(path),
    )
    assert run.returncode == 0, f"the child died with status {run.returncode}:\n{run.stderr[-3000:]}"
    assert run.stdout.splitlines() == [run.stdout.splitlines()[0], "True"], run.stdout
    assert run.stdout.startswith("MemoryError"), run.stdout


def test_gather_checks_its_rows_before_it_allocates_the_output(tmp_path):
    path = tmp_path / "rows.bin"
    path.write_bytes(os.urandom(MIB))
    m = gpumapio.map(path, device="host")
    # Each would ask NumPy for the output first (1 TiB, a negative size, ...) without the checks.
    for offsets, length, match in [
        ([0], 1 << 40, "1048576"),
        ([0, 4096], -1, "negative"),
        ([-1], 16, "negative"),
        ([MIB - 8], 16, "1048576"),
        ([0] * 3, 2**64, "1048576"),
    ]:
        with pytest.raises(ValueError, match=match):
            gpumapio.gather(m, offsets, length)
    assert gpumapio.gather(m, [8], 8).tobytes() == path.read_bytes()[8:16]


def test_cache_gather_lengths_that_overflow_are_refused(tmp_path):
    path = tmp_path / "rows.bin"
    path.write_bytes(os.urandom(MIB))
    cache = gpumapio.DeviceCache(4 * MIB, device="host", frame_size=2 * MIB)
    m = cache.open(path)
    with pytest.raises(ValueError, match="overflow"):
        cache.gather([(m, 0, 2**63), (m, 0, 2**63)], bytearray(0))
    # Each range's counts are named by position, as the other calls' are (PyO3's u64 gave a
    # bare OverflowError for -1).
    with pytest.raises(ValueError, match=r"ranges\[1\] offset -1 is negative"):
        cache.gather([(m, 0, 1), (m, -1, 1)], bytearray(2))
    with pytest.raises(ValueError, match=r"ranges\[0\] length -5 is negative"):
        cache.gather([(m, 0, -5)], bytearray(2))
    with pytest.raises(TypeError, match=r"ranges\[0\] is not a \(file, offset, length\)"):
        cache.gather([(m, 0)], bytearray(2))
    out = bytearray(3)
    cache.gather([(m, 5, 1), (m, 7, 2)], out)
    assert bytes(out) == path.read_bytes()[5:6] + path.read_bytes()[7:9]


def test_read_file_to_device_checks_the_range_before_it_allocates(tmp_path):
    path = tmp_path / "small.bin"
    path.write_bytes(b"x" * 1000)
    # Without the check NumPy is asked for 1 TiB first (a MemoryError, or worse).
    with pytest.raises(EOFError) as e:
        gpumapio.read_file_to_device(path, size=1 << 40, output="numpy")
    assert "1000 bytes" in str(e.value) and str(1 << 40) in str(e.value), str(e.value)
    with pytest.raises(ValueError, match="negative"):
        gpumapio.read_file_to_device(path, size=-1, output="numpy")
    # A float was taken as it came (offset 1.5 read from byte 1.5?) and NumPy named a sum of it.
    for kwargs, name in (({"offset": 1.5}, "offset"), ({"offset": 1.0}, "offset"), ({"size": 4.5}, "size"), ({"size": True}, "size")):
        with pytest.raises(TypeError, match=rf"{name} must be an int, got (float|bool)"):
            gpumapio.read_file_to_device(path, output="numpy", **kwargs)
    assert gpumapio.read_file_to_device(path, offset=np.int64(998), output="numpy").tobytes() == b"xx"


def test_read_file_to_device_past_the_end_names_the_files_length(tmp_path):
    """Issue 20 item 4: ``offset=1<<40`` of a small file said "ended at 1099511627776"."""
    path = tmp_path / "small.bin"
    path.write_bytes(b"x" * (64 << 10))
    for size in (None, 10):
        with pytest.raises(EOFError) as e:
            gpumapio.read_file_to_device(path, offset=1 << 40, size=size, output="numpy")
        message = str(e.value)
        assert str(64 << 10) in message and str(1 << 40) in message, message
    assert gpumapio.read_file_to_device(path, offset=64 << 10, output="numpy").size == 0


# Issue 20 item 4: the end-of-file error names the file's length now, not the offset asked for.
def test_a_map_of_a_file_cut_short_names_the_files_length(tmp_path):
    path = tmp_path / "cut.bin"
    path.write_bytes(os.urandom(MIB))
    m = gpumapio.map(path, device="host", extent_size=4096)
    os.truncate(path, 4096)
    with pytest.raises(EOFError) as e:
        m.read(512 << 10, 65536)
    assert "4096" in str(e.value), str(e.value)


def test_numpy_fromfile_checks_offset_and_count_first(tmp_path):
    from gpumapio import numpy as gnp

    path = tmp_path / "f.bin"
    np.arange(100, dtype=np.int32).tofile(path)
    # A negative offset made the item count (and the array NumPy was asked for) huge.
    with pytest.raises(ValueError, match="offset"):
        gnp.fromfile(path, dtype=np.int32, offset=-(1 << 40))
    with pytest.raises(ValueError, match="count"):
        gnp.fromfile(path, dtype=np.int32, count=-2)
    assert gnp.fromfile(path, dtype=np.int32, count=3, offset=8).tolist() == [2, 3, 4]
    # A float offset was named as a sequence of integers, through the float it made of the size.
    for name, value in (("offset", 1.5), ("count", 2.0), ("offset", True)):
        with pytest.raises(TypeError, match=f"{name} must be an int"):
            gnp.fromfile(path, dtype=np.int32, **{name: value})
    assert gnp.fromfile(path, dtype=np.int32, count=np.int64(2), offset=np.uint8(4)).tolist() == [1, 2]


def test_numpy_fromfile_of_a_file_that_shrank_while_read_is_an_eof_error(tmp_path, monkeypatch):
    """fromfile sizes its array from the file's size, then reads: a file cut in between (here,
    a size taken larger than the file) is an EOFError, never an array with a tail of whatever
    the allocation held."""
    import gpumapio.numpy as gnp

    path = tmp_path / "cut.bin"
    path.write_bytes(b"\xab" * 4096)
    monkeypatch.setattr(gnp.os.path, "getsize", lambda p: 8192)
    with pytest.raises(EOFError, match="shrank"):
        gnp.fromfile(path, dtype=np.uint8)


def test_numpy_fromfile_and_tofile_use_an_open_files_position(tmp_path):
    """As NumPy does: a file object is read from its position (plus ``offset``) and written at
    it, without truncating, and left after what was read or written. tofile once reopened the
    file by name with "w", which cut away a header written through the file object."""
    from gpumapio import numpy as gnp

    path = tmp_path / "positioned.bin"
    with open(path, "wb") as f:
        f.write(b"HEADER!!")
        gnp.tofile(np.arange(4, dtype="<i4"), f)
        f.write(b"TAIL")
    assert path.read_bytes() == b"HEADER!!" + np.arange(4, dtype="<i4").tobytes() + b"TAIL"
    with open(path, "rb") as f:
        assert f.read(8) == b"HEADER!!"
        got = gnp.fromfile(f, dtype="<i4", count=3, offset=4)
        assert got.tolist() == [1, 2, 3]
        assert f.read() == b"TAIL"
    with open(path, "rb") as f:
        f.seek(8)
        assert gnp.fromfile(f, dtype="<i4").tolist() == np.fromfile(open(path, "rb"), dtype="<i4", offset=8).tolist()


def test_numpy_tofile_and_fromfile_use_the_file_a_file_object_has_open(tmp_path, monkeypatch):
    """A file object was reopened by its name: a file renamed after it was opened, or named
    relative to a working directory left since, had another file written in its place (lost
    bytes there); a file opened for reading was written; a TemporaryFile (its name a number)
    was refused. Its descriptor is used now, within what its mode allows."""
    import io
    import tempfile

    from gpumapio import numpy as gnp

    rows = np.arange(4, dtype="<i4")
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    # Renamed while open; another file takes its name.
    with open(here / "log.bin", "wb") as f:
        os.rename(here / "log.bin", here / "log.1.bin")
        (here / "log.bin").write_bytes(b"NEW LOG")
        gnp.tofile(rows, f)
    assert (here / "log.1.bin").read_bytes() == rows.tobytes()
    assert (here / "log.bin").read_bytes() == b"NEW LOG"
    # Named relative to a working directory left since.
    (there / "mine.bin").write_bytes(b"OTHER FILE, KEEP")
    monkeypatch.chdir(here)
    with open("mine.bin", "w+b") as f:
        monkeypatch.chdir(there)
        gnp.tofile(rows, f)
        f.seek(0)
        assert gnp.fromfile(f, dtype="<i4").tolist() == [0, 1, 2, 3]
    assert (here / "mine.bin").read_bytes() == rows.tobytes()
    assert (there / "mine.bin").read_bytes() == b"OTHER FILE, KEEP"
    # An unnamed file.
    with tempfile.TemporaryFile(dir=tmp_path) as t:
        gnp.tofile(rows, t)
        t.seek(0)
        assert gnp.fromfile(t, dtype="<i4").tolist() == [0, 1, 2, 3]
    # Only what the mode allows.
    (here / "victim.bin").write_bytes(b"ORIGINAL")
    with open(here / "victim.bin", "rb") as f, pytest.raises(io.UnsupportedOperation, match="not open for writing"):
        gnp.tofile(rows, f)
    assert (here / "victim.bin").read_bytes() == b"ORIGINAL"
    with open(here / "victim.bin", "ab") as f, pytest.raises(io.UnsupportedOperation, match="not open for reading"):
        gnp.fromfile(f, dtype=np.uint8)


def test_numpy_tofile_takes_torch_tensors_and_dates(tmp_path):
    from gpumapio import numpy as gnp

    dates = np.array(["2026-11-29", "1970-01-01", "1600-02-29"], dtype="datetime64[D]")
    gnp.tofile(dates, tmp_path / "dates.bin")
    assert (gnp.fromfile(tmp_path / "dates.bin", dtype="datetime64[D]") == dates).all()
    spans = np.array([1, -2], dtype="timedelta64[ns]")
    gnp.tofile(spans, tmp_path / "spans.bin")
    assert (gnp.fromfile(tmp_path / "spans.bin", dtype="timedelta64[ns]") == spans).all()
    torch = pytest.importorskip("torch")
    gnp.tofile(torch.arange(4, dtype=torch.int32), tmp_path / "tensor.bin")
    assert gnp.fromfile(tmp_path / "tensor.bin", dtype=np.int32).tolist() == [0, 1, 2, 3]


def test_gather_refuses_offsets_that_are_not_integers(tmp_path):
    """gpumapio.gather took int(1.9) for 1 and read the wrong bytes; MappedFile.gather refused."""
    path = tmp_path / "rows.bin"
    path.write_bytes(bytes(range(64)))
    m = gpumapio.map(path, device="host")
    with pytest.raises(TypeError, match=r"offsets must be integers, got 1.9 \(float\) at position 1"):
        gpumapio.gather(m, [0, 1.9], 2)
    with pytest.raises(TypeError, match=r"got True \(bool\) at position 0"):
        gpumapio.gather(m, [True], 2)
    assert gpumapio.gather(m, [np.int64(3), 5], 2).tolist() == [3, 4, 5, 6]
    m.close()


def test_gather_rows_names_list_indices_past_int64(tmp_path):
    """A list index of 2**63 or more was wrapped to a negative one (and named as such), or
    turned the list into floats."""
    path = tmp_path / "rows.bin"
    path.write_bytes(bytes(range(64)))
    m = gpumapio.map(path, device="host")
    for indices, bad, at in (
        ([2**63], 2**63, 0),
        ([2**64 - 1], 2**64 - 1, 0),
        ([0, 2**63 + 5], 2**63 + 5, 1),
        (range(2**63, 2**63 + 1), 2**63, 0),  # NumPy's arange raised a bare OverflowError
        (range(6, 2**62), 8, 2),  # refused before NumPy is asked for 2**62 indices
        (range(1, -(2**64), -1), -1, 2),
    ):
        with pytest.raises(IndexError, match=rf"row index {bad} at position {at} is outside the file's 8 rows"):
            gpumapio.gather_rows(m, indices, 8)
    assert gpumapio.gather_rows(m, range(7, -1, -7), 8).tobytes() == bytes(range(56, 64)) + bytes(range(8))
    with pytest.raises(TypeError, match=r"indices must be integers, got 2.5 \(float\) at position 1"):
        gpumapio.gather_rows(m, [1, 2.5], 8)
    assert gpumapio.gather_rows(m, [7, 0], 8).tobytes() == bytes(range(56, 64)) + bytes(range(8))
    m.close()


def test_negative_and_huge_counts_are_value_errors_naming_the_argument(tmp_path):
    """PyO3's u64 raised OverflowError("can't convert negative int to unsigned") for -1: not
    the ValueError the API documents, and naming neither the argument nor the value."""
    from gpumapio import pagecache

    path = tmp_path / "counts.bin"
    path.write_bytes(bytes(4096))
    m = gpumapio.map(path, device="host", writable=True)
    out = np.zeros(8, np.uint8)
    calls = {
        "offset -1 is negative": [
            lambda: m.read(-1, 2),
            lambda: m.write(-1, b"x"),
            lambda: m.view(-1, 1),
            lambda: m.prefetch(-1, 1),
            lambda: m.advise(-1, 1, "normal"),
            lambda: pagecache.residency(str(path), -1),
            lambda: pagecache.warm(str(path), -1),
        ],
        "length -2 is negative": [lambda: m.read(0, -2), lambda: m.flush_range(0, -2), lambda: pagecache.residency(str(path), 0, -2)],
        "offsets\\[1\\] -1 is negative": [lambda: m.gather([0, -1], 1, out)],
        "budget -1 is negative": [lambda: gpumapio.map(path, device="host", budget=-1), lambda: gpumapio.DeviceCache(-1, device="host")],
        "row_size -8 is negative": [lambda: m.gather_rows(np.zeros(1, np.int64), -8, out)],
        "offset 18446744073709551616 is past the largest value": [lambda: m.read(2**64, 1)],
    }
    for message, refused in calls.items():
        for call in refused:
            with pytest.raises(ValueError, match=message):
                call()
    with pytest.raises(TypeError, match="offset"):
        m.read("0", 1)
    m.close()


def test_something_other_than_a_regular_file_is_named_in_the_error(tmp_path):
    """A device or a FIFO refused at open: an OSError worded as Python words errors of a named
    file (it had neither errno nor filename)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):
        with pytest.raises(OSError, match="not a regular file") as e:
            gpumapio.CuFile(path, "r")
        assert e.value.filename == path and e.value.errno == errno.EINVAL, (e.value.filename, str(e.value))
        assert str(e.value).endswith(f"not a regular file: '{path}'"), str(e.value)


def test_the_last_bare_errors_name_their_argument(tmp_path):
    """Found by a fifth probe: each of these raised PyO3's or Python's bare error (an
    OverflowError naming nothing, a ZeroDivisionError, "cannot convert float NaN to integer")."""
    import gpumapio.defaults as defaults
    import gpumapio.pagecache as pagecache

    path = tmp_path / "f.bin"
    path.write_bytes(bytes(1 << 16))
    m = gpumapio.map(path, device="host", writable=True, extent_size=4096)
    view = m.view(0, 100, writable=True)
    with pytest.raises(ValueError, match="at -1 is negative"):
        view.write(b"x", at=-1)
    view.release()
    with pytest.raises(ValueError, match="file descriptor 1099511627776"):
        pagecache.residency(2**40)
    with pytest.raises(ValueError, match="budget -1 is negative"):
        gpumapio.DeviceCache.default_frame_size(-1)
    with pytest.raises(ValueError, match="no size"):
        gpumapio.gather_rows(m, [0], 16, dtype="V0")
    for value in (float("nan"), float("inf")):
        with pytest.raises((ValueError, OverflowError), match="http_timeout"):
            defaults.set("http_timeout", value)
    m.close()

"""gpumapio.pyg: feature tables in files for PyTorch Geometric.

FeatureTables (NumPy only, host memory) is checked byte for byte against NumPy reading the same
files, with hostile indices; MappedFeatureStore (the torch_geometric FeatureStore over it) where
torch_geometric imports — on the GPU (need_gpu) and on host memory (device="host")."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest

import gpumapio
from conftest import need_gpu
from gpumapio.pyg import DTYPES, FeatureTables, dtype_name

MIB = 1 << 20
ROWS = 3000


@pytest.fixture
def table_file(tmp_path, rng):
    """3000 rows of 512 bytes (128 float32, 16x16 float16, 64 int64, ...) and 77 bytes more."""
    data = rng.integers(0, 256, size=ROWS * 512 + 77, dtype="u1")
    path = tmp_path / "x.bin"
    data.tofile(path)
    return path, data


def host_cache(budget=4 * MIB):
    return gpumapio.DeviceCache(budget, extent_size=4096, frame_size=2 * MIB, device="host")


def host_tables(**kw):
    kw.setdefault("cache", host_cache())
    return FeatureTables(device="host", **kw)


def reference(data, dtype, row_shape):
    """The file as NumPy reads it: whole rows of ``row_shape`` values of ``dtype``."""
    row_size = int(np.prod(row_shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    rows = len(data) // row_size
    return data[: rows * row_size].view(dtype).reshape(rows, *row_shape)


def same(got, want):
    """Same type, shape and bytes (NaNs from random bytes compare equal here)."""
    assert isinstance(got, np.ndarray), type(got)
    want = np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    assert got.tobytes() == want.tobytes()


# FeatureTables: NumPy on host memory ###########################################################


def test_importing_gpumapio_or_its_pyg_module_imports_neither_torch_nor_torch_geometric():
    code = (
        "import sys, gpumapio\n"
        "assert 'gpumapio.pyg' not in sys.modules\n"
        "import gpumapio.pyg\n"
        "from gpumapio.pyg import FeatureTables\n"
        "FeatureTables(device='host')\n"
        "bad = [m for m in ('torch', 'torch_geometric') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_store_needs_torch_geometric_and_says_so():
    try:
        import torch_geometric  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="torch_geometric"):
            from gpumapio.pyg import MappedFeatureStore  # noqa: F401
    else:
        pytest.skip("torch_geometric imports here; the GPU tests below use it")


@pytest.mark.parametrize(
    "dtype, row_shape",
    [("float32", (128,)), ("float16", (16, 16)), ("int64", (64,)), ("uint8", (7, 3)), ("float64", ()),
     ("int16", 5), ("uint32", (1,))],
)
def test_rows_match_numpy_reading_the_file(table_file, rng, dtype, row_shape):
    path, data = table_file
    tables = host_tables()
    table = tables.add_table(path, attr_name="x", dtype=dtype, row_shape=row_shape)
    want = reference(data, dtype, table.row_shape)
    assert table.shape == want.shape and tables.size(None, "x") == want.shape
    rows = want.shape[0]
    for index_dtype in ("int32", "int64", "uint16", "uint64", "int8"):
        high = min(rows, np.iinfo(index_dtype).max + 1)
        idx = rng.integers(0, high, size=700).astype(index_dtype)
        same(tables.gather(None, "x", idx), want[idx])
    same(tables.gather(None, "x"), want)
    same(tables.gather(None, "x", None), want)
    for s in (slice(None), slice(10, 20), slice(-5, None), slice(None, None, -7), slice(3, 2), slice(0, 10**9, 997)):
        same(tables.gather(None, "x", s), want[s])
    same(tables.gather(None, "x", 7), want[7])
    same(tables.gather(None, "x", np.int64(rows - 1)), want[rows - 1])
    same(tables.gather(None, "x", np.array(5)), want[5])  # 0-d: one row, no leading dimension
    same(tables.gather(None, "x", [rows - 1, 0, 0]), want[[rows - 1, 0, 0]])
    same(tables.gather(None, "x", (1, 2)), want[[1, 2]])
    same(tables.gather(None, "x", range(10, 40, 3)), want[10:40:3])
    mask = rng.random(rows) < 0.1
    same(tables.gather(None, "x", mask), want[mask])
    same(tables.gather(None, "x", mask.tolist()), want[mask])
    for empty in ([], (), range(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64), slice(5, 5)):
        same(tables.gather(None, "x", empty), want[:0])


def test_a_partial_last_row_is_not_a_row(table_file):
    path, data = table_file
    tables = host_tables()
    assert tables.add_table(path, attr_name="a", dtype="uint8", row_shape=(77,)).rows == len(data) // 77
    assert tables.add_table(path, attr_name="b", dtype="float32", row_shape=(128,)).rows == ROWS
    with pytest.raises(IndexError, match=f"row index {ROWS} at position 0 is outside table 'b' of {ROWS} rows"):
        tables.gather(None, "b", [ROWS])


@pytest.mark.parametrize(
    "bad, position, shown",
    [
        ([0, -1], 1, "-1"),
        ([ROWS], 0, str(ROWS)),
        ([1, 2, ROWS + 5], 2, str(ROWS + 5)),
        ([2**40], 0, str(2**40)),
        ([2**63 - 1], 0, str(2**63 - 1)),
        ([3, 2**64], 1, str(2**64)),
        ([5, -(2**70)], 1, str(-(2**70))),
        (np.array([0, 2**64 - 1], dtype=np.uint64), 1, str(2**64 - 1)),
        (np.array([7, -3], dtype=np.int8), 1, "-3"),
        (-1, 0, "-1"),
        (ROWS, 0, str(ROWS)),
        (range(2**63, 2**63 + 1), 0, str(2**63)),  # NumPy's arange raised a bare OverflowError
        (range(-(2**64), 0), 0, str(-(2**64))),
        (range(ROWS - 2, 2**62), 2, str(ROWS)),  # refused before an arange of 2**62 values
        (range(3, -(2**70), -2), 2, "-1"),
        (np.int64(-2), 0, "-2"),
    ],
)
def test_indices_outside_the_table_are_index_errors_naming_them(table_file, bad, position, shown):
    path, _ = table_file
    tables = host_tables()
    tables.add_table(path, group_name="paper", attr_name="x", row_shape=(128,))
    message = rf"row index {shown} at position {position} is outside table \('paper', 'x'\) of {ROWS} rows"
    with pytest.raises(IndexError, match=message):
        tables.gather("paper", "x", bad)
    with pytest.raises(IndexError, match=message):
        tables.gather_many([("paper", "x", [1]), ("paper", "x", bad)])


@pytest.mark.parametrize(
    "bad, error, match",
    [
        (np.array([1.0, 2.0]), TypeError, r"integers .* got float64 values such as 1\.0"),
        (np.array([0.5], dtype=np.float32), TypeError, r"float32 values such as 0\.5"),
        ([1, 2.5], TypeError, r"got 2\.5 \(float\) at position 1"),
        ([1, "2"], TypeError, r"got '2' \(str\) at position 1"),
        ([True, 2], TypeError, r"got True \(bool\) at position 0"),
        ([1, None], TypeError, r"got None \(NoneType\) at position 1"),
        (1.0, TypeError, r"integers .* float64"),
        (True, TypeError, r"a bool \(True\) is not a row index"),
        (np.bool_(False), TypeError, "is not a row index"),
        (np.array([1, 2], dtype=object), TypeError, "object"),
        (np.array(["1"]), TypeError, "integers"),
        (np.array([1 + 2j]), TypeError, "complex"),
        (np.zeros((2, 2), dtype=np.int64), ValueError, r"one-dimensional, got shape \(2, 2\)"),
        (np.ones(ROWS - 1, dtype=bool), IndexError, rf"one entry per row \({ROWS}\), got shape \({ROWS - 1},\)"),
        (np.ones((ROWS, 1), dtype=bool), IndexError, "one entry per row"),
        ([True, False], IndexError, r"got shape \(2,\)"),
        (np.zeros(0, dtype=bool), IndexError, rf"one entry per row \({ROWS}\), got shape \(0,\)"),
        (np.array(True), IndexError, "one entry per row"),
        (slice(0, 10, 0), ValueError, "slice step cannot be zero"),
        (slice(0.5, 10), TypeError, "slice indices"),
        ("0", TypeError, "integers"),
        (b"\x00\x01", TypeError, "integers"),
    ],
)
def test_hostile_indices_are_typed_errors(table_file, bad, error, match):
    path, _ = table_file
    tables = host_tables()
    tables.add_table(path, row_shape=(128,))
    with pytest.raises(error, match=match):
        tables.gather(None, "x", bad)
    assert tables.stats["calls"] == 0  # nothing was gathered


def test_keys_dtypes_and_row_shapes_are_checked(table_file):
    path, _ = table_file
    tables = host_tables()
    tables.add_table(path, group_name="paper", attr_name="x")
    tables.add_table(path, group_name=("paper", "cites", "paper"), attr_name="w", dtype="f4", row_shape=3)
    assert tables.keys() == [("paper", "x"), (("paper", "cites", "paper"), "w")]
    assert ("paper", "x") in tables and len(tables) == 2
    with pytest.raises(ValueError, match="already registered"):
        tables.add_table(path, group_name="paper", attr_name="x")
    with pytest.raises(KeyError, match=r"no table \('author', 'x'\) \(registered: \('paper', 'x'\)"):
        tables.gather("author", "x", [0])
    with pytest.raises(KeyError, match="no table 'x'"):
        tables.size(None, "x")
    with pytest.raises(TypeError, match="attr_name must be a str"):
        tables.add_table(path, attr_name=3)
    with pytest.raises(TypeError, match="group_name must be"):
        tables.add_table(path, group_name=["paper"])
    with pytest.raises(TypeError, match="group_name must be"):
        tables.add_table(path, group_name=("paper", 1))
    for bad in (">f4", "complex64", bool, object, "U3", "float128" if hasattr(np, "float128") else "V8"):
        with pytest.raises(TypeError, match="dtype"):
            tables.add_table(path, attr_name="bad", dtype=bad)
    with pytest.raises(TypeError, match="dtype"):
        tables.add_table(path, attr_name="bad", dtype="no such type")
    with pytest.raises(TypeError, match="dtype None"):  # NumPy reads None as float64
        tables.add_table(path, attr_name="bad", dtype=None)
    with pytest.raises(TypeError, match="dtype"):  # a structured dtype NumPy refuses (ValueError)
        dtype_name({"names": ["a"], "formats": ["f4"], "offsets": [-1]})
    for bad, error in [((0,), ValueError), ((4, -1), ValueError), ((2.0,), TypeError), ((True,), TypeError),
                       ("12", TypeError)]:
        with pytest.raises(error, match="row_shape"):
            tables.add_table(path, attr_name="bad", row_shape=bad)
    assert "bad" not in [a for _, a in tables.keys()]
    assert dtype_name(np.float32) == dtype_name("float32") == dtype_name(np.dtype("<f4")) == "float32"
    assert dtype_name("bfloat16") == "bfloat16" and set(DTYPES) >= {"float16", "int64", "uint8"}


def test_an_empty_torch_bool_mask_is_refused_like_any_short_mask(table_file):
    torch = pytest.importorskip("torch")
    path, _ = table_file
    tables = host_tables()
    tables.add_table(path, row_shape=(128,))
    with pytest.raises(IndexError, match=rf"one entry per row \({ROWS}\), got shape \(0,\)"):
        tables.gather(None, "x", torch.zeros(0, dtype=torch.bool))
    assert tables.gather(None, "x", torch.zeros(0)).shape == (0, 128)  # torch.tensor([]): no rows
    empty = path.parent / "empty.bin"
    empty.write_bytes(b"")
    tables.add_table(empty, attr_name="none", row_shape=(4,))
    assert tables.gather(None, "none", np.zeros(0, dtype=bool)).shape == (0, 4)  # one entry per row


def test_rows_larger_than_an_array_can_be_are_refused_at_registration(table_file):
    # Such a table registered, and every gather then failed in NumPy.
    path, _ = table_file
    tables = host_tables()
    for shape, dtype in [((2**40, 2**40), "uint8"), ((2**62,), "float32"), ((2**31, 2**31, 2), "int8")]:
        with pytest.raises(ValueError, match=rf"row_shape \({shape[0]},.*larger than an array can be"):
            tables.add_table(path, attr_name="big", dtype=dtype, row_shape=shape)
    assert len(tables) == 0
    table = tables.add_table(path, attr_name="wide", dtype="uint8", row_shape=(2**62,))  # fits: no rows
    assert table.rows == 0 and tables.gather(None, "wide").shape == (0, 2**62)


def test_bfloat16_tables_gather_only_as_torch(table_file):
    path, _ = table_file
    tables = host_tables()
    assert tables.add_table(path, dtype="bfloat16", row_shape=(256,)).rows == ROWS
    with pytest.raises(TypeError, match="bfloat16"):
        tables.gather(None, "x", [0])


def test_many_requests_take_one_gather_per_table(table_file, rng):
    path, data = table_file
    tables = host_tables()
    tables.add_table(path, group_name="paper", attr_name="x", row_shape=(128,))
    tables.add_table(path, group_name="paper", attr_name="y", dtype="int64", row_shape=())
    x = reference(data, "float32", (128,))
    y = reference(data, "int64", ())
    a, b = rng.integers(0, ROWS, size=100), rng.integers(0, len(y), size=50)
    got = tables.gather_many(
        [("paper", "x", a), ("paper", "y", b), ("paper", "x", 9), ("paper", "x", slice(0, 3)), ("paper", "y", [])]
    )
    assert tables.stats["calls"] == 2 and tables.stats["rows"] == 100 + 50 + 1 + 3
    assert tables.stats["bytes"] == (100 + 1 + 3) * 512 + 50 * 8
    same(got[0], x[a])
    same(got[1], y[b])
    same(got[2], x[9])
    same(got[3], x[:3])
    same(got[4], y[:0])
    assert tables.gather_many([]) == []


def test_tables_share_a_cache_smaller_than_them(tmp_path, rng):
    """Two tables of 6 MiB in a cache of 4 MiB: every row still reads as the file's."""
    tables = FeatureTables(device="host", budget=4 * MIB, frame_size=2 * MIB)
    want = {}
    for name in ("a", "b"):
        data = rng.integers(0, 256, size=6 * MIB, dtype="u1")
        data.tofile(tmp_path / name)
        tables.add_table(tmp_path / name, attr_name=name, dtype="float32", row_shape=(128,))
        want[name] = reference(data, "float32", (128,))
    assert tables.cache is not None and tables.cache.stats()["budget"] == 4 * MIB
    for _ in range(3):
        for name in ("a", "b"):
            idx = rng.integers(0, len(want[name]), size=5000)
            same(tables.gather(None, name, idx), want[name][idx])
    assert tables.cache.stats()["totals"]["evictions"] > 0
    with pytest.raises(ValueError, match="not both"):
        FeatureTables(device="host", budget=4 * MIB, cache=tables.cache)


def test_a_mapped_file_handed_in_stays_the_callers(table_file):
    path, data = table_file
    m = gpumapio.map(path, device="host", budget=4 * MIB, frame_size=2 * MIB, extent_size=4096)
    tables = host_tables()
    with pytest.raises(ValueError, match="give them to gpumapio.map"):
        tables.add_table(m, budget=MIB)
    table = tables.add_table(m, dtype="int32", row_shape=(128,))
    assert not table.owned and table.path == str(path)
    assert tables.remove(None, "x") and not tables.remove(None, "x")
    assert m.read(0, 4) == data[:4].tobytes()  # still open
    assert path.exists()


def test_remove_unregisters_and_keeps_the_file(table_file):
    path, _ = table_file
    with host_tables() as tables:
        tables.add_table(path, row_shape=(128,))
        tables.add_table(path, attr_name="z", row_shape=(64,))
        assert tables.remove(None, "x") is True
        assert tables.remove(None, "x") is False
        assert tables.keys() == [(None, "z")]
        with pytest.raises(KeyError):
            tables.gather(None, "x", [0])
        tables.add_table(path, row_shape=(128,))  # the key is free again
    assert len(tables) == 0 and path.exists()


def test_write_rows_through_a_writable_map(table_file, rng):
    path, data = table_file
    tables = host_tables()
    tables.add_table(path, dtype="float32", row_shape=(128,), writable=True)
    tables.add_table(path, attr_name="ro", dtype="float32", row_shape=(128,), cache=host_cache())
    want = reference(data.copy(), "float32", (128,)).copy()

    values = rng.standard_normal((4, 128)).astype(np.float32)
    tables.write_rows(None, "x", [5, 6, 7, 100], values)  # a run of three, then one
    want[[5, 6, 7, 100]] = values
    tables.write_rows(None, "x", 9, values[0])  # an int: one row, no leading dimension
    want[9] = values[0]
    tables.write_rows(None, "x", slice(20, 22), values[:2])
    want[20:22] = values[:2]
    tables.write_rows(None, "x", [30, 30], values[:2])  # repeated: the last wins
    want[30] = values[1]
    mask = np.zeros(ROWS, dtype=bool)
    mask[[40, 41]] = True
    tables.write_rows(None, "x", mask, values[2:])
    want[[40, 41]] = values[2:]
    tables.write_rows(None, "x", [], np.zeros((0, 128), dtype=np.float32))
    tables.write_rows(None, "x", [ROWS - 1], [[1.5] * 128])  # a list is read as the table's type
    want[ROWS - 1] = 1.5

    same(tables.gather(None, "x"), want)  # seen by the next gather, before any write-back
    tables.flush()
    on_disk = np.fromfile(path, dtype="u1")
    assert on_disk[: ROWS * 512].tobytes() == want.tobytes()
    assert on_disk[ROWS * 512 :].tobytes() == data[ROWS * 512 :].tobytes()  # the partial row

    with pytest.raises(io.UnsupportedOperation, match="read-only"):
        tables.write_rows(None, "ro", [0], values[:1])
    for bad_values, error in [
        (values[:3], ValueError),  # 3 rows for 4 indices
        (values.astype(np.float64), TypeError),
        (values.astype(">f4"), TypeError),
        (values[:, :64], ValueError),
        (values[0], ValueError),
    ]:
        with pytest.raises(error):
            tables.write_rows(None, "x", [1, 2, 3, 4], bad_values)
    with pytest.raises(IndexError, match="row index -1 at position 0"):
        tables.write_rows(None, "x", [-1], values[:1])
    with pytest.raises(IndexError, match=f"row index {ROWS}"):
        tables.write_rows(None, "x", ROWS, values[0])
    same(tables.gather(None, "x"), want)  # the refused writes wrote nothing


def test_put_writes_new_files_only_into_its_directory(tmp_path, table_file, rng):
    path, _ = table_file
    with pytest.raises(NotImplementedError, match="directory"):
        host_tables().put(None, "x", np.zeros((3, 4), dtype=np.float32))

    out = tmp_path / "tables"
    out.mkdir()
    (out / "paper.x.bin").write_bytes(b"not ours")  # never replaced
    tables = host_tables(directory=out)
    x = rng.standard_normal((50, 4, 2)).astype(np.float16)
    table = tables.put("paper", "x", x)
    assert table.dtype == "float16" and table.shape == (50, 4, 2)
    assert os.path.dirname(table.path) == str(out) and os.path.basename(table.path) == "paper.x-1.bin"
    assert (out / "paper.x.bin").read_bytes() == b"not ours"
    same(tables.gather("paper", "x"), x)
    assert np.fromfile(table.path, dtype=np.float16).tobytes() == x.tobytes()

    with pytest.raises(ValueError, match="already registered"):
        tables.put("paper", "x", x)
    tables.remove("paper", "x")
    assert tables.put("paper", "x", x[:2]).path.endswith("paper.x-2.bin")
    assert os.path.exists(table.path)  # removal keeps files

    y = tables.put(None, "y", [3, 1, 2])  # a list: NumPy's type for it
    assert y.dtype == "int64" and y.shape == (3,) and os.path.basename(y.path) == "y.bin"
    edge = tables.put(("a", "to/..", "b"), "w", np.ones((2, 1), dtype=np.float32))
    assert os.path.basename(edge.path) == "a__to_..__b.w.bin"
    assert os.path.basename(tables.put(None, "..", np.ones(1, dtype=np.uint8)).path) == "table.bin"
    for bad in (np.zeros((0, 3), dtype=np.float32), np.zeros((3, 0), dtype=np.float32), np.float32(1)):
        with pytest.raises(ValueError, match="at least one value"):
            tables.put(None, "empty", bad)
    with pytest.raises(TypeError, match="dtype"):
        tables.put(None, "c", np.zeros(3, dtype=np.complex64))
    with pytest.raises(NotADirectoryError):
        FeatureTables(path, device="host")


def test_put_refuses_names_too_long_for_a_file_before_writing(tmp_path):
    # The file name is built from the key: an attribute name of 300 characters failed with
    # ENAMETOOLONG when the file was created.
    tables = host_tables(directory=tmp_path)
    values = np.ones((3, 2), dtype=np.float32)
    for group, attr in [(None, "feat_" + "x" * 300), (("paper", "c" * 200, "paper"), "x" * 50)]:
        with pytest.raises(ValueError, match=r"cannot put table .*file name would be \d+ bytes"):
            tables.put(group, attr, values)
    assert list(tmp_path.iterdir()) == [] and len(tables) == 0
    longest = tables.put(None, "y" * 246, values)  # with "-9999.bin", 255 bytes
    assert os.path.basename(longest.path) == "y" * 246 + ".bin"


def test_tables_on_the_gpu_with_cupy_indices(table_file, rng):
    cupy = need_gpu("cupy")
    path, data = table_file
    tables = FeatureTables(budget=64 * MIB)
    tables.add_table(path, row_shape=(128,))
    want = reference(data, "float32", (128,))
    idx = rng.integers(0, ROWS, size=2000)
    for index in (idx, cupy.asarray(idx), cupy.asarray(idx, dtype=cupy.int32), cupy.asarray(idx, dtype=cupy.uint16)):
        got = tables.gather(None, "x", index)
        assert isinstance(got, cupy.ndarray) and got.dtype == cupy.float32 and got.shape == (2000, 128)
        assert cupy.asnumpy(got).tobytes() == want[idx].tobytes()
    mask = np.zeros(ROWS, dtype=bool)
    mask[[1, 7]] = True
    assert cupy.asnumpy(tables.gather(None, "x", cupy.asarray(mask))).tobytes() == want[[1, 7]].tobytes()
    assert cupy.asnumpy(tables.gather(None, "x", cupy.asarray(9))).tobytes() == want[9].tobytes()
    with pytest.raises(IndexError, match=rf"table 'x': row index {ROWS} at position 1"):
        tables.gather(None, "x", cupy.asarray([0, ROWS]))
    with pytest.raises(TypeError, match="integers"):
        tables.gather(None, "x", cupy.asarray([1.0]))
    a, b = cupy.asarray(idx[:10]), cupy.asarray(idx[10:30], dtype=cupy.int32)
    before = tables.stats["calls"]
    got_a, got_b = tables.gather_many([(None, "x", a), (None, "x", b)])  # joined: one gather
    assert tables.stats["calls"] - before == 1
    assert cupy.asnumpy(got_a).tobytes() == want[idx[:10]].tobytes()
    assert cupy.asnumpy(got_b).tobytes() == want[idx[10:30]].tobytes()
    got_a, got_b = tables.gather_many([(None, "x", a), (None, "x", idx[10:30])])  # mixed: one each
    assert tables.stats["calls"] - before == 3
    assert cupy.asnumpy(got_b).tobytes() == want[idx[10:30]].tobytes()


# MappedFeatureStore: torch_geometric's FeatureStore ############################################


@pytest.fixture(params=["cuda", "host"])
def store_env(request):
    """(torch, torch_geometric, device): on the GPU (need_gpu, which fails under
    GPUMAP_REQUIRE_GPU=1 without one) and on host memory, where torch_geometric imports."""
    if request.param == "cuda":
        torch = need_gpu("torch")
    else:
        torch = pytest.importorskip("torch")
    torch_geometric = pytest.importorskip("torch_geometric")
    return torch, torch_geometric, 0 if request.param == "cuda" else "host"


def make_store(device, **kw):
    from gpumapio.pyg import MappedFeatureStore

    if device == "host":
        kw.setdefault("cache", host_cache(8 * MIB))
    else:
        kw.setdefault("budget", 64 * MIB)
    return MappedFeatureStore(device=device, **kw)


def as_numpy(tensor):
    """A tensor's values as NumPy (bytes kept: bfloat16 as uint16)."""
    import torch

    t = tensor.detach().cpu()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy()


def test_store_gets_rows_as_torch_tensors(store_env, table_file, rng):
    torch, _, device = store_env
    path, data = table_file
    store = make_store(device)
    store.add_table(path, group_name="paper", attr_name="x", dtype=torch.float32, row_shape=(128,))
    store.add_table(path, group_name="paper", attr_name="h", dtype="bfloat16", row_shape=(16, 16))
    want = reference(data, "float32", (128,))
    want_h = reference(data, "int16", (16, 16))
    where = torch.device("cuda", 0) if device == 0 else torch.device("cpu")

    idx = rng.integers(0, ROWS, size=1000)
    indices = [torch.as_tensor(idx), torch.as_tensor(idx, dtype=torch.int32), idx, idx.astype(np.int32), idx.tolist()]
    if device == 0:
        indices += [torch.as_tensor(idx, device="cuda"), torch.as_tensor(idx, device="cuda", dtype=torch.int32),
                    torch.as_tensor(idx, device="cuda", dtype=torch.int16 if ROWS < 2**15 else torch.int64)]
    for index in indices:
        for got in (store["paper", "x", index], store.get_tensor("paper", "x", index),
                    store.get_tensor(group_name="paper", attr_name="x", index=index)):
            assert isinstance(got, torch.Tensor) and got.device == where and got.dtype == torch.float32
            assert got.shape == (1000, 128)
            assert as_numpy(got).tobytes() == want[idx].tobytes()
    h = store["paper", "h", torch.as_tensor(idx)]
    assert h.dtype == torch.bfloat16 and h.shape == (1000, 16, 16)
    assert as_numpy(h).tobytes() == want_h[idx].tobytes()

    assert as_numpy(store["paper", "x", None]).tobytes() == want.tobytes()
    assert as_numpy(store["paper"].x()).tobytes() == want.tobytes()  # an AttrView, called
    assert as_numpy(store["paper", "x", slice(-3, None)]).tobytes() == want[-3:].tobytes()
    assert store["paper", "x", 4].shape == (128,)
    mask = torch.zeros(ROWS, dtype=torch.bool)
    mask[[3, 99]] = True
    for m in ([mask, mask.to(where)] if device == 0 else [mask]):
        assert as_numpy(store["paper", "x", m]).tobytes() == want[[3, 99]].tobytes()
    assert store["paper", "x", torch.zeros(0, dtype=torch.int64)].shape == (0, 128)
    as_np = store.get_tensor("paper", "x", idx[:5], convert_type=True)  # torch_geometric's option
    assert isinstance(as_np, np.ndarray) and as_np.tobytes() == want[idx[:5]].tobytes()

    assert store.get_tensor_size("paper", "x") == (ROWS, 128)
    assert store.get_tensor_size(group_name="paper", attr_name="nope") is None
    attrs = store.get_all_tensor_attrs()
    assert [(a.group_name, a.attr_name) for a in attrs] == [("paper", "x"), ("paper", "h")]
    assert all(not a.is_set("index") for a in attrs)

    bad = [torch.as_tensor([0, ROWS])] + ([torch.as_tensor([0, ROWS], device="cuda")] if device == 0 else [])
    for b in bad:
        with pytest.raises(IndexError, match=rf"row index {ROWS} at position 1"):
            store["paper", "x", b]
    with pytest.raises(TypeError, match="integers"):
        store["paper", "x", torch.tensor([1.0])]
    with pytest.raises(KeyError, match="no table"):
        store["author", "x", torch.tensor([1])]


def test_store_multi_get_takes_one_gather_per_table(store_env, table_file, rng):
    torch, torch_geometric, device = store_env
    from torch_geometric.data import TensorAttr

    path, data = table_file
    store = make_store(device)
    store.add_table(path, group_name="paper", attr_name="x", row_shape=(128,))
    store.add_table(path, group_name="paper", attr_name="y", dtype="int64", row_shape=())
    x, y = reference(data, "float32", (128,)), reference(data, "int64", ())
    a = torch.as_tensor(rng.integers(0, ROWS, size=300))
    b = torch.as_tensor(rng.integers(0, ROWS, size=30))
    before = dict(store.stats)
    out = store.multi_get_tensor(
        [TensorAttr("paper", "x", a), TensorAttr("paper", "y", a), TensorAttr("paper", "x", b)]
    )
    assert store.stats["calls"] - before["calls"] == 2
    assert as_numpy(out[0]).tobytes() == x[a.numpy()].tobytes()
    assert as_numpy(out[1]).tobytes() == y[a.numpy()].tobytes() and out[1].shape == (300,)
    assert as_numpy(out[2]).tobytes() == x[b.numpy()].tobytes()


def test_store_put_update_and_remove(store_env, tmp_path, table_file, rng):
    torch, _, device = store_env
    path, data = table_file
    with pytest.raises(NotImplementedError, match="directory"):
        make_store(device).put_tensor(torch.zeros(3, 4), group_name="paper", attr_name="x", index=None)

    out = tmp_path / "new"
    out.mkdir()
    store = make_store(device, directory=out)
    x = torch.randn(64, 8)
    assert store.put_tensor(x, group_name="paper", attr_name="x", index=None)
    assert (out / "paper.x.bin").read_bytes() == x.numpy().tobytes()
    store["paper", "t", None] = torch.arange(10)  # __setitem__ is put_tensor
    assert store.get_tensor_size("paper", "t") == (10,)
    assert torch.equal(store["paper", "t", None].cpu(), torch.arange(10))
    with pytest.raises(io.UnsupportedOperation, match="read-only"):
        store.update_tensor(x[:1], group_name="paper", attr_name="x", index=torch.tensor([0]))
    with pytest.raises(NotImplementedError, match="not registered"):
        store.put_tensor(x[:1], group_name="author", attr_name="x", index=torch.tensor([0]))

    store.add_table(path, group_name="w", attr_name="x", row_shape=(128,), writable=True)
    rows = torch.tensor([1, 2, 3, 500])
    new = torch.randn(4, 128)
    if device == 0:
        new = new.cuda()
    assert store.update_tensor(new, group_name="w", attr_name="x", index=rows)
    assert torch.equal(store["w", "x", rows].cpu(), new.cpu())
    store.put_tensor(new[:1], group_name="w", attr_name="x", index=torch.tensor([7]))  # a partial put
    assert torch.equal(store["w", "x", 7].cpu(), new[0].cpu())
    store.flush()
    want = reference(data.copy(), "float32", (128,)).copy()
    want[[1, 2, 3, 500]] = new.cpu().numpy()
    want[7] = new[0].cpu().numpy()
    assert np.fromfile(path, dtype="u1")[: ROWS * 512].tobytes() == want.tobytes()
    with pytest.raises(TypeError):
        store.update_tensor(new.double(), group_name="w", attr_name="x", index=rows)

    assert store.remove_tensor(group_name="w", attr_name="x", index=None)
    assert not store.remove_tensor(group_name="w", attr_name="x", index=None)
    del store["paper", "t"]
    assert [(a.group_name, a.attr_name) for a in store.get_all_tensor_attrs()] == [("paper", "x")]
    assert path.exists() and (out / "paper.t.bin").exists()
    store.close()


def test_store_feeds_a_node_loader(store_env, tmp_path, rng):
    """torch_geometric's NodeLoader over (store, graph store), homogeneous: every batch's x and
    y are the rows of the batch's nodes (a sampler that keeps the seeds and one neighbour each,
    in plain torch, so that neither pyg-lib nor torch-sparse is needed)."""
    torch, torch_geometric, device = store_env
    from torch_geometric.data import GraphStore
    from torch_geometric.loader import NodeLoader
    from torch_geometric.sampler import BaseSampler, SamplerOutput

    n = 5000
    x = rng.standard_normal((n, 32)).astype(np.float32)
    y = rng.integers(0, 7, size=n)
    x.tofile(tmp_path / "x.bin")
    y.tofile(tmp_path / "y.bin")
    store = make_store(device)
    store.add_table(tmp_path / "x.bin", attr_name="x", row_shape=(32,))
    store.add_table(tmp_path / "y.bin", attr_name="y", dtype="int64", row_shape=())

    class OneNeighbour(BaseSampler):
        def sample_from_nodes(self, inputs, **kwargs):
            seeds = inputs.node
            nbrs = (seeds * 7 + 1) % n
            node = torch.cat([seeds, nbrs])
            k = seeds.numel()
            return SamplerOutput(
                node=node, row=torch.arange(k, 2 * k), col=torch.arange(k), edge=None,
                metadata=(inputs.input_id, inputs.time),
            )

        def sample_from_edges(self, index, neg_sampling=None):  # abstract in torch_geometric 2.8
            raise NotImplementedError

    class Graph(GraphStore):  # a graph store is part of the data tuple; this sampler needs none
        def _put_edge_index(self, edge_index, edge_attr):
            return False

        def _get_edge_index(self, edge_attr):
            return None

        def _remove_edge_index(self, edge_attr):
            return False

        def get_all_edge_attrs(self):
            return []

    loader = NodeLoader((store, Graph()), node_sampler=OneNeighbour(), input_nodes=torch.arange(n),
                        batch_size=512, shuffle=True)
    before = store.stats["calls"]
    seen = 0
    for batch in loader:
        nodes = batch.n_id.numpy()
        assert batch.x.shape == (len(nodes), 32) and batch.y.shape == (len(nodes),)
        assert as_numpy(batch.x).tobytes() == x[nodes].tobytes()
        assert as_numpy(batch.y).tobytes() == y[nodes].tobytes()
        seen += batch.batch_size
    assert seen == n
    assert store.stats["calls"] - before == 2 * len(loader)  # x and y: one gather each per batch


def test_store_feeds_a_neighbor_loader(store_env, tmp_path, rng):
    """NeighborLoader((store, graph store)), homogeneous (torch_geometric 2.8's remote backends
    take group_name / edge_type None), with gpumapio.pyg.neighbor_sampler's sampler: pyg-lib's
    or torch-sparse's where one imports, PlainTorchNeighborSampler otherwise. Every batch's x is
    the file's rows of n_id; the seeds come first; every edge is the graph's edge e_id, from a
    sampled neighbour to the node it was sampled for, at most `fanout` per node and hop."""
    torch, torch_geometric, device = store_env
    from torch_geometric.data import EdgeAttr, GraphStore
    from torch_geometric.loader import NeighborLoader

    from gpumapio.pyg import neighbor_sampler

    class Graph(GraphStore):
        def __init__(self):
            super().__init__()
            self.edges = {}

        def _put_edge_index(self, edge_index, edge_attr):
            self.edges[(edge_attr.edge_type, edge_attr.layout.value, edge_attr.is_sorted, edge_attr.size)] = edge_index
            return True

        def _get_edge_index(self, edge_attr):
            return self.edges.get((edge_attr.edge_type, edge_attr.layout.value, edge_attr.is_sorted, edge_attr.size))

        def _remove_edge_index(self, edge_attr):
            return False

        def get_all_edge_attrs(self):
            return [EdgeAttr(*key) for key in self.edges]

    n = 4000
    x = rng.standard_normal((n, 16)).astype(np.float32)
    x.tofile(tmp_path / "x.bin")
    store = make_store(device)
    store.add_table(tmp_path / "x.bin", attr_name="x", row_shape=(16,))
    graph = Graph()
    edge_index = torch.randint(0, n, (2, 40_000))
    graph.put_edge_index((edge_index[0], edge_index[1]), edge_type=None, layout="coo", size=(n, n))
    fanout = [5, 3]
    seeds = torch.randperm(n)
    sampler = neighbor_sampler((store, graph), fanout)
    loader = NeighborLoader((store, graph), num_neighbors=fanout, input_nodes=seeds, batch_size=256,
                            neighbor_sampler=sampler)
    src, dst = edge_index.numpy()
    degree = np.bincount(dst, minlength=n)
    batches = 0
    for batch in loader:
        n_id = batch.n_id.numpy()
        assert as_numpy(batch.x).tobytes() == x[n_id].tobytes()
        assert np.array_equal(n_id[: batch.batch_size], seeds[batch.input_id].numpy())  # seeds first
        row, col = batch.edge_index.numpy()
        if batch.num_sampled_nodes is None:  # torch-sparse: no counts per hop to check against
            assert np.array_equal(src[batch.e_id.numpy()], n_id[row])
            assert np.array_equal(dst[batch.e_id.numpy()], n_id[col])
        else:
            check_sample(src, dst, degree, fanout, n_id, row, col, batch.e_id.numpy(),
                         batch.num_sampled_nodes, batch.num_sampled_edges)
        batches += 1
    assert batches == len(loader)


# Neighbour sampling without pyg-lib: gpumapio._pyg_neighbors (NumPy) and the sampler over it ####


def check_sample(src, dst, degree, fanout, node, row, col, edge, num_sampled_nodes, num_sampled_edges,
                 replace=False):
    """A sampled subgraph as pyg-lib gives it (csc, not disjoint, directed), checked against the
    graph whose edge ``i`` goes from ``src[i]`` to ``dst[i]`` (``degree``: in-degree per node):
    edge ``j`` is the graph's edge ``edge[j]`` from ``node[row[j]]`` (the neighbour) to
    ``node[col[j]]`` (the node it was sampled for); hop ``h`` samples ``min(degree, fanout[h])``
    distinct edges (``fanout[h]`` with ``replace``; all for -1) for each node reached at hop
    ``h - 1`` (the seeds for hop 0); each hop's new nodes follow, numbered in the order first
    reached."""
    node, row, col, edge = (np.asarray(a) for a in (node, row, col, edge))
    assert len(num_sampled_nodes) == len(fanout) + 1 and len(num_sampled_edges) == len(fanout)
    assert sum(num_sampled_nodes) == len(node)
    assert sum(num_sampled_edges) == len(row) == len(col) == len(edge)
    assert np.array_equal(src[edge], node[row]) and np.array_equal(dst[edge], node[col])
    node_end = np.cumsum(num_sampled_nodes)
    edge_end = np.cumsum([0, *num_sampled_edges])
    for hop, count in enumerate(fanout):
        begin, end, after = (node_end[hop - 1] if hop else 0), node_end[hop], node_end[hop + 1]
        hop_row, hop_col, hop_edge = (a[edge_end[hop] : edge_end[hop + 1]] for a in (row, col, edge))
        assert ((hop_col >= begin) & (hop_col < end)).all()  # sampled for the last hop's nodes
        assert (hop_row < after).all()
        frontier_degree = degree[node[begin:end]]
        if count < 0:
            want = frontier_degree
        elif replace:
            want = np.where(frontier_degree > 0, count, 0)
        else:
            want = np.minimum(frontier_degree, count)
        assert np.array_equal(np.bincount(hop_col - begin, minlength=end - begin), want)
        if not replace:  # no edge twice for one node
            pairs = hop_col.astype(np.int64) * len(src) + hop_edge
            assert len(np.unique(pairs)) == len(pairs)
        new = hop_row[hop_row >= end]
        _, first = np.unique(new, return_index=True)
        assert np.array_equal(new[np.sort(first)], np.arange(end, after))


# A hand-made graph in CSC: the in-neighbours of v are TINY_ROW[TINY_COLPTR[v]:TINY_COLPTR[v + 1]].
# 0 <- 1, 2, 3;  1 <- 0;  2 <- none;  3 <- 0, 1;  4 <- 3;  5: isolated.
TINY_COLPTR = np.array([0, 3, 4, 4, 6, 7, 7])
TINY_ROW = np.array([1, 2, 3, 0, 0, 1, 3])
TINY_DST = np.repeat(np.arange(6), np.diff(TINY_COLPTR))  # CSC position -> destination


@pytest.mark.parametrize("fanout", [[5, 5], [-1, -1], [3, 2]])
def test_sampling_a_tiny_graph_takes_every_neighbour_when_the_fanout_reaches_the_degree(fanout):
    from gpumapio._pyg_neighbors import sample_neighbors

    out = sample_neighbors(TINY_COLPTR, TINY_ROW, np.array([0, 5]), fanout, rng=np.random.default_rng(0))
    assert out.node.tolist() == [0, 5, 1, 2, 3]  # seeds, then 0's in-neighbours in CSC order
    assert out.row.tolist() == [2, 3, 4, 0, 0, 2]  # neighbours, as local indices
    assert out.col.tolist() == [0, 0, 0, 2, 4, 4]  # the nodes they were sampled for
    assert out.edge.tolist() == [0, 1, 2, 3, 4, 5]
    assert out.num_sampled_nodes == [2, 3, 0] and out.num_sampled_edges == [3, 3]


def test_sampling_a_tiny_graph_with_fanout_zero_isolated_nodes_and_repeated_seeds():
    from gpumapio._pyg_neighbors import sample_neighbors

    rng = np.random.default_rng(0)
    out = sample_neighbors(TINY_COLPTR, TINY_ROW, np.array([0, 5]), [0, 5], rng=rng)
    assert out.node.tolist() == [0, 5] and out.row.size == out.col.size == out.edge.size == 0
    assert out.num_sampled_nodes == [2, 0, 0] and out.num_sampled_edges == [0, 0]

    out = sample_neighbors(TINY_COLPTR, TINY_ROW, np.array([4]), [1, 0], rng=rng)
    assert out.node.tolist() == [4, 3] and out.row.tolist() == [1] and out.col.tolist() == [0]
    assert out.edge.tolist() == [6] and out.num_sampled_nodes == [1, 1, 0] and out.num_sampled_edges == [1, 0]

    for isolated in ([2], [5], [2, 5]):  # no in-neighbours: nothing sampled, every hop
        out = sample_neighbors(TINY_COLPTR, TINY_ROW, np.array(isolated), [3, 3], rng=rng)
        assert out.node.tolist() == isolated and out.row.size == 0
        assert out.num_sampled_nodes == [len(isolated), 0, 0] and out.num_sampled_edges == [0, 0]

    out = sample_neighbors(TINY_COLPTR, TINY_ROW, np.array([], dtype=np.int64), [3], rng=rng)
    assert out.node.size == 0 and out.num_sampled_nodes == [0, 0] and out.num_sampled_edges == [0]

    # A seed given twice is sampled at each of its positions (as pyg-lib does); a neighbour
    # equal to it takes the first position.
    out = sample_neighbors(TINY_COLPTR, TINY_ROW, np.array([3, 3, 0]), [-1], rng=rng)
    assert out.node.tolist() == [3, 3, 0, 1, 2] and out.num_sampled_nodes == [3, 2]
    assert out.row.tolist() == [2, 3, 2, 3, 3, 4, 0] and out.col.tolist() == [0, 0, 1, 1, 2, 2, 2]
    assert out.edge.tolist() == [4, 5, 4, 5, 0, 1, 2]

    for bad in ([6], [0, -1]):
        with pytest.raises(IndexError, match=r"seed -?\d+ at position \d+ is outside the graph of 6 nodes"):
            sample_neighbors(TINY_COLPTR, TINY_ROW, np.array(bad), [1], rng=rng)


@pytest.mark.parametrize(
    "colptr, row, seeds, hops, match",
    [
        ([0, 1, 2, 3], [1, 7, 0], [0, 1, 2], [2], r"row\[1\], the source 7, is outside the graph of 3 nodes"),
        ([0, 1, 2, 3], [1, -1, 0], [1], [2], r"row\[1\], the source -1, is outside"),
        ([0, 2, 10], [1, 0], [1], [2], r"node 1's edges, colptr\[1\]..colptr\[2\] = 2..10, are not a span of the graph's 2 edges"),
        ([-2, 1, 2], [1, 0], [0], [5], r"node 0's edges, colptr\[0\]..colptr\[1\] = -2..1"),
        ([0, 3, 1, 4], [0, 1, 2, 0], [1], [2], r"node 1's edges, colptr\[1\]..colptr\[2\] = 3..1"),
        ([], [], [0], [1], r"got arrays of shapes \(0,\) and \(0,\)"),
    ],
)
def test_sampling_a_graph_that_points_outside_itself_is_refused_naming_where(colptr, row, seeds, hops, match):
    """Edges past the node count were sampled as nodes (one hop) or raised NumPy's errors,
    naming nothing; offsets below 0 wrapped around to other edges."""
    from gpumapio._pyg_neighbors import sample_neighbors

    with pytest.raises(ValueError, match=match):
        sample_neighbors(np.array(colptr), np.array(row), np.array(seeds), hops, rng=np.random.default_rng(0))
    # What is not reached is not read: node 2 of the first graph samples well.
    out = sample_neighbors(np.array([0, 1, 2, 3]), np.array([1, 7, 0]), np.array([2]), [1], rng=np.random.default_rng(0))
    assert out.node.tolist() == [2, 0]


@pytest.mark.parametrize("replace", [False, True])
def test_sampling_a_random_graph_follows_pyg_libs_layout(rng, replace):
    from gpumapio._pyg_neighbors import sample_neighbors

    n, e = 3000, 30_000
    dst = np.sort(rng.integers(0, n, e))
    src = rng.integers(0, n, e)  # edge i (a CSC position, dst sorted) goes src[i] -> dst[i]
    colptr = np.zeros(n + 1, dtype=np.int64)
    colptr[1:] = np.cumsum(np.bincount(dst, minlength=n))
    degree = np.diff(colptr)
    for fanout in ([10, 5], [3, -1], [1, 1, 1], [25]):
        seeds = rng.choice(n, 200, replace=False)
        out = sample_neighbors(colptr, src, seeds, fanout, replace=replace, rng=rng)
        assert np.array_equal(out.node[:200], seeds)
        assert len(np.unique(out.node)) == len(out.node)
        check_sample(src, dst, degree, fanout, out.node, out.row, out.col, out.edge,
                     out.num_sampled_nodes, out.num_sampled_edges, replace=replace)


def test_sampling_without_replacement_is_uniform():
    """Two of node 0's five in-neighbours, 5000 times: each pair about equally often."""
    from gpumapio._pyg_neighbors import sample_neighbors

    colptr, row = np.array([0, 5, 5, 5, 5, 5, 5]), np.array([1, 2, 3, 4, 5])
    rng = np.random.default_rng(7)
    pairs = {}
    for _ in range(5000):
        out = sample_neighbors(colptr, row, np.array([0]), [2], rng=rng)
        key = tuple(sorted(out.edge.tolist()))
        assert len(key) == 2 and key[0] != key[1]
        pairs[key] = pairs.get(key, 0) + 1
    assert len(pairs) == 10  # every pair, each expected 500 times
    assert all(350 < c < 650 for c in pairs.values()), pairs


@pytest.fixture
def pyg():
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    return torch


def tiny_data(torch, shuffle):
    """The tiny graph as a torch_geometric Data (COO: edge i = CSC position i, unless shuffled)."""
    from torch_geometric.data import Data

    edge_index = torch.stack([torch.from_numpy(TINY_ROW), torch.from_numpy(TINY_DST)])
    if shuffle:
        edge_index = edge_index[:, torch.randperm(edge_index.shape[1])]
    return Data(edge_index=edge_index, x=torch.arange(6).float().view(6, 1), num_nodes=6)


def test_plain_sampler_gives_pyg_libs_output_on_a_tiny_graph(pyg):
    torch = pyg
    from torch_geometric.sampler import NodeSamplerInput

    from gpumapio.pyg import PlainTorchNeighborSampler

    data = tiny_data(torch, shuffle=False)
    sampler = PlainTorchNeighborSampler(data, [5, 5], is_sorted=True)  # CSC as given: no permutation
    out = sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=torch.tensor([0, 5])))
    assert out.node.tolist() == [0, 5, 1, 2, 3]
    assert out.row.tolist() == [2, 3, 4, 0, 0, 2] and out.col.tolist() == [0, 0, 0, 2, 4, 4]
    assert out.edge.tolist() == [0, 1, 2, 3, 4, 5] and out.batch is None
    assert out.num_sampled_nodes == [2, 3, 0] and out.num_sampled_edges == [3, 3]

    out = sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=torch.tensor([2, 5])))
    assert out.node.tolist() == [2, 5] and out.row.numel() == 0 and out.num_sampled_edges == [0, 0]

    zero = PlainTorchNeighborSampler(data, [0, 5], is_sorted=True)
    out = zero.sample_from_nodes(NodeSamplerInput(input_id=None, node=torch.tensor([0])))
    assert out.node.tolist() == [0] and out.num_sampled_nodes == [1, 0, 0] and out.num_sampled_edges == [0, 0]

    # Edges in another order: the sampler's positions are CSC's; its permutation maps them back.
    data = tiny_data(torch, shuffle=True)
    sampler = PlainTorchNeighborSampler(data, [-1, -1])
    out = sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=torch.tensor([0, 5])))
    edge_id = sampler.edge_permutation[out.edge] if sampler.edge_permutation is not None else out.edge
    assert torch.equal(data.edge_index[:, edge_id], torch.stack([out.node[out.row], out.node[out.col]]))
    assert sorted(out.node.tolist()) == [0, 1, 2, 3, 5] and out.node[:2].tolist() == [0, 5]


def test_plain_sampler_drives_a_neighbor_loader_over_data(pyg):
    torch = pyg
    import torch_geometric.typing as pyg_typing
    from torch_geometric.loader import NeighborLoader
    from torch_geometric.sampler import NeighborSampler

    from gpumapio.pyg import PlainTorchNeighborSampler, neighbor_sampler

    data = tiny_data(torch, shuffle=True)
    expected = NeighborSampler if (pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE) else PlainTorchNeighborSampler
    assert type(neighbor_sampler(data, [2])) is expected

    sampler = PlainTorchNeighborSampler(data, [2, 2])
    loader = NeighborLoader(data, num_neighbors=[2, 2], neighbor_sampler=sampler, batch_size=2)
    src, dst = data.edge_index.numpy()
    degree = np.bincount(dst, minlength=6)
    seen = []
    for batch in loader:
        n_id = batch.n_id.numpy()
        assert batch.x.view(-1).long().tolist() == n_id.tolist()
        row, col = batch.edge_index.numpy()
        check_sample(src, dst, degree, [2, 2], n_id, row, col, batch.e_id.numpy(),
                     batch.num_sampled_nodes, batch.num_sampled_edges)
        seen += n_id[: batch.batch_size].tolist()
    assert seen == list(range(6))


def test_plain_sampler_refuses_what_it_does_not_do(pyg):
    torch = pyg
    from torch_geometric.data import HeteroData

    from gpumapio.pyg import PlainTorchNeighborSampler

    data = tiny_data(torch, shuffle=False)
    data.time = torch.arange(6)
    data.w = torch.ones(7)
    for kwargs, match in [
        ({"disjoint": True}, "disjoint"),
        ({"time_attr": "time"}, "time_attr"),
        ({"weight_attr": "w"}, "weight_attr"),
        ({"subgraph_type": "induced"}, "induced"),
    ]:
        with pytest.raises(NotImplementedError, match=match):
            PlainTorchNeighborSampler(data, [2], **kwargs)
    hetero = HeteroData()
    hetero["a"].num_nodes = 3
    hetero["a", "to", "a"].edge_index = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(NotImplementedError, match="homogeneous"):
        PlainTorchNeighborSampler(hetero, [2])


def test_samplers_refuse_edges_outside_the_graph_before_torch_geometric_reads_them(pyg):
    """torch_geometric's to_csc, run by every NeighborSampler, corrupted the heap (and the
    process aborted) for an edge whose destination is past the node count."""
    torch = pyg
    from torch_geometric.data import Data

    from gpumapio.pyg import PlainTorchNeighborSampler, neighbor_sampler

    for edge_index, match in [
        ([[0, 1], [1, 7]], r"edge 1's destination, node 7, is outside the graph of 5 nodes"),
        ([[0, -1], [1, 2]], r"edge 1's source, node -1, is outside"),
    ]:
        data = Data(x=torch.zeros(5, 1), edge_index=torch.tensor(edge_index), num_nodes=5)
        for make in (PlainTorchNeighborSampler, neighbor_sampler):
            with pytest.raises(ValueError, match=match):
                make(data, [2])


def test_a_table_whose_close_fails_stays_registered_with_its_rows(tmp_path):
    """close() and remove() unregistered a table before its map's close, so a write-back that
    failed (a full disk) dropped the table: a retry found nothing to do, and the rows were
    written, or lost, whenever the map was collected. The table now stays until its close
    succeeds; sync() writes it once the disk has room."""
    native = gpumapio._native
    if not hasattr(native, "_arm_write_fault"):
        pytest.skip("the wheel was built without the fault-injection feature (scripts/test.sh has it)")
    tables = FeatureTables(str(tmp_path), device="host", writable=True, cache=host_cache())
    path = tables.put("paper", "x", np.zeros((1000, 16), np.float32)).path
    tables.write_rows("paper", "x", [0, 1, 2], np.ones((3, 16), np.float32))
    native._arm_write_fault(os.path.basename(path), 28)
    try:
        with pytest.raises(OSError) as raised:
            tables.close()
        assert raised.value.errno == 28, raised.value
        assert tables.keys() == [("paper", "x")]
        with pytest.raises(OSError):
            tables.remove("paper", "x")
        assert tables.keys() == [("paper", "x")]
    finally:
        native._disarm_write_fault()
    tables.sync()
    tables.close()
    assert tables.keys() == []
    on_disk = np.fromfile(path, np.float32).reshape(1000, 16)
    assert (on_disk[:3] == 1).all() and (on_disk[3:] == 0).all()


def test_a_put_that_fails_leaves_no_cut_table_behind(tmp_path):
    """put() wrote a new table's file with Python's own write; one that failed (past the file
    size limit here) left a cut file under the key's name, and the next put took another name.
    It is removed now, and the error names it."""
    script = f"""
import errno, os, resource, signal, numpy as np
from gpumapio.pyg import FeatureTables
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
tables = FeatureTables({str(tmp_path)!r}, device="host")
try:
    tables.put(None, "x", np.ones((10000, 64), np.float32))
    raise SystemExit("the put succeeded")
except OSError as e:
    assert e.errno == errno.EFBIG and e.filename == os.path.join({str(tmp_path)!r}, "x.bin"), (e.errno, e.filename, e)
assert os.listdir({str(tmp_path)!r}) == [], os.listdir({str(tmp_path)!r})
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
assert tables.put(None, "x", np.ones((10, 64), np.float32)).path.endswith("/x.bin")
print("ok")
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr[-2000:]


def test_feature_tables_are_not_copied_into_a_second_owner_of_their_maps(tmp_path):
    """copy.copy made a FeatureTables sharing the registry: closing the copy closed the
    original's maps. Copies are refused, as the native objects refuse them."""
    import copy

    tables = FeatureTables(str(tmp_path), device="host", cache=host_cache())
    tables.put("paper", "x", np.zeros((10, 4), np.float32))
    for make in (copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="cannot be copied"):
            make(tables)
    assert tables.keys() == [("paper", "x")]
    tables.close()

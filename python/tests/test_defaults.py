"""gpumapio.defaults as KvikIO 26.x has it, and the KVIKIO_* / GPUMAP_* variables."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import gpumapio as kvikio
from gpumapio import defaults


def test_get_and_set_each_setting():
    for name, value in [
        ("compat_mode", kvikio.CompatMode.ON),
        ("num_threads", 3),
        ("task_size", 1 << 16),
        ("gds_threshold", 12345),
        ("bounce_buffer_size", 1 << 20),
        ("auto_direct_io_read", True),
        ("auto_direct_io_write", False),
    ]:
        old = defaults.get(name)
        defaults.set(name, value)
        assert defaults.get(name) == value
        defaults.set(name, old)
        assert defaults.get(name) == old
    assert isinstance(defaults.get("compat_mode"), kvikio.CompatMode)
    defaults.set("auto_direct_io_read", "uncached")
    assert defaults.get("auto_direct_io_read") == "uncached"


def test_compat_mode_values():
    for value, want in [
        (kvikio.CompatMode.OFF, kvikio.CompatMode.OFF),
        (True, kvikio.CompatMode.ON),
        (False, kvikio.CompatMode.OFF),
        ("auto", kvikio.CompatMode.AUTO),
        ("ON", kvikio.CompatMode.ON),
        (2, kvikio.CompatMode.AUTO),
    ]:
        defaults.set("compat_mode", value)
        assert defaults.get("compat_mode") is want
    with pytest.raises(ValueError):
        defaults.set("compat_mode", "sometimes")
    with pytest.raises(ValueError):
        defaults.set("compat_mode", 7)


def test_context_managers_nest_and_restore():
    start = {n: defaults.get(n) for n in ("task_size", "num_threads", "gds_threshold")}
    with defaults.set("task_size", 4096):
        assert defaults.get("task_size") == 4096
        with defaults.set({"task_size": 8192, "num_threads": 2}):
            assert defaults.get("task_size") == 8192
            assert defaults.get("num_threads") == 2
            with defaults.set("gds_threshold", 0):
                assert defaults.get("gds_threshold") == 0
            assert defaults.get("gds_threshold") == start["gds_threshold"]
        assert defaults.get("task_size") == 4096
        assert defaults.get("num_threads") == start["num_threads"]
    assert {n: defaults.get(n) for n in start} == start


def test_set_applies_without_with_and_restores_on_error():
    old = defaults.get("task_size")
    defaults.set("task_size", 1 << 20)
    assert defaults.get("task_size") == 1 << 20
    defaults.set("task_size", old)
    with pytest.raises(RuntimeError):
        with defaults.set("task_size", 777):
            raise RuntimeError("inside")
    assert defaults.get("task_size") == old


def test_unknown_names_and_bad_values():
    with pytest.raises(KeyError):
        defaults.get("no_such_setting")
    with pytest.raises(KeyError):
        defaults.set("no_such_setting", 1)
    old = defaults.get("task_size")
    with pytest.raises(KeyError):
        defaults.set({"task_size": 4096, "no_such_setting": 3})
    assert defaults.get("task_size") == old  # nothing changed
    with pytest.raises(ValueError):
        defaults.set({"task_size": 4096, "bounce_buffer_size": 0})
    assert defaults.get("task_size") == old  # nothing changed
    for name, bad, exc in [
        ("task_size", 0, ValueError),
        ("task_size", -5, OverflowError),
        ("task_size", "4MiB", TypeError),
        ("num_threads", 0, ValueError),
        ("num_threads", 5000, ValueError),
        ("gds_threshold", float("nan"), ValueError),
        ("gds_threshold", float("inf"), OverflowError),
        ("gds_threshold", [1], TypeError),
        ("auto_direct_io_write", "maybe", ValueError),
    ]:
        with pytest.raises(exc):
            defaults.set(name, bad)
    with pytest.raises(ValueError):
        defaults.set()
    with pytest.raises(ValueError):
        defaults.set(["task_size", 1])


def test_older_functions():
    old_threads = defaults.get_num_threads()
    defaults.num_threads_reset(2)
    assert defaults.get_num_threads() == 2 == defaults.num_threads()
    defaults.reset_num_threads(old_threads)
    with defaults.set_num_threads(3):
        assert defaults.get_num_threads() == 3
    assert defaults.get_num_threads() == old_threads
    defaults.compat_mode_reset(kvikio.CompatMode.ON)
    assert defaults.compat_mode() == kvikio.CompatMode.ON
    assert defaults.is_compat_mode_preferred()
    with defaults.set_compat_mode(kvikio.CompatMode.AUTO):
        assert defaults.compat_mode() == kvikio.CompatMode.AUTO
    assert defaults.compat_mode() == kvikio.CompatMode.ON
    defaults.task_size_reset(1 << 16)
    assert defaults.task_size() == 1 << 16
    defaults.gds_threshold_reset(0)
    assert defaults.gds_threshold() == 0
    defaults.bounce_buffer_size_reset(8192)
    assert defaults.bounce_buffer_size() == 8192


def test_settings_take_effect_on_transfers(tmp_path):
    path = tmp_path / "d.bin"
    data = os.urandom(300_001)
    path.write_bytes(data)
    with defaults.set({"num_threads": 1, "task_size": 4096, "bounce_buffer_size": 4096}):
        with kvikio.CuFile(path) as f:
            buf = np.zeros(len(data), np.uint8)
            assert f.read(buf) == len(data)
            assert buf.tobytes() == data


def _in_child(env: dict[str, str], code: str):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("KVIKIO_", "GPUMAP_"))}
    full.update(env)
    out = subprocess.run(
        [sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=60
    )
    return out


READ_ALL = (
    "import json, gpumapio; d = gpumapio.defaults; "
    "print(json.dumps({n: (int(d.get(n)) if n == 'compat_mode' else d.get(n)) for n in "
    "['compat_mode', 'num_threads', 'task_size', 'gds_threshold', 'bounce_buffer_size', "
    "'auto_direct_io_read', 'auto_direct_io_write']}))"
)


def test_kvikio_environment_variables():
    out = _in_child(
        {
            "KVIKIO_COMPAT_MODE": "ON",
            "KVIKIO_NTHREADS": "3",
            "KVIKIO_TASK_SIZE": "65536",
            "KVIKIO_GDS_THRESHOLD": "4096",
            "KVIKIO_BOUNCE_BUFFER_SIZE": "8388608",
            "KVIKIO_AUTO_DIRECT_IO_READ": "true",
            "KVIKIO_AUTO_DIRECT_IO_WRITE": "false",
        },
        READ_ALL,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "compat_mode": 1,
        "num_threads": 3,
        "task_size": 65536,
        "gds_threshold": 4096,
        "bounce_buffer_size": 8 << 20,
        "auto_direct_io_read": True,
        "auto_direct_io_write": False,
    }


def test_gpumap_variables_win_and_bad_values_name_the_variable():
    out = _in_child({"KVIKIO_NTHREADS": "3", "GPUMAP_NTHREADS": "5"}, READ_ALL)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["num_threads"] == 5
    out = _in_child({"KVIKIO_TASK_SIZE": "lots"}, READ_ALL)
    assert out.returncode != 0
    assert "ValueError" in out.stderr and "KVIKIO_TASK_SIZE" in out.stderr


U64_MAX = (1 << 64) - 1

# Settings: a value too large names the maximum, the thread limit is the library's (1024)
# everywhere, and wrong types are TypeErrors.
LIMITS = [
    ("task_size", 1, U64_MAX),
    ("gds_threshold", 0, U64_MAX),
    ("bounce_buffer_size", 1, U64_MAX - 4095),
    ("num_threads", 1, 1024),
]


@pytest.mark.parametrize("name,least,most", LIMITS, ids=[n for n, _, _ in LIMITS])
def test_size_settings_say_their_limits(name, least, most):
    # Past gpumap's own limit: a ValueError naming it; past 64 bits, KvikIO's OverflowError.
    if most < U64_MAX:
        with pytest.raises(ValueError) as e:
            defaults.set(name, most + 1)
        assert "too large" in str(e.value) and str(most) in str(e.value), str(e.value)
    for too_large in (2**64, 2**200):
        with pytest.raises(OverflowError, match="too large to convert") as e:
            defaults.set(name, too_large)
        assert str(most) in str(e.value), str(e.value)
    # Negative: KvikIO's OverflowError; zero where a positive value is needed: its ValueError.
    for negative in (-1, -(2**100)):
        with pytest.raises(OverflowError, match="negative value"):
            defaults.set(name, negative)
    if least == 1:
        with pytest.raises(ValueError, match="positive integer"):
            defaults.set(name, 0)
    for wrong in ("4096", b"4096", None, [4096]):
        with pytest.raises(TypeError, match="int"):
            defaults.set(name, wrong)


@pytest.mark.parametrize("name", [n for n, _, _ in LIMITS] + ["http_max_attempts", "http_timeout"])
def test_int_settings_take_what_kvikio_takes(name):
    """KvikIO 26.10's bindings (probed on the GPU machine, 2026-11-25) take a float truncated
    toward zero, a bool as 0 or 1, and NumPy's integers."""
    for given, taken in [(4.7, 4), (16.0, 16), (np.int64(7), 7), (np.uint32(3), 3),
                         (np.float32(5.9), 5), (True, 1)]:
        with defaults.set(name, given):
            assert defaults.get(name) == taken and type(defaults.get(name)) is int, (given, taken)
    # Truncated to zero: refused as zero is.
    if name != "gds_threshold":
        for zero in (0.9, False):
            with pytest.raises(ValueError, match="positive integer"):
                defaults.set(name, zero)
    else:
        with defaults.set(name, 0.9):
            assert defaults.get(name) == 0


def test_status_codes_take_what_kvikio_takes():
    with defaults.set("http_status_codes", [500.0, True, np.int16(503)]):
        assert defaults.get("http_status_codes") == [500, 1, 503]
    for wrong in ((500, 503), ["500"], [None]):
        with pytest.raises(TypeError, match="list"):
            defaults.set("http_status_codes", wrong)


def test_the_thread_limit_is_the_librarys_in_every_message():
    for n in (1025, 2000, 4096, 5000):
        with pytest.raises(ValueError) as e:
            defaults.set("num_threads", n)
        assert "1024" in str(e.value) and "at most 4096" not in str(e.value), str(e.value)
    with defaults.set("num_threads", 1024):
        assert defaults.get("num_threads") == 1024


@pytest.mark.parametrize("name", ["compat_mode", "auto_direct_io_read", "auto_direct_io_write"])
def test_choice_settings_refuse_huge_negative_and_wrong_types(name):
    for bad in (2**64, 2**200, -1, 7):
        with pytest.raises(ValueError) as e:
            defaults.set(name, bad)
        assert str(bad) in str(e.value), str(e.value)
    for wrong in (None, [1], "maybe" if name == "compat_mode" else b"on"):
        with pytest.raises((TypeError, ValueError)):
            defaults.set(name, wrong)
    if name == "compat_mode":
        # KvikIO truncates a float to the enum's number.
        for given, mode in [(1.0, kvikio.CompatMode.ON), (1.5, kvikio.CompatMode.ON),
                            (2.0, kvikio.CompatMode.AUTO), (0.2, kvikio.CompatMode.OFF)]:
            with defaults.set(name, given):
                assert defaults.get(name) == mode
    else:
        # 0 and 1 in any number type; other numbers are refused by name, not taken as truths.
        for given, on in [(1.0, True), (0.0, False)]:
            with defaults.set(name, given):
                assert defaults.get(name) is on
        for bad in (0.5, 1.5, 7.0):
            with pytest.raises(ValueError) as e:
                defaults.set(name, bad)
            assert str(bad) in str(e.value), str(e.value)


def test_the_names_docs_and_aliases_follow_the_librarys_table():
    """defaults' names are the library's table's; its docstring documents each row and names
    each KVIKIO_* alias, and nothing more: a setting added to one place only fails here."""
    import re

    from gpumapio import _native

    table = _native.settings_table()
    names = [row["name"] for row in table]
    assert tuple(names) == defaults._NAMES
    assert [row["name"] for row in defaults.SETTINGS_TABLE] == names
    for row in table:
        assert set(row) == {"name", "field", "env", "alias", "default", "scope", "doc"}
        assert row["env"] == "GPUMAP_" + row["alias"].removeprefix("KVIKIO_"), row
        assert row["scope"] in ("handle", "pool", "remote"), row
        defaults.get(row["name"])  # known to get and set
    doc = defaults.__doc__
    documented = re.findall(r"^``(\w+)``\s{2,}", doc, flags=re.M)
    assert documented == names
    aliases = re.findall(r"``(KVIKIO_\w+)``", doc)
    assert aliases == [row["alias"] for row in table]


def test_set_values_round_trip_for_every_setting_of_the_table():
    for name in defaults._NAMES:
        value = defaults.get(name)
        with defaults.set(name, value):
            assert defaults.get(name) == value
        assert defaults.get(name) == value


SOURCES_RESTORED = """
import json, gpumapio
from gpumapio import _native
d = gpumapio.defaults
seen = {"before": [_native.defaults_saved(n)[1:] for n in ("task_size", "num_threads")]}
with d.set({"task_size": 1 << 16, "num_threads": 2}):
    seen["inside"] = [_native.defaults_saved(n)[1:] for n in ("task_size", "num_threads")]
    with d.set("task_size", 1 << 17):
        pass
    seen["nested"] = [_native.defaults_saved(n)[1:] for n in ("task_size", "num_threads")]
seen["after"] = [_native.defaults_saved(n)[1:] for n in ("task_size", "num_threads")]
try:
    d.set({"task_size": 1 << 18, "num_threads": 0})
except ValueError:
    pass
seen["refused"] = [_native.defaults_saved(n)[1:] for n in ("task_size", "num_threads")]
seen["values"] = [d.get("task_size"), d.get("num_threads")]
print(json.dumps(seen))
"""


def test_a_restored_setting_comes_back_with_its_source():
    # Back at its default or its variable's value, a setting is again one the library may
    # tune for a file's file system; only a value the program set stays "set".
    out = _in_child({"GPUMAP_NTHREADS": "3"}, SOURCES_RESTORED)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    start = [["default", None], ["env", "GPUMAP_NTHREADS"]]
    assert seen["before"] == start
    assert seen["inside"] == [["set", None], ["set", None]]
    assert seen["nested"] == [["set", None], ["set", None]]
    assert seen["after"] == start
    assert seen["refused"] == start
    assert seen["values"][1] == 3


def test_putting_back_refuses_sources_it_never_gives():
    with pytest.raises(ValueError, match="not a source"):
        kvikio._native.defaults_put_back("task_size", 1 << 20, "env")
    with pytest.raises(ValueError, match="not a source"):
        kvikio._native.defaults_put_back("task_size", 1 << 20, "somewhere")
    with pytest.raises(KeyError):
        kvikio._native.defaults_saved("no_such_setting")

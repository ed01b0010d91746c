"""Fuzzing the keys of the zarr store (GpumapStore) with hypothesis.

- Any key string, through every key-taking method: a ValueError exactly for the keys a plain
  model of zarr keys refuses, and never a file touched outside the store's root.
- Keys zarr itself makes (zarr.testing's strategies) always work, set then read back.
- zarr's own state machines (zarr.testing.stateful) against this store: a store of random keys
  and values compared with a dict, and a hierarchy of groups and arrays compared with
  zarr's MemoryStore.

Examples per test: see fuzzing.py (GPUMAP_FUZZ_EXAMPLES for long runs by hand).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import warnings
from pathlib import Path
from unittest import mock

import pytest

pytest.importorskip("hypothesis")
zarr = pytest.importorskip("zarr", minversion="3")

from fuzzing import examples  # noqa: E402
from hypothesis import assume, given, note, settings  # noqa: E402
from hypothesis.stateful import rule  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402
from zarr.core.buffer.core import default_buffer_prototype  # noqa: E402
from zarr.testing.stateful import MAX_BINARY_SIZE, ZarrHierarchyStateMachine, ZarrStoreStateMachine  # noqa: E402
from zarr.testing.strategies import keys as zarr_keys  # noqa: E402

from gpumapio.zarr import GpumapStore  # noqa: E402

PROTO = default_buffer_prototype()


def valid_key(root: Path, key: str, prefix: bool = False) -> bool:
    """Which keys the store takes, written plainly: names separated by '/', none empty, '.'
    or '..', no NUL or backslash, Unicode text, names of at most 255 bytes (UTF-8) and a path
    under PATH_MAX. For prefixes, one trailing '/' is allowed and '' is the root."""
    if prefix and key.endswith("/"):
        key = key[:-1]
    if key == "":
        return prefix
    if "\0" in key or "\\" in key or key.startswith("/"):
        return False
    names = key.split("/")
    if any(name in ("", ".", "..") for name in names):
        return False
    try:
        sizes = [len(name.encode("utf-8")) for name in names]
    except UnicodeEncodeError:
        return False
    return max(sizes) <= 255 and len(os.fsencode(root.joinpath(*names))) < 4096


hostile_names = (
    st.sampled_from(["..", ".", "", "a", "b.c", "zarr.json", "c", "0", "~", "...", " ", "\\", "\x00", "a\\..", "\ud800"])
    | st.text(max_size=4)
    | st.text(st.characters(exclude_categories=[]), max_size=3)  # surrogates included
    | st.text(st.sampled_from("xé"), min_size=120, max_size=260)  # near 255 bytes
)
hostile_keys = (
    st.lists(hostile_names, max_size=5).map("/".join)
    | st.tuples(st.sampled_from(["/", "//", "./", "../", ""]), st.lists(hostile_names, max_size=3).map("/".join))
    .map("".join)
    | st.text(max_size=12)
    | st.text(st.characters(exclude_categories=[]), max_size=8)
)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A directory holding the store's root and, beside it, files no key may reach."""
    outer = tmp_path_factory.mktemp("sandbox")
    (outer / "secret").write_bytes(b"keep")
    (outer / "store-sibling").mkdir()
    return outer


def _outside(outer: Path, root: Path) -> list[str]:
    """Everything under ``outer`` that is not under ``root``, with file contents."""
    found = []
    for dirpath, dirnames, filenames in os.walk(outer):
        here = Path(dirpath)
        if here == root or root in here.parents:
            continue
        found += [f"{here / d}/" for d in dirnames if here / d != root]
        found += [f"{here / f}={(here / f).read_bytes()!r}" for f in filenames]
    return sorted(found)


@contextlib.contextmanager
def _confined(root: Path):
    """Makes every deletion, rename and link outside ``root`` an AssertionError before it
    happens. Without it a regression in the key checks could delete real files while this
    test runs (``root / "/"`` is the file system's root)."""
    inside = os.path.abspath(root)

    def check(path) -> None:
        where = os.path.abspath(os.fsdecode(path))
        if where != inside and not where.startswith(inside + os.sep):
            raise AssertionError(f"the store tried to change {where!r}, outside {inside!r}")

    def guard(real, *which):
        def guarded(*args, **kwargs):
            if kwargs.get("dir_fd") is None:  # with dir_fd: inside an rmtree checked already
                for i in which:
                    check(args[i])
            return real(*args, **kwargs)

        return guarded

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch("shutil.rmtree", guard(shutil.rmtree, 0)))
        for name, which in [("unlink", (0,)), ("remove", (0,)), ("rmdir", (0,)), ("replace", (0, 1)),
                            ("rename", (0, 1)), ("link", (0, 1))]:
            stack.enter_context(mock.patch(f"os.{name}", guard(getattr(os, name), *which)))
        yield


OPS = ["set", "get", "exists", "delete", "getsize", "list_prefix", "list_dir", "delete_dir"]


def _call(store: GpumapStore, op: str, key: str) -> object:
    if op == "set":
        store.set_sync(key, PROTO.buffer.from_bytes(key.encode("utf-8", "replace")))
        return None
    if op == "get":
        return store.get_sync(key, prototype=PROTO)

    async def run():
        if op in ("list_prefix", "list_dir"):
            return [k async for k in getattr(store, op)(key)]
        return await getattr(store, op)(key)

    return asyncio.run(run())


@examples(300)
@given(calls=st.lists(st.tuples(st.sampled_from(OPS), hostile_keys), min_size=1, max_size=6))
def test_any_key_stays_inside_the_store_or_is_a_value_error(sandbox, calls):
    root = sandbox / "store"
    shutil.rmtree(root, ignore_errors=True)
    store = GpumapStore(root)
    before = _outside(sandbox, root)
    with _confined(root):
        _judge(store, root, sandbox, before, calls)
    for path in root.rglob("*"):
        assert path.resolve().is_relative_to(root.resolve())


def _judge(store: GpumapStore, root: Path, sandbox: Path, before: list[str], calls) -> None:
    for op, key in calls:
        prefix = op in ("list_prefix", "list_dir", "delete_dir") or (op in ("get", "exists") and key == "")
        expected_valid = valid_key(root, key, prefix)
        note(f"{op}({key!r}) valid={expected_valid}")
        try:
            _call(store, op, key)
            assert expected_valid, f"{op}({key!r}) accepted"
        except ValueError as e:
            # LocalStore's own refusal: delete_dir of a key that names a file.
            assert not expected_valid or (op == "delete_dir" and "is a file" in str(e)), f"{op}({key!r}): {e}"
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError) as e:
            # Where earlier calls left a file where a directory is wanted, or the reverse.
            assert expected_valid, f"{op}({key!r}): {e!r}"
        assert _outside(sandbox, root) == before, f"{op}({key!r}) touched files outside the store"


@examples(150)
@given(key=zarr_keys(max_num_nodes=4), data=st.binary(max_size=64))
def test_keys_zarr_makes_are_taken_and_read_back(tmp_path_factory, key, data):
    root = tmp_path_factory.getbasetemp() / "zarr-keys"
    shutil.rmtree(root, ignore_errors=True)
    store = GpumapStore(root)
    assert valid_key(root, key)
    store.set_sync(key, PROTO.buffer.from_bytes(data))
    assert store.get_sync(key, prototype=PROTO).to_bytes() == data
    assert asyncio.run(store.exists(key))
    assert (root / key).is_file()


def _run_machine(machine, tmp_path: Path, default: int, steps: int) -> None:
    root = tmp_path / "store"
    root.mkdir()
    store = GpumapStore(root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr's notes on dtypes without a v3 specification
        run_state_machine_as_test(
            lambda: machine(store),  # type: ignore[arg-type]  # hypothesis takes a factory too
            settings=settings(examples(default), stateful_step_count=steps),
        )


class FileTreeStoreStateMachine(ZarrStoreStateMachine):
    """zarr's store machine, less the sets a tree of files cannot hold: a key under another
    that holds a value ("0" then "0/0"), or one over keys below it. zarr's own LocalStore
    refuses those too (FileExistsError, IsADirectoryError); its model, a dict, does not."""

    @rule(key=zarr_keys(), data=st.binary(min_size=0, max_size=MAX_BINARY_SIZE))
    def set(self, key: str, data: bytes) -> None:
        assume(not any(key.startswith(k + "/") or k.startswith(key + "/") for k in self.model))
        ZarrStoreStateMachine.set(self, key, data)


def test_a_value_where_a_key_needs_a_directory_is_refused_as_zarrs_local_store_refuses_it(tmp_path):
    store = GpumapStore(tmp_path / "store")
    store.set_sync("0", PROTO.buffer.from_bytes(b"x"))
    with pytest.raises(FileExistsError):
        store.set_sync("0/0", PROTO.buffer.from_bytes(b""))
    store.set_sync("1/0", PROTO.buffer.from_bytes(b"y"))
    with pytest.raises(IsADirectoryError):
        store.set_sync("1", PROTO.buffer.from_bytes(b""))
    assert sorted(asyncio.run(_listed(store))) == ["0", "1/0"]
    assert store.get_sync("0", prototype=PROTO).to_bytes() == b"x"


async def _listed(store: GpumapStore) -> list[str]:
    return [k async for k in store.list()]


def test_zarr_store_state_machine(tmp_path):
    _run_machine(FileTreeStoreStateMachine, tmp_path, 20, 10)


def test_zarr_hierarchy_state_machine(tmp_path):
    _run_machine(ZarrHierarchyStateMachine, tmp_path, 5, 10)


def test_the_guard_stops_changes_outside_the_store(sandbox):
    root = sandbox / "store"
    root.mkdir(exist_ok=True)
    victim = sandbox / "store-sibling" / "victim"
    victim.write_bytes(b"x")
    with _confined(root):
        for change in (
            lambda: shutil.rmtree(sandbox / "store-sibling"),
            lambda: victim.unlink(),
            lambda: os.replace(root / "nothing", victim),
            lambda: os.link(victim, sandbox / "linked"),
        ):
            with pytest.raises(AssertionError, match="outside"):
                change()
    assert victim.read_bytes() == b"x"
    victim.unlink()

"""The GIL is released while gpumap moves data: other Python threads run meanwhile."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np

import gpumapio


def _spin_rate(seconds: float) -> float:
    spins, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        spins += 1
    return spins / seconds


def test_other_threads_run_during_a_read(tmp_path):
    buf = np.empty(64 << 20, dtype=np.uint8)
    # A sparse file reads as zeros with no disk involved (device files such as /dev/zero are
    # refused: only regular files are read).
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as f:
        f.truncate(buf.nbytes)
    started, done = threading.Event(), threading.Event()
    failures = []

    def reader():
        try:
            with gpumapio.defaults.set("num_threads", 1), gpumapio.CuFile(sparse, "r") as f:
                started.set()
                for _ in range(2):
                    assert f.read(buf) == buf.nbytes
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            failures.append(e)
            started.set()
        done.set()

    rate = _spin_rate(0.1)
    old = sys.getswitchinterval()
    # A thread holding the GIL through a read would now keep this one waiting for the whole
    # read; a thread that releases it lets this one run all along.
    sys.setswitchinterval(0.2)
    try:
        thread = threading.Thread(target=reader)
        thread.start()
        assert started.wait(30), "the reader never started"
        t = time.perf_counter()
        spins = 0
        while not done.is_set():
            spins += 1
            time.perf_counter()
        elapsed = time.perf_counter() - t
        thread.join()
    finally:
        sys.setswitchinterval(old)
    assert not failures, failures
    share = spins / (rate * elapsed)
    assert share > 0.2, f"this thread ran {share:.0%} of the {elapsed:.3f} s the reads took"

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


def test_other_threads_run_during_a_read():
    buf = np.empty(64 << 20, dtype=np.uint8)
    started, done = threading.Event(), threading.Event()

    def reader():
        with gpumapio.defaults.set("num_threads", 1), gpumapio.CuFile("/dev/zero", "r") as f:
            started.set()
            for _ in range(2):  # /dev/zero: as long as we like, no disk involved
                assert f.read(buf) == buf.nbytes
        done.set()

    rate = _spin_rate(0.1)
    old = sys.getswitchinterval()
    # A thread holding the GIL through a read would now keep this one waiting for the whole
    # read; a thread that releases it lets this one run all along.
    sys.setswitchinterval(0.2)
    try:
        thread = threading.Thread(target=reader)
        thread.start()
        started.wait()
        t = time.perf_counter()
        spins = 0
        while not done.is_set():
            spins += 1
            time.perf_counter()
        elapsed = time.perf_counter() - t
        thread.join()
    finally:
        sys.setswitchinterval(old)
    share = spins / (rate * elapsed)
    assert share > 0.2, f"this thread ran {share:.0%} of the {elapsed:.3f} s the reads took"

"""The type stubs of the extension module say what it really has (mypy's stubtest)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_native_stubs_match_the_module(tmp_path):
    pytest.importorskip("mypy")
    run = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "gpumapio._native"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr

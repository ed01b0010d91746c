#!/usr/bin/env python3
"""Compiles crates/gpumap/kernels/*.cu to PTX with NVRTC, for the library to embed.

No nvcc is needed: NVRTC comes from PyPI (`pip install nvidia-cuda-nvrtc-cu12==12.8.93`, which
this script does into a scratch folder when it is missing). The PTX targets compute_70 and is
stamped with the PTX ISA of CUDA 12.8 (8.7), the oldest driver gpumap supports, so that any
driver from 12.8 on can JIT it for its GPU. If `ptxas` is on PATH (the nvidia-cuda-nvcc-cu12
wheel has one), the PTX is also assembled for sm_90 as a check.

Usage: python3 scripts/build-ptx.py [--check]   (--check: fail if the committed PTX differs)
"""
import ctypes
import glob
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = os.path.join(ROOT, "crates", "gpumap", "kernels")
NVRTC_WHEEL = "nvidia-cuda-nvrtc-cu12==12.8.93"


def load_nvrtc():
    for candidate in glob.glob(os.path.join(tempfile.gettempdir(), "gpumap-nvrtc", "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.*")):
        return ctypes.CDLL(candidate)
    target = os.path.join(tempfile.gettempdir(), "gpumap-nvrtc")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, NVRTC_WHEEL], check=True)
    return load_nvrtc()


def headers():
    """The headers beside the kernels (`#include "gpumap_table.h"`), handed to NVRTC by name."""
    paths = sorted(glob.glob(os.path.join(KERNELS, "*.h")))
    names = [os.path.basename(p).encode() for p in paths]
    texts = [open(p).read().encode() for p in paths]
    return len(paths), (ctypes.c_char_p * len(texts))(*texts), (ctypes.c_char_p * len(names))(*names)


def compile_ptx(nvrtc, source, name):
    prog = ctypes.c_void_p()
    count, texts, names = headers()
    check(nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), count, texts, names), "create")
    opts = [b"--gpu-architecture=compute_70", b"-default-device", b"--std=c++11"]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        sys.exit(f"{name}: NVRTC failed:\n{log.value.decode()}")
    nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    check(nvrtc, nvrtc.nvrtcGetPTX(prog, ptx), "get PTX")
    text = ptx.value.decode()
    # Stamp the oldest ISA the supported drivers accept; the kernel uses nothing newer.
    lines = [(".version 8.7" if l.startswith(".version ") else l) for l in text.splitlines()]
    header = f"// Generated from {name} by scripts/build-ptx.py (NVRTC, compute_70). Do not edit.\n"
    return header + "\n".join(lines) + "\n"


def check(nvrtc, rc, what):
    if rc != 0:
        nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
        sys.exit(f"NVRTC {what}: {nvrtc.nvrtcGetErrorString(rc).decode()}")


def main():
    check_only = "--check" in sys.argv
    nvrtc = load_nvrtc()
    stale = []
    for cu in sorted(glob.glob(os.path.join(KERNELS, "*.cu"))):
        name = os.path.basename(cu)
        ptx = compile_ptx(nvrtc, open(cu).read(), name)
        out = cu[:-3] + ".ptx"
        if check_only:
            if not os.path.exists(out) or open(out).read() != ptx:
                stale.append(out)
            continue
        open(out, "w").write(ptx)
        print(f"wrote {os.path.relpath(out, ROOT)}")
        ptxas = os.environ.get("PTXAS", "ptxas")
        try:
            with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
                subprocess.run([ptxas, "-arch=sm_90", out, "-o", cubin.name], check=True)
                print(f"  ptxas sm_90: ok")
        except FileNotFoundError:
            print("  (ptxas not found: PTX not assembled as a check)")
    if stale:
        sys.exit("stale PTX (run scripts/build-ptx.py): " + ", ".join(stale))


if __name__ == "__main__":
    main()

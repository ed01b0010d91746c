#!/usr/bin/env bash
# Stages everything one GPU-machine session needs under .gpu/ (git-ignored): the release test
# binaries, bins and bench binaries (../shared/gpu/stage.sh, plus the bench targets of
# crates/gpumap-bench, which that script only builds for a root benches/ folder), the gpumapio
# wheel (abi3, manylinux), and the pure-Python wheels the Python tests and bench need that the
# machine lacks (zarr and its dependencies, pytest, pytest-asyncio, hypothesis, fastsafetensors, instanttensor). NumPy is not carried:
# CuPy and PyTorch there were built against theirs. The trybuild test (it needs cargo) stays.
# Then, on the GPU machine (docs/gpu.md):
#   bash .gpu/on-device.sh tests                      (GPUMAP_BIN=$PWD/.gpu/bin/gpumap for the CLI tests)
#   bash .gpu/on-device.sh bench 4
#   bash .gpu/on-device.sh run .gpu/bin/example-map_kernel    (each example: example-NAME)
#   bash .gpu/on-device.sh run python3 -m pytest python/tests -rs -p no:cacheprovider
#   bash .gpu/on-device.sh run python3 python/bench/bench.py FILE --jsonl "$OUT/results.jsonl"
# Usage (project root): scripts/stage-gpu.sh [extra stage.sh args, e.g. --test cuda]
# GPUMAP_GPU_KIT names the workplace's GPU kit (stage.sh, on-device.sh); default ../shared/gpu.
set -euo pipefail
cd "$(dirname "$0")/.."
kit=${GPUMAP_GPU_KIT:-../shared/gpu}
if [ ! -f "$kit/stage.sh" ]; then
  echo "stage-gpu.sh: no GPU kit at $kit (set GPUMAP_GPU_KIT to the folder holding stage.sh)" >&2
  exit 2
fi
CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} maturin build --release -m python/Cargo.toml
bash "$kit/stage.sh" "$@"
rm -f .gpu/bin/test-compile_fail
cargo bench -p gpumap-bench --no-run --message-format=json 2>/dev/null | python3 -c '
import json, shutil, subprocess, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["bench"]:
        dest = ".gpu/bin/bench-" + m["target"]["name"]
        shutil.copy(m["executable"], dest)
        subprocess.run(["strip", dest], check=False)
        print("staged", dest)'
# The library's examples as .gpu/bin/example-NAME (run there with
# `bash .gpu/on-device.sh run .gpu/bin/example-NAME`); stage.sh staged them under their bare
# names too (stripped its own way): those copies are removed so that each travels once.
cargo build --release -p gpumap --examples --message-format=json 2>/dev/null | python3 -c '
import json, os, shutil, subprocess, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["example"]:
        name = m["target"]["name"]
        dest = ".gpu/bin/example-" + name
        shutil.copy(m["executable"], dest)
        subprocess.run(["strip", dest], check=False)
        bare = ".gpu/bin/" + name
        if os.path.exists(bare): os.remove(bare)
        print("staged", dest)'
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$tmp" 'zarr>=3' pytest pytest-asyncio hypothesis
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d "$tmp" fastsafetensors==0.5.0 \
  || echo "stage-gpu.sh: fastsafetensors not staged; the safetensors bench skips that row" >&2
# InstantTensor, the checkpoint bench's peer (python/bench/checkpoint.py); it needs torch, there.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d "$tmp" instanttensor==0.2.2 \
  || echo "stage-gpu.sh: instanttensor not staged; the checkpoint bench reports it as not installed" >&2
rm -f "$tmp"/numpy-*.whl
mkdir -p .gpu/whl
cp "$tmp"/*.whl .gpu/whl/
ls .gpu/bin .gpu/pywhl .gpu/whl
du -sh .gpu

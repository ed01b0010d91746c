#!/usr/bin/env bash
# Stages the Python side for the GPU machine (no network there; CPython 3.12, CuPy, PyTorch,
# NumPy and safetensors installed): builds the gpumapio wheel (abi3, manylinux) into
# target/wheels/, runs ../shared/gpu/stage.sh (which copies it to .gpu/pywhl/), and adds the
# pure-Python wheels the tests need that the machine lacks (zarr and its dependencies, pytest)
# to .gpu/whl/. NumPy is not carried: CuPy and PyTorch there were built against theirs.
# Then, on the GPU machine:
#   bash .gpu/on-device.sh run python3 -m pytest python/tests -rs -p no:cacheprovider
#   bash .gpu/on-device.sh run python3 python/bench/bench.py FILE --jsonl "$OUT/results.jsonl"
# Usage (project root): scripts/stage-python.sh [extra stage.sh args, e.g. --test cuda]
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} maturin build --release -m python/Cargo.toml
bash ../shared/gpu/stage.sh "$@"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$tmp" 'zarr>=3' pytest
rm -f "$tmp"/numpy-*.whl
mkdir -p .gpu/whl
cp "$tmp"/*.whl .gpu/whl/
ls .gpu/pywhl .gpu/whl

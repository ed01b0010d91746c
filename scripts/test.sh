#!/usr/bin/env bash
# Every test: the Rust workspace's (`cargo test --release`), then the Python package's — the
# wheel built from this repository (maturin, abi3) and installed into a fresh virtual
# environment with the registry packages the tests use, then pytest on python/tests.
# The fuzz tests (proptest in Rust, hypothesis in python/tests/test_fuzz_*.py) run briefly
# here; docs/fuzzing.md says how to run them longer.
# Rust GPU tests are #[ignore]d with the reason (cargo counts them in its summary); where
# `nvidia-smi` finds a GPU, or GPUMAP_REQUIRE_GPU=1 demands one, they run (--include-ignored)
# and a missing GPU fails them. Python GPU tests skip with the reason (pytest -rs).
# Usage: scripts/test.sh [extra pytest args]      PYTHON=python3.12 picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

gpu_tests=()
if [ "${GPUMAP_REQUIRE_GPU:-0}" = 1 ] || nvidia-smi -L >/dev/null 2>&1; then
  gpu_tests=(-- --include-ignored)
fi
echo "== Rust: cargo test --release ${gpu_tests[*]}"
cargo test --release "${gpu_tests[@]}"

echo "== the library's dependencies: scripts/check-deps.sh (no CLI crates; rust-version)"
bash scripts/check-deps.sh

echo "== examples: scripts/examples.sh (every crates/gpumap/examples program, run once)"
bash scripts/examples.sh

echo "== Python: build the wheel into a fresh virtual environment"
work=$(mktemp -d "${TMPDIR:-/tmp}/gpumapio-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
python=${PYTHON:-python3}
"$python" -m venv "$work/venv"
py="$work/venv/bin/python"
if command -v maturin >/dev/null 2>&1; then
  maturin=maturin
else
  "$py" -m pip install -q 'maturin>=1.5,<2'
  maturin="$work/venv/bin/maturin"
fi
# fault-injection: the hidden _native._arm_write_fault the tests use to make write-backs fail
# (a test-only feature; release wheels are built without it).
"$maturin" build --release -m python/Cargo.toml -i "$py" -o "$work/wheels" --features fault-injection
# moto[server]: the S3 server python/tests/test_remote.py reads from on 127.0.0.1, as KvikIO's
# remote tests do; pytest-asyncio: zarr's own StoreTests are async; dask and distributed:
# python/tests/test_dask.py's LocalCluster.
"$py" -m pip install -q "$work"/wheels/gpumapio-*.whl numpy pytest pytest-asyncio 'zarr>=3' safetensors mypy hypothesis 'moto[server]' 'dask[array]' distributed

echo "== Python: pytest (the installed wheel, not the source tree)"
cd "$work"
"$py" -c 'import gpumapio, sys; print("gpumapio", gpumapio.__version__, "from", gpumapio.__file__)'
"$py" -m pytest "$repo/python/tests" -rs -p no:cacheprovider "$@"

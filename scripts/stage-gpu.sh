#!/usr/bin/env bash
# Stages, under .gpu/ (git-ignored), everything one session on the lent GPU machine needs, which
# has no Rust, no network and a 64 MiB limit on what travels beside the working tree
# (docs/gpu.md):
#   .gpu/bin.tar.xz    the release executables, stripped (scripts/gpu/stage_executables.py):
#                      test-PACKAGE-TARGET, bench-TARGET, example-TARGET and the `gpumap` bin;
#                      packed, since unpacked they are more than the limit; on-device.sh unpacks
#   .gpu/on-device.sh  the machine-side entry point (scripts/gpu/on-device.sh)
#   .gpu/pywhl/        the gpumapio wheel (abi3, manylinux), built here with maturin
#   .gpu/whl/          wheels the machine lacks: KvikIO (the peer of every benchmark; downloaded
#                      once), zarr and its dependencies, pytest, pytest-asyncio, hypothesis,
#                      dask and distributed (python/tests/test_dask.py), fastsafetensors and
#                      instanttensor. NumPy is not carried: CuPy and PyTorch
#                      there were built against theirs.
# Then, there, with .gpu carried: bash .gpu/on-device.sh tests --include-ignored | bench 4 |
# env | run CMD... (docs/gpu.md).
# Usage (any folder): scripts/stage-gpu.sh [cargo args for the test and build steps, e.g.
# --test cuda to stage fewer test binaries]
set -euo pipefail
cd "$(dirname "$0")/.."
limit_bytes=$((64 << 20))

rm -rf .gpu/bin .gpu/bin.tar.xz .gpu/pywhl
mkdir -p .gpu/bin .gpu/whl .gpu/pywhl
cp scripts/gpu/on-device.sh .gpu/

echo "== the gpumapio wheel"
CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} maturin build --release -m python/Cargo.toml --out .gpu/pywhl

echo "== executables: test binaries, bins and examples, bench targets"
# test-gpumap-compile_fail is the trybuild test: it runs cargo, which the machine lacks.
{
  cargo test --release --no-run --message-format=json "$@"
  cargo build --release --bins --examples --message-format=json "$@"
  cargo bench -p gpumap-bench --no-run --message-format=json
} | python3 scripts/gpu/stage_executables.py .gpu/bin test-gpumap-compile_fail

echo "== wheels for the machine"
if ! ls .gpu/whl/kvikio_cu13-*.whl >/dev/null 2>&1; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu/whl kvikio-cu13==26.10.0 libkvikio-cu13==26.10.0 'rapids-logger==0.3.*' \
    || echo "stage-gpu.sh: could not download the KvikIO wheels; 'bench' will run without the peer" >&2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$tmp" 'zarr>=3' pytest pytest-asyncio hypothesis 'dask[array]' distributed
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d "$tmp" fastsafetensors==0.5.0 \
  || echo "stage-gpu.sh: fastsafetensors not staged; the safetensors bench skips that row" >&2
# InstantTensor, the checkpoint bench's peer (python/bench/checkpoint.py); it needs torch, there.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d "$tmp" instanttensor==0.2.2 \
  || echo "stage-gpu.sh: instanttensor not staged; the checkpoint bench reports it as not installed" >&2
rm -f "$tmp"/numpy-*.whl
# One version of each travels: the previous staging's are replaced, all but KvikIO's (kept).
find .gpu/whl -name '*.whl' ! -name 'kvikio_cu13-*' ! -name 'libkvikio_cu13-*' \
  ! -name 'rapids_logger-*' -delete
cp "$tmp"/*.whl .gpu/whl/

echo "== packing .gpu/bin"
ls -l .gpu/bin
# A dictionary larger than all the executables together: they share most of their code (the
# same crates linked into each), which xz then stores once. At xz's default (-6, 8 MiB) the
# pack was over the limit; with this one it is a fraction of it. Unpacking needs as much
# memory as the dictionary.
tar -cf - -C .gpu bin | xz -9 --lzma2=preset=9,dict=384MiB > .gpu/bin.tar.xz
rm -rf .gpu/bin
ls .gpu .gpu/pywhl .gpu/whl
bytes=$(du -sb .gpu | cut -f1)
echo "staged .gpu/: $((bytes >> 20)) MiB ($bytes bytes; the limit is $((limit_bytes >> 20)) MiB)"
if [ "$bytes" -gt "$limit_bytes" ]; then
  echo "stage-gpu.sh: .gpu/ is over the $((limit_bytes >> 20)) MiB the GPU machine takes;" \
    "stage fewer test binaries (e.g. --test cuda)" >&2
  exit 1
fi

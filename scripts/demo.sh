#!/usr/bin/env bash
# The main job on any Linux machine: write a 1 GiB file, then read it back into GPU memory
# (host memory where there is no GPU), checking every byte; then map it under a 256 MiB budget
# and walk it through views, checking every byte again. Usage: scripts/demo.sh [SIZE] [FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-1GiB}
file=${2:-${TMPDIR:-/tmp}/gpumap-demo.bin}
cargo build --release --quiet --bin gpumap
bin=${CARGO_TARGET_DIR:-target}/release/gpumap
"$bin" info
"$bin" write "$file" --size "$size" --truncate
"$bin" read "$file" --verify-pattern
"$bin" map "$file" --budget 256MiB --verify-pattern
rm -f "$file"

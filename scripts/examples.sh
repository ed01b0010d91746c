#!/usr/bin/env bash
# Builds and runs every example of the library (crates/gpumap/examples: NAME.rs, or NAME/main.rs),
# each on data it generates in a temporary directory; fails if any fails. They run anywhere:
# without a GPU host memory stands in for it (map_kernel then says its kernel was skipped).
# Usage: scripts/examples.sh [NAME...]      (default: every example found)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in crates/gpumap/examples/*.rs crates/gpumap/examples/*/main.rs; do
    [ -e "$f" ] || continue
    case "$f" in
      */main.rs) names+=("$(basename "$(dirname "$f")")") ;;
      *) names+=("$(basename "$f" .rs)") ;;
    esac
  done
fi
[ ${#names[@]} -gt 0 ] || { echo "examples.sh: no examples in crates/gpumap/examples" >&2; exit 1; }

cargo build --release -p gpumap --examples
failed=()
for name in "${names[@]}"; do
  echo "-- example $name"
  cargo run --release -q -p gpumap --example "$name" || failed+=("$name")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "examples.sh: ${#failed[@]} of ${#names[@]} examples failed: ${failed[*]}" >&2
  exit 1
fi
echo "examples.sh: all ${#names[@]} examples passed"

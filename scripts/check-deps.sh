#!/usr/bin/env bash
# The library's dependency promises (scripts/check_deps.py): no CLI dependency in a library
# build, and rust-version equal to the highest minimum its dependencies declare.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo metadata --format-version 1 --locked | python3 scripts/check_deps.py

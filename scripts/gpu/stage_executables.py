"""Copies the executables cargo built into one folder, stripped, under names that say what each
is (scripts/stage-gpu.sh pipes cargo's `--message-format=json` output in):

    test-PACKAGE-TARGET   a test binary: a library's or a bin's unit tests, or an integration test
    bench-TARGET          a bench target (`harness = false`: BENCH --jsonl OUT FILE)
    example-TARGET        an example
    TARGET                a bin (`gpumap`)

Test binaries carry their package because target names repeat across the workspace (the
library's unit tests and the CLI's bin are both `gpumap`; both crates have a `hostile` test):
without it one would overwrite the other and its tests would silently not travel.

    cargo build --message-format=json ... | python3 scripts/gpu/stage_executables.py DEST [SKIP...]

SKIP names staged files to leave out (e.g. a test that needs cargo where it runs).
"""

import json
import os
import shutil
import subprocess
import sys


def package_name(package_id):
    """The package of a cargo package ID (`path+file:///dir/NAME#VERSION` or `...#NAME@VERSION`)."""
    source, _, fragment = package_id.partition("#")
    if "@" in fragment:
        return fragment.split("@")[0]
    return source.rstrip("/").rsplit("/", 1)[-1]


def staged_name(message):
    target = message["target"]
    kind, name = target["kind"][0], target["name"]
    if kind == "bench":
        return f"bench-{name}"
    if message["profile"]["test"]:
        return f"test-{package_name(message['package_id'])}-{name}"
    if kind == "example":
        return f"example-{name}"
    return name


def main():
    dest, skip = sys.argv[1], set(sys.argv[2:])
    os.makedirs(dest, exist_ok=True)
    # The last artifact of a name wins: `cargo build` after `cargo test --no-run` restages the
    # bins and examples that both built.
    staged = {}
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if message.get("reason") != "compiler-artifact" or not message.get("executable"):
            continue
        staged[staged_name(message)] = message["executable"]
    for name in sorted(staged):
        if name in skip:
            continue
        path = os.path.join(dest, name)
        shutil.copy(staged[name], path)
        # Symbols are half an executable's size, and the carried folder has a size limit.
        subprocess.run(["strip", path], check=False)
        print("staged", path)
    if not staged:
        sys.exit("stage_executables.py: cargo reported no executables")


if __name__ == "__main__":
    main()

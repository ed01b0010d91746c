#!/usr/bin/env python3
"""Summarises the samples tools/gpu-sample.py took: where threads were, symbolised with
addr2line against the unstripped binary that ran (same build, before `strip`).

    python3 tools/gpu-sample-report.py BINARY SAMPLES [THREAD_NAME_REGEX] [ROWS]

Prints, per thread state and system call, the innermost frames of gpumap (inlined frames
included), most frequent first. Thread names: `gpumap-io-N` are the I/O pool, the rest the
process's own threads and the CUDA driver's.
"""
import collections
import re
import subprocess
import sys

SYSCALLS = {"0": "read", "1": "write", "7": "poll", "16": "ioctl", "17": "pread", "18": "pwrite",
            "24": "sched_yield", "202": "futex", "230": "nanosleep", "219": "restart"}


def symbols(binary, addresses):
    """address -> innermost-first function names (inlined frames included)."""
    out = subprocess.run(["addr2line", "-e", binary, "-a", "-f", "-C", "-i"]
                         + [hex(int(a, 16) - 1) for a in addresses],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    names, current, i = {}, None, 0
    while i < len(out):
        if out[i].startswith("0x"):
            current = addresses[len(names)]
            names[current] = []
            i += 1
            continue
        name = re.sub(r"::h[0-9a-f]{16}$", "", out[i])
        name = re.sub(r"<impl [^>]*>::", "", name).replace("gpumap::", "")
        names[current].append(name.split("<")[0][-60:])
        i += 2
    return names


def main():
    binary, path = sys.argv[1], sys.argv[2]
    pattern = re.compile(sys.argv[3] if len(sys.argv) > 3 else ".")
    rows = int(sys.argv[4]) if len(sys.argv) > 4 else 25
    samples = [line.split(" ") for line in open(path).read().splitlines() if line != "--"]
    samples = [s for s in samples if len(s) >= 5 and pattern.search(s[1])]

    def stack(s):
        # The frame-pointer chain where there is one, else the return addresses on the stack.
        for column in (5, 6):
            if len(s) > column and s[column]:
                return s[column].split(",")
        return []

    addresses = sorted({a for s in samples for a in stack(s)[:3] if a})
    names = symbols(binary, addresses) if addresses else {}
    counts = collections.Counter()
    for s in samples:
        where = " > ".join("/".join(names.get(a, [a])[:3]) for a in stack(s)[:2])
        call = SYSCALLS.get(s[3], "-" if s[3] in ("-1", "18446744073709551615") else s[3])
        counts[f"{s[2]} {s[4].split('.so')[0]:<9} {call:<7} {where}"] += 1
    print(f"{len(samples)} thread samples")
    for key, n in counts.most_common(rows):
        print(f"{100 * n / len(samples):5.1f}%  {key}")


if __name__ == "__main__":
    main()

"""Joins the JSON lines of one bench run into a side-by-side table (the end of
``on-device.sh bench``).

    python3 scripts/gpu/ratio.py RESULTS.jsonl

One row per (workload, threads): each implementation's best figure — operations per second
where the line counts operations, else GB/s — then gpumap's best over the best peer's. Lines
whose ``impl`` starts with ``gpumap`` are ours, all others peers (docs/benchmarks.md, "The
JSON-lines format"). Only lines of one run compare: the machine drifts between runs.
"""

import json
import sys
from collections import defaultdict


def best_figures(path):
    """(workload, threads) -> impl -> its best figure in the file."""
    rows = defaultdict(dict)
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            record = json.loads(line)
            key = (record["workload"], record.get("threads", 0))
            figure = record.get("iops") or record["gbps"]
            previous = rows[key].get(record["impl"])
            rows[key][record["impl"]] = max(previous, figure) if previous else figure
    return rows


def main():
    rows = best_figures(sys.argv[1])
    impls = sorted({impl for figures in rows.values() for impl in figures})
    print("\n%-22s %4s " % ("workload", "thr") + " ".join("%16s" % i[:16] for i in impls)
          + "   ours/peer")
    for workload, threads in sorted(rows):
        figures = rows[(workload, threads)]
        ours = max([x for i, x in figures.items() if i.startswith("gpumap")], default=None)
        peer = max([x for i, x in figures.items() if not i.startswith("gpumap")], default=None)
        ratio = "%.2fx" % (ours / peer) if ours and peer else "-"
        unit = "IOPS" if workload.startswith("rand") else "GB/s"
        cells = " ".join("%16s" % ("%.2f" % figures[i] if i in figures else "-") for i in impls)
        print("%-22s %4s " % (workload, threads) + cells + "   %s (%s)" % (ratio, unit))


if __name__ == "__main__":
    main()

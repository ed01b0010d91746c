"""Cold sequential reads into GPU memory, interleaved and repeated: gpumap (default buffered
handle, and the `uncached` O_DIRECT policy), KvikIO (POSIX and Mmap) and the disk itself
(`dd iflag=direct`), on one file, in one run.

The disk of a virtual machine drifts by tens of percent within minutes, so one cold read per
implementation (as in the standard bench) says more about when it ran than about the
implementation. Here every round runs every implementation once per thread count, the order
rotating from round to round, and the summary compares medians.

Run on the GPU machine, after scripts/stage-gpu.sh:
    bash .gpu/on-device.sh run python3 tools/cold_compare.py FILE [--rounds 3] [--threads 1,4,16]

gpumap runs as `gpumap read --cold --repeat 2` and the second read counts (the first allocates
its pinned buffers; KvikIO's are allocated once in this process before its first measured read).
"""
import argparse, json, os, statistics, subprocess, sys, time

import cupy
import kvikio
import kvikio.defaults

GPUMAP = os.environ.get("GPUMAP_BIN", ".gpu/bin/gpumap")


def drop_caches():
    subprocess.run(["sync"], check=False)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def timed(fn):
    cupy.cuda.runtime.deviceSynchronize()
    t = time.perf_counter()
    fn()
    cupy.cuda.runtime.deviceSynchronize()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1,4,16")
    ap.add_argument("--jsonl", default=os.path.join(os.environ.get("OUT", "/tmp"), "cold.jsonl"))
    a = ap.parse_args()
    path, size = a.file, os.path.getsize(a.file)
    buf = cupy.empty(size, dtype=cupy.uint8)
    kvikio.defaults.set({"compat_mode": kvikio.CompatMode.ON})
    with kvikio.CuFile(path, "r") as f:  # KvikIO's bounce buffers, allocated before timing
        f.read(buf[: 16 << 20], 16 << 20, 0)

    def kvikio_posix(threads):
        kvikio.defaults.set({"num_threads": threads})
        drop_caches()
        def run():
            with kvikio.CuFile(path, "r") as f:
                assert f.pread(buf).get() == size
        return size / timed(run) / 1e9

    def kvikio_mmap(threads):
        kvikio.defaults.set({"num_threads": threads})
        drop_caches()
        def run():
            m = kvikio.Mmap(path, "r")
            assert m.pread(buf).get() == size
            m.close()
        return size / timed(run) / 1e9

    def gpumap(policy):
        def measure(threads):
            drop_caches()
            out = subprocess.run(
                [GPUMAP, "read", path, "--threads", str(threads), "--direct", policy,
                 "--cold", "--repeat", "2", "--json"],
                check=True, capture_output=True, text=True).stdout
            return json.loads(out)["runs_gbps"][1]
        return measure

    def dd(_threads):
        drop_caches()
        t = time.perf_counter()
        subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M", "iflag=direct",
                        "status=none"], check=True)
        return size / (time.perf_counter() - t) / 1e9

    impls = [("gpumap-filehandle", gpumap("off")), ("gpumap-uncached", gpumap("uncached")),
             ("kvikio-posix", kvikio_posix), ("kvikio-mmap", kvikio_mmap), ("dd-odirect", dd)]
    threads = [int(t) for t in a.threads.split(",")]
    results = {}
    with open(a.jsonl, "a") as out:
        for r in range(a.rounds):
            order = impls[r % len(impls):] + impls[:r % len(impls)]
            for n in threads:
                for name, fn in order:
                    gbps = fn(1 if name == "dd-odirect" else n)
                    results.setdefault((name, n), []).append(gbps)
                    rec = {"impl": name, "workload": "seq_read_cold", "threads": n, "round": r,
                           "bytes": size, "seconds": round(size / gbps / 1e9, 6),
                           "gbps": round(gbps, 3)}
                    print(json.dumps(rec), flush=True)
                    out.write(json.dumps(rec) + "\n")

    print("\nmedian GB/s over %d rounds (spread min-max)" % a.rounds)
    print("%4s " % "thr" + "".join("%26s" % name for name, _ in impls)
          + "   ours/best KvikIO   ours/dd")
    for n in threads:
        med = {name: statistics.median(results[(name, n)]) for name, _ in impls}
        cells = "".join("%26s" % ("%.2f (%.2f-%.2f)" % (med[name], min(results[(name, n)]),
                                                         max(results[(name, n)])))
                        for name, _ in impls)
        ours = max(med["gpumap-filehandle"], med["gpumap-uncached"])
        peer = max(med["kvikio-posix"], med["kvikio-mmap"])
        print("%4d %s   %15.2fx %8.2fx" % (n, cells, ours / peer, ours / med["dd-odirect"]))


if __name__ == "__main__":
    sys.exit(main())

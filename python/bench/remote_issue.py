"""What issuing one ``pread`` future of a 4 KiB row costs the calling Python thread, taken apart,
gpumapio's ``RemoteFile`` beside KvikIO's, each in a process of its own, three rounds alternated,
on one local HTTP range server (``remote.py --serve``). The server is stopped (SIGSTOP) while
futures are issued, so that nothing else competes for the CPU. Per row, in microseconds:

- ``slice``: CuPy's (or NumPy's) ``dst[i]`` alone; ``slice_cai``: with its
  ``__cuda_array_interface__``; ``cai``: the interface of a row sliced before;
- ``closed`` (gpumapio): ``pread`` on a closed file, refused before the buffer is looked at: the
  call and the exception; ``parse_refused``: ``pread`` of one byte more than the row, refused
  after the buffer is parsed (the interface, the driver's pointer query, the exporter's stream);
- ``issue_presliced`` / ``issue_sliced``: issuing the futures of rows sliced before, or sliced in
  the loop as user code does;
- ``rows_per_s``: the rate with the server running, every future issued, then waited for.

    python3 python/bench/remote_issue.py [--rows 20000] [--rounds 3]
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROW = 4096


def child(impl, url, pids, n, path):
    try:
        import cupy as cp
    except ImportError:
        cp = None  # host memory only
    if impl == "kvikio":
        import kvikio, kvikio.defaults
        kvikio.defaults.set({"num_threads": 32})
        f = kvikio.RemoteFile.open_http(url)
        closed = None
    else:
        import gpumapio
        f = gpumapio.RemoteFile.open_http(url, max_in_flight=32)
        closed = gpumapio.RemoteFile.open_http(url, max_in_flight=32)
        closed.close()
    rng = np.random.default_rng(7)
    offsets = (rng.integers(0, (256 << 20) // ROW - 1, n) * ROW).tolist()
    out = {"impl": impl}
    for name, xp in ((("device", cp),) if cp is not None else ()) + (("host", np),):
        dst = xp.zeros((n, ROW), np.uint8)
        [f.pread(dst[i], ROW, o).get() for i, o in enumerate(offsets[:2000])]
        if xp is cp:
            cp.cuda.runtime.deviceSynchronize()
        rows = [dst[i] for i in range(n)]
        def timed(fn):
            start = time.perf_counter()
            result = fn()
            return (time.perf_counter() - start) * 1e6 / n, result
        out[f"{name}_slice_us"], _ = timed(lambda: [dst[i] for i in range(n)])
        if xp is cp:
            out[f"{name}_slice_cai_us"], _ = timed(lambda: [dst[i].__cuda_array_interface__ for i in range(n)])
            out[f"{name}_cai_us"], _ = timed(lambda: [r.__cuda_array_interface__ for r in rows])
        if closed is not None:
            def refused(fn):
                def run():
                    for r, o in zip(rows, offsets):
                        try:
                            fn(r, o)
                        except (ValueError, TypeError):
                            pass
                return run
            out[f"{name}_closed_us"], _ = timed(refused(lambda r, o: closed.pread(r, ROW, o)))
            out[f"{name}_parse_refused_us"], _ = timed(refused(lambda r, o: f.pread(r, ROW + 1, o)))
        for p in pids:
            os.kill(p, signal.SIGSTOP)
        try:
            out[f"{name}_issue_presliced_us"], futs = timed(lambda: [f.pread(r, ROW, o) for r, o in zip(rows, offsets)])
        finally:
            for p in pids:
                os.kill(p, signal.SIGCONT)
        got = sum(fu.get() for fu in futs)
        assert got == n * ROW, got
        for p in pids:
            os.kill(p, signal.SIGSTOP)
        try:
            out[f"{name}_issue_sliced_us"], futs = timed(lambda: [f.pread(dst[i], ROW, o) for i, o in enumerate(offsets)])
        finally:
            for p in pids:
                os.kill(p, signal.SIGCONT)
        assert sum(fu.get() for fu in futs) == n * ROW
        t = time.perf_counter()
        futs = [f.pread(r, ROW, o) for r, o in zip(rows, offsets)]
        assert sum(fu.get() for fu in futs) == n * ROW
        out[f"{name}_rows_per_s"] = round(n / (time.perf_counter() - t))
        # Sampled rows of the last pass, against the file.
        got_rows = dst.get() if xp is not np else dst
        with open(path, "rb") as fh:
            for i in range(0, n, max(n // 64, 1)):
                fh.seek(offsets[i])
                assert got_rows[i].tobytes() == fh.read(ROW), f"{impl} ({name}): row {i} differs from the file"
    print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in out.items()}), flush=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        pids = [int(x) for x in sys.argv[4].split(",") if x]
        return child(sys.argv[2], sys.argv[3], pids, int(sys.argv[5]), sys.argv[6])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    d = os.environ.get("GPUMAP_BENCH_DIR", "/tmp/gpumap-bench")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "issue-256m.bin")
    if not os.path.exists(path):
        with open(path, "wb") as fh:
            fh.write(np.random.default_rng(1).bytes(256 << 20))
    server = subprocess.Popen([sys.executable, os.path.join(HERE, "remote.py"), "--serve", path, "--jsonl", "-",
                               "--server-procs", "8"], stdout=subprocess.PIPE, start_new_session=True)
    try:
        port = int(server.stdout.readline())
        url = f"http://127.0.0.1:{port}/obj"
        pids = subprocess.run(["pgrep", "-g", str(server.pid)], capture_output=True, text=True).stdout.split()
        for rnd in range(a.rounds):
            for impl in (("gpumap", "kvikio") if rnd % 2 == 0 else ("kvikio", "gpumap")):
                r = subprocess.run([sys.executable, __file__, "--child", impl, url, ",".join(pids), str(a.rows), path],
                                   capture_output=True, text=True, timeout=200)
                line = r.stdout.strip()
                print(json.dumps({"round": rnd + 1, **json.loads(line)}) if line else r.stderr.strip()[-600:], flush=True)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait()


if __name__ == "__main__":
    main()

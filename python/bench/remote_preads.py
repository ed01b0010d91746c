"""Random 512-byte rows of a remote object, one ``pread`` future a row, into host and GPU memory:
gpumapio's ``RemoteFile`` beside KvikIO's, each in a process of its own, interleaved round by
round, on one local HTTP range server (``remote.py --serve``: its own processes, ``sendfile``).

What a row costs, three ways: the rate (rows a second, every future issued at once, then waited
for), the process's CPU time a row (all its threads), and what issuing one future costs the
calling Python thread. With ``--stalled`` the last is also measured with the server stopped
while the futures are issued, so that nothing else competes for the CPU.

    python3 python/bench/remote_preads.py [--rows 100000] [--rounds 3] [--size 1GiB] [--stalled]
                                          [--build LABEL=DIR ...]

``--build LABEL=DIR`` adds another gpumapio (a ``pip install --target DIR`` of another wheel) as
a client of its own, named LABEL, interleaved with the others: two builds compared in one run.

JSON lines on stdout (``$OUT/remote_preads.jsonl`` too, where ``OUT`` is set), then a summary
with each round's ratio to KvikIO. The rows are checked against the file.
"""

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROW = 512


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def open_remote(impl, url, in_flight):
    if impl == "kvikio":
        import kvikio
        import kvikio.defaults

        kvikio.defaults.set({"num_threads": in_flight})
        return kvikio.RemoteFile.open_http(url)
    import gpumapio

    return gpumapio.RemoteFile.open_http(url, max_in_flight=in_flight)


def child(a):
    """One client in this process: its rows into host memory, then into GPU memory."""
    size = os.path.getsize(a.file)
    rng = np.random.default_rng(a.seed)
    offsets = (rng.integers(0, size // ROW, a.rows) * ROW).tolist()
    expected = np.memmap(a.file, np.uint8, "r").reshape(-1, ROW)[np.asarray(offsets) // ROW]
    try:
        import cupy as cp
    except ImportError:
        cp = None
    f = open_remote(a.impl, a.url, a.in_flight)
    for xp in (np,) + ((cp,) if cp is not None else ()):
        memory = "device" if xp is not np else "host"
        dst = xp.zeros((a.rows, ROW), np.uint8)
        warm = [f.pread(dst[i], ROW, o) for i, o in enumerate(offsets[:2000])]
        [w.get() for w in warm]
        if cp is not None:
            cp.cuda.runtime.deviceSynchronize()
        c0, t0 = cpu_seconds(), time.perf_counter()
        futures = [f.pread(dst[i], ROW, o) for i, o in enumerate(offsets)]
        t1 = time.perf_counter()
        got = sum(fu.get() for fu in futures)
        t2, c1 = time.perf_counter(), cpu_seconds()
        if got != a.rows * ROW:
            sys.exit(f"{a.impl}: {got} bytes read, not {a.rows * ROW}")
        rows = dst.get() if xp is not np else dst
        if not np.array_equal(rows, expected):
            sys.exit(f"{a.impl} ({memory}): rows differ from the file")
        record = dict(impl=a.label or a.impl, memory=memory, rows=a.rows, rows_per_s=round(a.rows / (t2 - t0)),
                      cpu_us_per_row=round(1e6 * (c1 - c0) / a.rows, 1),
                      issue_us_per_row=round(1e6 * (t1 - t0) / a.rows, 2), round=a.round)
        if a.stalled:
            record["stalled_issue_us_per_row"] = round(stalled_issue(f, xp, offsets, a.server_pids), 2)
        print(json.dumps(record), flush=True)


def stalled_issue(f, xp, offsets, pids):
    """Microseconds the calling thread takes to issue one future, the server stopped meanwhile."""
    dst = xp.zeros((len(offsets), ROW), np.uint8)
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    try:
        t0 = time.perf_counter()
        futures = [f.pread(dst[i], ROW, o) for i, o in enumerate(offsets)]
        seconds = time.perf_counter() - t0
    finally:
        for p in pids:
            os.kill(p, signal.SIGCONT)
    [fu.get() for fu in futures]
    return 1e6 * seconds / len(offsets)


def parse_size(text):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", type=parse_size, default=1 << 30)
    p.add_argument("--in-flight", type=int, default=32)
    p.add_argument("--server-procs", type=int, default=8)
    p.add_argument("--dir", default=os.environ.get("GPUMAP_BENCH_DIR", "/tmp/gpumap-bench"))
    p.add_argument("--stalled", action="store_true")
    p.add_argument("--seed", type=int, default=25)
    p.add_argument("--build", action="append", default=[], metavar="LABEL=DIR",
                   help="also run the gpumapio installed in DIR, as the client LABEL")
    # The child's own arguments.
    p.add_argument("--impl", help=argparse.SUPPRESS)
    p.add_argument("--label", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--file", help=argparse.SUPPRESS)
    p.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--server-pids", type=lambda s: [int(x) for x in s.split(",") if x], default=[],
                   help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.impl:
        return child(a)

    os.makedirs(a.dir, exist_ok=True)
    path = os.path.join(a.dir, f"remote-{a.size}.bin")
    if not os.path.exists(path) or os.path.getsize(path) != a.size:
        rng = np.random.default_rng(a.seed)
        with open(path + ".tmp", "wb") as f:
            for o in range(0, a.size, 64 << 20):
                f.write(rng.bytes(min(64 << 20, a.size - o)))
        os.replace(path + ".tmp", path)
    server = subprocess.Popen([sys.executable, os.path.join(HERE, "remote.py"), "--serve", path, "--jsonl", "-",
                               "--server-procs", str(a.server_procs)], stdout=subprocess.PIPE,
                              start_new_session=True)
    out_path = os.path.join(os.environ["OUT"], "remote_preads.jsonl") if os.environ.get("OUT") else None
    records = []
    try:
        port = int(server.stdout.readline())
        url = f"http://127.0.0.1:{port}/obj"
        pids = subprocess.run(["pgrep", "-g", str(server.pid)], capture_output=True, text=True).stdout.split()
        builds = dict(b.split("=", 1) for b in a.build)
        for rnd in range(1, a.rounds + 1):
            for label in ("gpumap", *builds, "kvikio"):
                impl = "kvikio" if label == "kvikio" else "gpumap"
                env = dict(os.environ)
                if label in builds:
                    env["PYTHONPATH"] = os.pathsep.join(filter(None, [builds[label], env.get("PYTHONPATH")]))
                cmd = [sys.executable, os.path.abspath(__file__), "--impl", impl, "--label", label, "--url", url,
                       "--file", path,
                       "--rows", str(a.rows), "--in-flight", str(a.in_flight), "--round", str(rnd),
                       "--seed", str(a.seed + rnd), "--server-pids", ",".join(pids)]
                if a.stalled:
                    cmd.append("--stalled")
                run = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if run.returncode != 0:
                    print(f"== {label} round {rnd} failed: {run.stderr.strip()[-400:]}", flush=True)
                    continue
                for line in run.stdout.splitlines():
                    print(line, flush=True)
                    records.append(json.loads(line))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait()
    if out_path:
        with open(out_path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    kv = {(r["round"], r["memory"]): r["rows_per_s"] for r in records if r["impl"] == "kvikio"}
    print(f"\n{'round':>5} {'impl':<7} {'memory':<7} {'rows/s':>9} {'CPU µs/row':>11} {'issue µs':>9} {'/kvikio':>8}")
    for r in records:
        k = kv.get((r["round"], r["memory"]))
        ratio = f"{r['rows_per_s'] / k:.2f}" if k else "-"
        print(f"{r['round']:>5} {r['impl']:<7} {r['memory']:<7} {r['rows_per_s']:>9} {r['cpu_us_per_row']:>11} "
              f"{r['issue_us_per_row']:>9} {ratio:>8}")


if __name__ == "__main__":
    main()

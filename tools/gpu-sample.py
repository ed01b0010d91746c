#!/usr/bin/env python3
"""A sampling profiler for the GPU machine, which has no perf: runs a command and, from DELAY
seconds on, every INTERVAL seconds for DURATION seconds, stops each of its threads (ptrace) and
records its state, its system call, where its instruction pointer is, its frame-pointer chain
through the executable, and the return addresses into the executable on its stack. Addresses
are offsets into the executable; tools/gpu-sample-report.py symbolises them here.

    python3 tools/gpu-sample.py NAME DELAY DURATION INTERVAL -- CMD...

Writes $OUT/NAME.samples (one line a thread a sample, "--" between samples) and $OUT/NAME.log
(the command's output). Build the binary with frame pointers and line tables, carry a stripped
copy and keep the unstripped one for the report (docs/gpu.md):

    RUSTFLAGS="-C force-frame-pointers=yes" CARGO_PROFILE_RELEASE_DEBUG=line-tables-only \
      CARGO_TARGET_DIR=target/profile cargo build --release -p gpumap-cli
"""
import ctypes, os, struct, subprocess, sys, time

out = os.environ.get("OUT", "/tmp/out")
name, delay, duration, interval = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
cmd = sys.argv[sys.argv.index("--") + 1:]
log = open(f"{out}/{name}.log", "w")
p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long
samples = open(f"{out}/{name}.samples", "w")


def sample(maps, exe, base, text, mem):
    def where(x):
        for a, b, perm, n in maps:
            if a <= x < b:
                return n.split("/")[-1] or "anon"
        return "?"
    def in_text(x):
        return any(a <= x < b for a, b in text)
    def word(addr):
        try:
            mem.seek(addr)
            return struct.unpack("<Q", mem.read(8))[0]
        except Exception:
            return None
    for tid in os.listdir(f"/proc/{p.pid}/task"):
        tid = int(tid)
        try:
            comm = open(f"/proc/{p.pid}/task/{tid}/comm").read().strip()
            state = open(f"/proc/{p.pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()[0]
        except Exception:
            continue
        if libc.ptrace(16, tid, None, None) != 0:
            continue
        st = ctypes.c_int()
        libc.waitpid(tid, ctypes.byref(st), 0x40000000)
        buf = (ctypes.c_ulonglong * 27)()
        ok = libc.ptrace(12, tid, None, ctypes.byref(buf)) == 0
        chain = []
        scan = []
        rip_where = "?"
        sysno = -1
        if ok:
            rip, rsp, rbp, sysno = buf[16], buf[19], buf[4], buf[15]
            rip_where = where(rip)
            if in_text(rip):
                chain.append(rip - base)
            # Frame-pointer walk from the rbp register (callee-saved, so in libc or the driver
            # it is still the innermost frame of ours, unless they saved and reused it).
            for _ in range(64):
                if not rbp:
                    break
                ret = word(rbp + 8)
                if ret is None or not in_text(ret):
                    break
                chain.append(ret - base)
                nxt = word(rbp)
                if nxt is None or nxt <= rbp:
                    break
                rbp = nxt
            # Every return address into the binary in the stack's first 64 KiB (some stale):
            # for inclusive counts where the walk breaks (std has no frame pointers).
            try:
                mem.seek(rsp)
                data = mem.read(64 * 1024)
            except Exception:
                data = b""
            for i in range(0, len(data) - 7, 8):
                w = struct.unpack_from("<Q", data, i)[0]
                if in_text(w):
                    scan.append(w - base)
                    if len(scan) >= 48:
                        break
        libc.ptrace(17, tid, None, None)
        samples.write(f"{tid} {comm} {state} {sysno} {rip_where} " + ",".join(hex(c) for c in chain) + " " + ",".join(hex(c) for c in scan) + "\n")
    samples.write("--\n")


t0 = time.time()
while p.poll() is None and time.time() - t0 < delay:
    time.sleep(0.05)
n = 0
if p.poll() is None:
    maps = []
    for l in open(f"/proc/{p.pid}/maps").read().splitlines():
        f = l.split()
        a, b = (int(x, 16) for x in f[0].split("-"))
        maps.append((a, b, f[1], f[5] if len(f) >= 6 else ""))
    exe = os.path.realpath(f"/proc/{p.pid}/exe")
    base = min(a for a, b, perm, n_ in maps if n_ == exe)
    text = [(a, b) for a, b, perm, n_ in maps if n_ == exe and "x" in perm]
    mem = open(f"/proc/{p.pid}/mem", "rb")
    t1 = time.time()
    while p.poll() is None and time.time() - t1 < duration:
        try:
            sample(maps, exe, base, text, mem)
            n += 1
        except Exception as e:
            print("sample failed", e)
        time.sleep(interval)
p.wait()
print(f"{name}: exit {p.returncode} after {time.time() - t0:.1f} s, {n} samples")

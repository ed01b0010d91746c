#!/usr/bin/env bash
# Issue 23's tuning for network file systems, measured on one: sshfs (FUSE over SSH) mounted
# over loopback, and again through a loopback proxy that holds every chunk DELAY_MS each way
# (a round trip of twice that) for each DELAY_MS given. `gpumap read --host` of one file at each thread count and task size, and
# with no flags (the automatic choice, which `gpumap info FILE` explains); every run opens the
# file afresh (FUSE drops a file's cached pages on open, so each run goes to the server), best
# of REPEATS.
#
# Needs root, sshd and sshfs (Debian: openssh-server sshfs).
# Usage: GPUMAP_BIN=target/release/gpumap bash python/bench/network_fs.sh [MIB=512] [REPEATS=3] [DELAY_MS...=0 1]
# Results: $OUT/network-fs.jsonl, one `gpumap read --json` object a run plus "delay_ms",
# "flags" and "repeat".
set -euo pipefail
mib=${1:-512}
repeats=${2:-3}
shift $(( $# < 2 ? $# : 2 ))
delays=("$@")
[ ${#delays[@]} -gt 0 ] || delays=(0 1)
bin=${GPUMAP_BIN:-gpumap}
out=${OUT:-/tmp/out}
mkdir -p "$out"
work=$(mktemp -d)
port=2222
mnt=$work/mnt
mkdir -p "$work/export" "$mnt" /run/sshd
unmount() {
  fusermount3 -u "$mnt" 2>/dev/null || fusermount -u "$mnt" 2>/dev/null || umount "$mnt" 2>/dev/null || true
}
proxy_pid=
stop_proxy() {
  [ -n "$proxy_pid" ] && kill "$proxy_pid" 2>/dev/null || true
  proxy_pid=
}
cleanup() {
  unmount
  stop_proxy
  [ -f "$work/sshd.pid" ] && kill "$(cat "$work/sshd.pid")" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
ssh-keygen -q -t ed25519 -N "" -f "$work/host_key"
ssh-keygen -q -t ed25519 -N "" -f "$work/client_key"
cp "$work/client_key.pub" "$work/authorized_keys"
/usr/sbin/sshd -p "$port" -o ListenAddress=127.0.0.1 -o HostKey="$work/host_key" \
  -o AuthorizedKeysFile="$work/authorized_keys" -o PidFile="$work/sshd.pid" \
  -o StrictModes=no -o PermitRootLogin=prohibit-password
head -c "$((mib << 20))" /dev/urandom > "$work/export/data.bin"
mount_at() {  # mount_at PORT
  sshfs -p "$1" -o StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,IdentityFile="$work/client_key",ro \
    "$(id -un)@127.0.0.1:$work/export" "$mnt"
}
# A TCP proxy from port+1 to sshd that forwards each chunk DELAY seconds after it came, in order.
start_proxy() {  # start_proxy DELAY_MS
  python3 - "$1" "$((port + 1))" "$port" <<'PY' &
import asyncio, sys, time
delay, listen, target = float(sys.argv[1]) / 1000, int(sys.argv[2]), int(sys.argv[3])
async def pipe(reader, writer):
    queue = asyncio.Queue()
    async def send():
        while (item := await queue.get()) is not None:
            due, data = item
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()
    sender = asyncio.create_task(send())
    while data := await reader.read(1 << 16):
        queue.put_nowait((time.monotonic() + delay, data))
    queue.put_nowait(None)
    await sender
async def serve(client_reader, client_writer):
    server_reader, server_writer = await asyncio.open_connection("127.0.0.1", target)
    await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", listen)
    await server.serve_forever()
asyncio.run(main())
PY
  proxy_pid=$!
  sleep 1
}
file=$mnt/data.bin
: > "$out/network-fs.jsonl"
run() {  # run DELAY REPEAT FLAGS...
  local delay=$1 rep=$2; shift 2
  "$bin" read --host --json -q "$@" "$file" |
    python3 -c 'import json, sys; r = json.load(sys.stdin); r.update(delay_ms=float(sys.argv[1]), repeat=int(sys.argv[2]), flags=" ".join(sys.argv[3:]) or "auto"); print(json.dumps(r))' "$delay" "$rep" "$@" \
    >> "$out/network-fs.jsonl"
}
for delay in "${delays[@]}"; do
  if [ "$delay" != 0 ]; then start_proxy "$delay"; mount_at "$((port + 1))"; else mount_at "$port"; fi
  "$bin" info "$file" | grep -E "^facts|nthreads|task_size"
  for rep in $(seq "$repeats"); do
    run "$delay" "$rep"
    for threads in 1 2 4 16 64; do
      for task in 1MiB 4MiB 16MiB; do
        run "$delay" "$rep" --threads "$threads" --task-size "$task"
      done
    done
  done
  unmount
  stop_proxy
done
python3 - "$out/network-fs.jsonl" <<'PY'
import collections, json, sys
best = collections.defaultdict(float)
for line in open(sys.argv[1]):
    r = json.loads(line)
    key = (r["delay_ms"], r["flags"], r["threads"], r["task_size"])
    best[key] = max(best[key], r["gbps"])
print(f"{'delay':>6} {'flags':34} {'threads':>7} {'task':>9} {'best GB/s':>9}")
for (delay, flags, threads, task), gbps in sorted(best.items(), key=lambda kv: (kv[0][0], -kv[1])):
    print(f"{delay:6.1f} {flags:34} {threads:7d} {task >> 20:6d}MiB {gbps:9.3f}")
PY

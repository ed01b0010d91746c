#!/usr/bin/env bash
# The several-GPU table of docs/benchmarks.md, in one run (python/bench/multi_gpu.py, one process
# per GPU over torch.distributed with NCCL), each case on one GPU and then on every GPU at once:
#   0. the machine: GPUs and their links, cores, memory, block devices (one I/O pool per disk
#      only matters where there is more than one);
#   1. the bound: the page cache delivering the concatenated checkpoint to host memory from as
#      many threads as there are cores (`gpumap read --host`), and to one GPU;
#   2. tensor-parallel loads: every rank its slice of a Llama-like bf16 checkpoint, warm (and
#      its tensors split along rows, and along columns, each alone);
#   3. concurrent readers: every rank the whole concatenated checkpoint into its own GPU;
#   4. one DeviceCache per GPU: every rank gathers its own random 512 B rows of one table file
#      through a cache of its own on its own GPU, beside the CuPy kernel over a host-registered
#      mmap (the host's bound for rows read in place).
# Usage (on a GPU machine, from the repository root; on the lent machine through
#   `bash .gpu/on-device.sh run bash python/bench/multi_gpu.sh`):
#   python/bench/multi_gpu.sh [GPUS=all] [GB=8]; CASES=tp,whole,rows (the default) picks cases
# Results: $OUT/multi-gpu.jsonl (the ranks' cases) and $OUT/multi-gpu-cli.jsonl (the bounds);
# the files in $GPUMAP_BENCH_DIR (kept for reruns).
set -uo pipefail
gpus=${1:-$(nvidia-smi -L | wc -l)}
gb=${2:-8}
out=${OUT:-/tmp/out}
dir=${GPUMAP_BENCH_DIR:-/tmp/gpumap-bench}
gpumap=${GPUMAP_BIN:-gpumap}
mkdir -p "$out" "$dir"
jsonl="$out/multi-gpu.jsonl"
# NVLink SHARP (multicast) stays off: the lent machines do not support it.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1

echo "== 0. the machine"
nvidia-smi -L
nvidia-smi topo -m
echo "cores: $(nproc)"; free -g | head -2
lsblk -d -e 7 -o NAME,SIZE,ROTA,TYPE,MODEL
df -h "$dir"

ckpt="$dir/llama-${gb}g-$((2 * gpus))"
if [ ! -s "$ckpt/model.safetensors.index.json" ]; then
  echo "== making $ckpt"
  python3 python/bench/checkpoint.py make "$ckpt" --gb "$gb" --shards $((2 * gpus))
fi
whole="$ckpt.concatenated"
[ -s "$whole" ] || cat "$ckpt"/model-*.safetensors > "$whole"
table="$dir/rows-${gb}g.bin"
if [[ ${CASES:-rows} == *rows* ]] && [ ! -s "$table" ]; then
  echo "== making $table (1 GiB of random bytes, repeated)"
  head -c $((1 << 30)) /dev/urandom > "$table.part"
  for _ in $(seq "$gb"); do cat "$table.part"; done > "$table"
  rm -f "$table.part"
fi
sync
# Warm: every file in the page cache before any case runs.
cat "$ckpt"/*.safetensors "$whole" > /dev/null
[ -s "$table" ] && cat "$table" > /dev/null

echo "== 1. the bounds: the page cache to host memory from $(nproc) threads, and to one GPU"
for args in "--host --threads $(nproc)" "--host" "--device 0"; do
  # shellcheck disable=SC2086
  "$gpumap" read $args --repeat 3 --json "$whole" | tee -a "$out/multi-gpu-cli.jsonl"
  echo
done
echo "== a device index other than 0: the last GPU, every byte checked against a host read"
"$gpumap" read --device $((gpus - 1)) --verify --json "$whole" | tee -a "$out/multi-gpu-cli.jsonl"
echo

ranks() {
  local n=$1
  shift
  echo "== $* on $n GPU(s)"
  timeout 300 python3 -m torch.distributed.run --standalone --nproc-per-node "$n" \
    python/bench/multi_gpu.py "$@" --jsonl "$jsonl" || echo "multi_gpu.py $* on $n GPU(s) failed: $?"
}
cases=",${CASES:-tp,whole,rows},"
for n in 1 "$gpus"; do
  [[ $cases == *,tp,* ]] && ranks "$n" tp "$ckpt" --repeat 5 --parts all,exchange,contiguous,strided
done
for n in 1 "$gpus"; do [[ $cases == *,whole,* ]] && ranks "$n" whole "$whole" --repeat 3; done
for n in 1 "$gpus"; do [[ $cases == *,rows,* ]] && ranks "$n" rows "$table" --batches 50; done
true

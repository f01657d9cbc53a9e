#!/usr/bin/env bash
# The checks that need a GPU node (an NVIDIA GPU, many cores, a newer torch and transformers than
# Debian's), run against a folder made by scripts/bundle.sh. Each step has its own time limit and
# its own log in OUT; OUT/summary.txt lists every step's exit status and time.
#
#   scripts/gpu-node-checks.sh BUNDLE OUT        (as root, from the repository root)
#
# Steps:
#   env         the machine: cores, kernel, FUSE limits, GPU, torch and transformers versions
#   gpu         the GPU loader's mount tests and the hf view's transformers tests, on the GPU
#   bench-fs    bench/bench_fs.py (save, write, read, load: the mount against a plain directory)
#   bench-ranks bench/bench_ranks.py (RANKS processes, default 8, saving their shards at once)
#   bench-cut   bench_fs's write-1M+seal (random bytes: content-defined cuts) with -o cut_threads=0
#               and then CUT_THREADS (default 7) helping the seal find its cuts
#   bench-gpu   bench/bench_gpu_load.py (ckptfs_gpu.load against torch.load, to host and GPU)
#   torch       the torch, format and view mount tests with this machine's torch
# STEPS (default "gpu bench-fs bench-ranks bench-gpu torch"; bench-cut only when named) picks steps;
# GIB (default 2) sizes the benchmarks, REPEAT (default 3) goes to bench_fs, bench-cut and
# bench_ranks, BENCH_FS_ONLY (default: every figure) to bench_fs, RANKS (default 8) to bench_ranks.
set -uo pipefail
bundle=$(readlink -f "${1:?usage: scripts/gpu-node-checks.sh BUNDLE OUT}")
out=$(readlink -f "${2:?usage: scripts/gpu-node-checks.sh BUNDLE OUT}")
cd "$(dirname "$0")/.."
mkdir -p "$out"
export CKPTFS_BIN=$bundle/bin/ckptfs CKPTFS_GPU_LIB=$bundle/gpu/libckptfs_gpu.so
export LD_LIBRARY_PATH=$bundle/gpu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
gib=${GIB:-2}
repeat=${REPEAT:-3}
pytest=("$py" -m pytest -p no:cacheprovider -rs -v)

steps=" ${STEPS:-gpu bench-fs bench-ranks bench-gpu torch} "

step() {  # step NAME SECONDS COMMAND...: runs it under a time limit, its output in OUT/NAME.log
  local name=$1 limit=$2 start rc
  shift 2
  [[ $steps == *" $name "* ]] || return 0
  start=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  echo "$name: rc $rc, $(($(date +%s) - start)) s (limit $limit s)" | tee -a "$out/summary.txt"
  tail -n 4 "$out/$name.log" | sed 's/^/    /' >>"$out/summary.txt"
}

{
  echo "cores $(nproc), kernel $(uname -r), $(grep MemTotal /proc/meminfo)"
  echo "fuse max_pages_limit: $(cat /proc/sys/fs/fuse/max_pages_limit 2>/dev/null || echo absent)"
  echo "/dev/fuse: $(ls -l /dev/fuse 2>&1)"
  df -h /var/tmp | tail -n 1
  nvidia-smi -L 2>&1 | head -n 2
  "$py" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.cuda.is_available())' 2>&1
  "$py" -c 'import transformers; print("transformers", transformers.__version__)' 2>&1 | tail -n 1
  "$CKPTFS_BIN" --version 2>&1 | head -n 1
} >"$out/summary.txt"

# The shared fixtures (a checkpoint written by torch 2.11) travel inside the bundle when present.
if [[ -d $bundle/shared && ! -e ../shared ]]; then ln -s "$bundle/shared" ../shared; fi

step gpu "${GPU_LIMIT:-150}" "${pytest[@]}" tests/integration/test_gpu_loader.py \
  tests/integration/test_views_hf_transformers.py \
  "tests/integration/test_views_hf.py::test_hf_view_loads_with_ckptfs_gpu"
step bench-fs "${BENCH_FS_LIMIT:-240}" "$py" bench/bench_fs.py --gib "$gib" --repeat "$repeat" \
  --bin "$CKPTFS_BIN" --json "$out/bench-fs.json" ${BENCH_FS_ONLY:+--only "$BENCH_FS_ONLY"}
step bench-ranks "${BENCH_RANKS_LIMIT:-180}" "$py" bench/bench_ranks.py --ranks "${RANKS:-8}" \
  --gib "$gib" --repeat "$repeat" --bin "$CKPTFS_BIN" --json "$out/bench-ranks.json"
# bench-cut: bench_fs's seal of random bytes without help, then with CUT_THREADS helping.
step bench-cut "${BENCH_CUT_LIMIT:-240}" bash -c 'for t in 0 "$1"; do
    echo "== -o cut_threads=$t"
    "$2" bench/bench_fs.py --gib "$3" --repeat "$4" --bin "$CKPTFS_BIN" --only write-1M+seal \
      -o "cut_threads=$t" --json "$5/bench-cut-$t.json" || exit
  done' bench-cut "${CUT_THREADS:-7}" "$py" "$gib" "$repeat" "$out"
step bench-gpu "${BENCH_GPU_LIMIT:-120}" "$py" bench/bench_gpu_load.py --gib "$gib" \
  --bin "$CKPTFS_BIN" --lib "$CKPTFS_GPU_LIB" --json "$out/bench-gpu.json"
step torch "${TORCH_LIMIT:-150}" "${pytest[@]}" tests/integration/test_torch.py \
  tests/integration/test_views_dcp.py tests/integration/test_views_hf.py \
  tests/integration/test_views_hf_logits.py tests/integration/test_views_torch_dist.py
cat "$out/summary.txt"

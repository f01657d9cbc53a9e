#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite: every unit test (the S3 ones
# against a real radosgw, the pickle ones against CPython and torch) under AddressSanitizer and
# UndefinedBehaviorSanitizer; the concurrent store and cache tests under ThreadSanitizer (a clang
# build, which also checks the lock annotations); every parser fuzzed for a bounded time; then
# the real-mount integration suite with Debian's PyTorch against the optimized ckptfs binary.
# Each build compiles only what its tests run (2 cores: the whole tree twice would not fit).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)
configure() {
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTFS_BUILD_TESTS=ON \
    -DCKPTFS_WERROR=ON -DCKPTFS_SANITIZE="$2" "${@:3}" >/dev/null
}
echo "== build the unit tests (clang; sanitizers: address,undefined)"
# -O1 with line tables: the level ASan documents, and a quarter of -O2 -g's compile time here
# (the sanitized -O2 build of the tests was over half of the run on 2 cores). clang, not gcc:
# gcc's address,undefined build of the tests took 14 minutes of a 43-minute run here, clang's
# under 6. gcc's warnings still guard the optimized build below (-Werror there too).
configure build-asan address,undefined "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++
ninja -C build-asan tests/all
echo "== unit tests under ASan/UBSan"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
   ctest --output-on-failure -j "$jobs" -E '^integration$')
echo "== build the concurrent store and cache tests (clang, ThreadSanitizer, -Wthread-safety)"
# clang checks the lock annotations (common/mutex.h) as it compiles; ThreadSanitizer then watches
# every access the tests make, the store's pools, seals, uploads and the settle thread included.
tsan_tests=(store_test store_staged_test store_files_test store_locks_test store_fallback_test
  store_namespace_test put_flights_test cut_ahead_test file_writer_test tiers_test
  remote_tier_test chunk_cache_test chunk_cache_remote_test io_engine_test packs_test
  append_pack_test store_packs_test)
configure build-tsan thread "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++
ninja -C build-tsan "${tsan_tests[@]}"
echo "== those tests under ThreadSanitizer"
(cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
   ctest --output-on-failure -j "$jobs" -R "^($(IFS='|'; echo "${tsan_tests[*]}"))\$")
echo "== build ckptfs and libckptfs_gpu.so (optimized)"
# Line tables only (-g1): a crash's stack still names files and lines, and gcc compiles in about
# two thirds of -g's time.
configure build "" "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"
ninja -C build ckptfs ckptfs_gpu ckptfs_lmdb_fault_shim chunk_bench
# The GPU builds and the fuzzers run beside the mount tests, which wait on disks and daemons more
# than they compute (the suite must pass on a busy machine anyway); their output is printed once
# they end, and a failure fails the run.
side_log=$(mktemp)
(
  set -euo pipefail
  if command -v hipcc >/dev/null; then
    echo "== build libckptfs_gpu.so with HIP (compiles the device path; running it needs a GPU)"
    cmake -S . -B build-hip -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTFS_BUILD_TESTS=OFF \
      -DCKPTFS_WITH_HIP=ON -DCKPTFS_WERROR=ON >/dev/null
    ninja -C build-hip ckptfs_gpu
  fi
  if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
    echo "== build libckptfs_gpu.so for NVIDIA against the CUDA runtime found here"
    cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTFS_BUILD_TESTS=OFF \
      -DCKPTFS_WITH_HIP=ON -DCKPTFS_HIP_PLATFORM=nvidia -DCKPTFS_WERROR=ON >/dev/null
    ninja -C build-cuda ckptfs_gpu
  fi
  echo "== fuzz every parser for a bounded time (libFuzzer, clang, ASan)"
  FUZZ_SECONDS=${FUZZ_SECONDS:-10} bash scripts/fuzz.sh
) >"$side_log" 2>&1 &
side=$!
# A failing stage ends the run: the builds and fuzzers beside it go too (each is bounded anyway).
trap 'pkill -P "$side" 2>/dev/null; kill "$side" 2>/dev/null; rm -f "$side_log"' EXIT
echo "== real-mount integration tests"
(cd build && ctest --output-on-failure -R '^integration$')
echo "== the POSIX, set-id, durability and torch tests again without passthrough (the daemon's write path)"
CKPTFS_BIN="$PWD/build/tools/ckptfs" CKPTFS_TEST_MOUNT_OPTIONS=passthrough=0 \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/integration/test_posix.py \
  tests/integration/test_privs.py tests/integration/test_durability.py tests/integration/test_torch.py
echo "== (beside the mount tests) the GPU builds and the fuzzers"
side_rc=0
wait "$side" || side_rc=$?
trap - EXIT
cat "$side_log"
rm -f "$side_log"
[[ $side_rc == 0 ]] || { echo "the GPU builds or the fuzzers failed (exit $side_rc)"; exit "$side_rc"; }
for gpu_build in build-hip build-cuda; do
  [[ -f $gpu_build/gpu/libckptfs_gpu.so ]] || continue
  echo "== the GPU loader's mount tests with $gpu_build's libckptfs_gpu.so"
  CKPTFS_BIN="$PWD/build/tools/ckptfs" CKPTFS_GPU_LIB="$PWD/$gpu_build/gpu/libckptfs_gpu.so" \
    /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/integration/test_gpu_loader.py
done

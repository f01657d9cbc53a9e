#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite: the unit tests under
# AddressSanitizer and UndefinedBehaviorSanitizer, then every test (unit and real-mount
# integration with Debian's PyTorch) on the optimized build; the parsers are fuzzed in between.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)
echo "== build (sanitizers: address,undefined)"
bash scripts/build.sh build-asan -DCKPTFS_BUILD_TESTS=ON -DCKPTFS_SANITIZE=address,undefined
echo "== unit tests under ASan/UBSan"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
   ctest --output-on-failure -j "$jobs" -E '^integration')
echo "== build"
bash scripts/build.sh build -DCKPTFS_BUILD_TESTS=ON -DCKPTFS_SANITIZE=
echo "== fuzz every parser for a bounded time (libFuzzer, clang, ASan)"
FUZZ_SECONDS=${FUZZ_SECONDS:-10} bash scripts/fuzz.sh
echo "== all tests"
(cd build && ctest --output-on-failure)

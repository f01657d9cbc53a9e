#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang and ASan in build-fuzz, runs each for a bounded
# time and prints one line per target. Fails if any target finds a crash, a leak, a timeout or an
# invariant violation; the input that did it is saved as build-fuzz/fuzz/artifacts/<target>-*.
#
#   FUZZ_SECONDS   seconds per target (default 30)
#   FUZZ_TARGETS   space-separated subset of targets to run (default: all)
# Each target keeps a working corpus in build-fuzz/fuzz/corpus/<target>, seeded from the
# directories fuzz/CMakeLists.txt names, so later runs start where earlier ones stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-30}
build=build-fuzz

cmake -S . -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCKPTFS_FUZZ=ON -DCKPTFS_BUILD_TESTS=OFF -DCKPTFS_WERROR=ON -DCKPTFS_SANITIZE= >/dev/null
ninja -C "$build" ckptfs_fuzz_all >/dev/null

failed=0
while read -r name dict seeds; do
  [[ -n "$name" ]] || continue
  if [[ -n "${FUZZ_TARGETS:-}" && " $FUZZ_TARGETS " != *" $name "* ]]; then continue; fi
  dir="$build/fuzz"
  mkdir -p "$dir/corpus/$name" "$dir/artifacts" "$dir/logs"
  log="$dir/logs/$name.log"
  args=(-max_total_time="$seconds" -timeout=10 -print_final_stats=1
        -artifact_prefix="$dir/artifacts/$name-")
  [[ "$dict" != "-" ]] && args+=(-dict="$dict")
  # shellcheck disable=SC2086  # seeds is a list of directories
  if "$dir/$name" "${args[@]}" "$dir/corpus/$name" $seeds >"$log" 2>&1; then
    result=ok
  else
    result=FAILED
    failed=1
  fi
  # A target that crashes at once prints no stats: these must not end the script (pipefail).
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1 || true)
  cov=$({ grep -o 'cov: [0-9]*' "$log" || true; } | tail -1 | cut -d' ' -f2)
  corpus=$(find "$dir/corpus/$name" -type f | wc -l)
  printf '%-18s %-6s runs=%s cov=%s corpus=%s log=%s\n' \
    "$name" "$result" "${runs:-?}" "${cov:-?}" "$corpus" "$log"
  if [[ $result == FAILED ]]; then
    grep -E 'ERROR|invariant failed|Test unit written' "$log" | head -5 | sed 's/^/    /'
  fi
done <"$build/fuzz/targets.txt"
exit "$failed"

#!/usr/bin/env bash
# The long variant of the crash loop (tests/integration/test_crash_loop.py): kill -9 of the daemon
# at random moments of a save/overwrite/fsync/rename/unlink workload with uploads running, then a
# remount and the durability checks, KILLS times. Usage: scripts/crash_loop.sh [KILLS] [SEED]
# (default 300 kills; build the binary first with scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
export CKPTFS_CRASH_KILLS=${1:-300}
export CKPTFS_CRASH_SEED=${2:-$(date +%s)}
echo "crash loop: $CKPTFS_CRASH_KILLS kills, seed $CKPTFS_CRASH_SEED"
exec /usr/bin/python3 -m pytest -q -s -p no:cacheprovider tests/integration/test_crash_loop.py

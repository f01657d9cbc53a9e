#!/usr/bin/env bash
# The main job: install what is missing, build, mount ckptfs with its embedded defaults and show a
# checkpoint saved and loaded through it. The mount stays up; `ckptfs umount MNT` takes it down.
# Usage: scripts/demo.sh [MOUNTPOINT=/mnt/ckptfs]
set -euo pipefail
cd "$(dirname "$0")/.."
mnt=${1:-/mnt/ckptfs}
bash scripts/install-deps.sh
bash scripts/build.sh build -DCKPTFS_BUILD_TESTS=OFF
bin=$PWD/build/tools/ckptfs
mkdir -p "$mnt"
if grep -q " $mnt fuse.ckptfs " /proc/self/mountinfo; then "$bin" umount "$mnt"; fi
"$bin" mount "$mnt"
/usr/bin/python3 - "$mnt" <<'PY'
import os, sys, time, torch
mnt = sys.argv[1]
os.makedirs(f"{mnt}/run1/iter_0000100", exist_ok=True)
torch.manual_seed(0)
sd = {"model": {f"layers.{i}.weight": torch.randn(1024, 1024) for i in range(16)},
      "step": 100}
path = f"{mnt}/run1/iter_0000100/model.pt"
t = time.time(); torch.save(sd, path); ts = time.time() - t
t = time.time(); back = torch.load(path); tl = time.time() - t
same = all(torch.equal(sd["model"][k], back["model"][k]) for k in sd["model"])
mb = os.path.getsize(path) / 2**20
print(f"torch.save {mb:.0f} MiB in {ts:.2f} s, torch.load in {tl:.2f} s, identical: {same}")
# A second step that changes one layer: unchanged tensors are stored once.
sd["model"]["layers.0.weight"] += 1
sd["step"] = 200
os.makedirs(f"{mnt}/run1/iter_0000200", exist_ok=True)
torch.save(sd, f"{mnt}/run1/iter_0000200/model.pt")
assert same
PY
echo "--- ckptfs stats $mnt/run1 (two checkpoints, one changed layer between them)"
"$bin" stats "$mnt/run1"
echo "--- ckptfs inspect $mnt/run1/iter_0000200/model.pt (first tensors)"
"$bin" inspect "$mnt/run1/iter_0000200/model.pt" | head -12
echo "--- mounted at $mnt (cache: /var/cache/ckptfs); unmount with: $bin umount $mnt"

#!/usr/bin/python3
"""Where the time of the distributed-optimizer tp2-pp2 view goes (bench_reshard.py's case): the
first opens (plan and the CRC pass over the source bytes), reading the view files whole, and
torch.load of them from the page cache; and a plain cold read of the source files, for scale.

  /usr/bin/python3 bench/profile_distopt_view.py
"""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # Megatron's files hold args
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "reshard"))
import megatron_fixture as mf  # noqa: E402

work = Path("/var/tmp/ckptfs-profile-distopt")
shutil.rmtree(work, ignore_errors=True)
(work / "mnt").mkdir(parents=True)
BIN = os.environ.get("CKPTFS_BIN", str(ROOT / "build" / "tools" / "ckptfs"))
NAMES = (mf.FILE, mf.DISTRIB_FILE)


def drop_caches():
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def read_whole(path):
    with open(path, "rb", buffering=0) as f:
        while f.read(16 << 20):
            pass


def timed(fn, paths):
    t0 = time.perf_counter()
    for p in paths:
        fn(p)
    return time.perf_counter() - t0


def first_byte(path):
    with open(path, "rb") as f:
        f.read(1)


def main():
    subprocess.run([BIN, "mount", work / "mnt", "--cache-dir", work / "cache"], check=True,
                   stdout=subprocess.DEVNULL)
    try:
        # bench_reshard.py's model, saved with the distributed optimizer at TP 4 x PP 2.
        cfg = mf.ModelConfig(era="mcore", num_layers=2, hidden_size=2048, num_attention_heads=16,
                             num_query_groups=4, ffn_hidden_size=5632, swiglu=True,
                             vocab_size=32000, make_vocab_size_divisible_by=128, bias=False,
                             normalization="RMSNorm", position_embedding_type="rope",
                             distributed_optimizer=True,
                             extra_args=dict(overlap_grad_reduce=True))
        root = work / "mnt" / "ck"
        mf.save_checkpoint(root, cfg, 4, 2)
        view = root / ".views" / "tp2-pp2" / "iter_0000100"
        files = [view / mf.rank_name(t, p, 2) / n for p in range(2) for t in range(2)
                 for n in NAMES]
        drop_caches()
        t_open = timed(first_byte, files)
        t_read = timed(read_whole, files)
        t_load = timed(torch.load, files)
        size = sum(os.path.getsize(f) for f in files)
        print(f"view files {size / 2**30:.2f} GiB: first opens (plan + CRC pass) {t_open:.2f} s, "
              f"read whole after {t_read:.2f} s, torch.load (page cache warm) {t_load:.2f} s")
        sources = [root / "iter_0000100" / mf.rank_name(t, p, 2) / n for p in range(2)
                   for t in range(4) for n in NAMES]
        drop_caches()
        print(f"source files read cold: {timed(read_whole, sources):.2f} s")
    finally:
        subprocess.run([BIN, "umount", work / "mnt"], stdout=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

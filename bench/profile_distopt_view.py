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
B = os.environ.get("CKPTFS_BIN", str(ROOT / "build" / "tools" / "ckptfs"))
subprocess.run([B, "mount", work/"mnt", "--cache-dir", work/"cache"], check=True, stdout=subprocess.DEVNULL)
try:
    cfg = mf.ModelConfig(era="mcore", num_layers=2, hidden_size=2048, num_attention_heads=16, num_query_groups=4, ffn_hidden_size=5632, swiglu=True, vocab_size=32000, make_vocab_size_divisible_by=128, bias=False, normalization="RMSNorm", position_embedding_type="rope", distributed_optimizer=True, extra_args=dict(overlap_grad_reduce=True))
    root = work/"mnt"/"ck"; mf.save_checkpoint(root, cfg, 4, 2); os.sync()
    view = root/".views"/"tp2-pp2"/"iter_0000100"
    files = [view/mf.rank_name(t,p,2)/n for p in range(2) for t in range(2) for n in (mf.FILE, mf.DISTRIB_FILE)]
    def drop():
        os.sync(); open("/proc/sys/vm/drop_caches","w").write("3\n")
    def readall(f):
        with open(f, "rb", buffering=0) as h:
            while h.read(16<<20): pass
    drop(); t0=time.perf_counter()
    for f in files:
        with open(f,"rb") as h: h.read(1)
    t_open=time.perf_counter()-t0
    t0=time.perf_counter()
    for f in files: readall(f)
    t_read=time.perf_counter()-t0
    t0=time.perf_counter()
    for f in files: torch.load(f)
    t_load=time.perf_counter()-t0
    size=sum(os.path.getsize(f) for f in files)
    print(f"view files {size/2**30:.2f} GiB: first opens (plan + CRC pass) {t_open:.2f} s, read whole after {t_read:.2f} s, torch.load (page cache warm) {t_load:.2f} s")
    # the source files read plainly (cold), for scale
    src=[root/"iter_0000100"/mf.rank_name(t,p,2)/n for p in range(2) for t in range(4) for n in (mf.FILE, mf.DISTRIB_FILE)]
    drop(); t0=time.perf_counter()
    for f in src: readall(f)
    print(f"source files read cold: {time.perf_counter()-t0:.2f} s")
finally:
    subprocess.run([B, "umount", work/"mnt"], stdout=subprocess.DEVNULL)
    shutil.rmtree(work, ignore_errors=True)

"""`ckptfs convert` as a route of bench_reshard.py: the view written to a new directory from a
plain copy of the source checkpoint, without a mount, from a cold page cache, with its peak
RSS."""
import filecmp
import os
import shutil
import subprocess
import time
from pathlib import Path


def plain_copy(root, dst):
    """A plain directory holding root's files (the mount hides .views from listings)."""
    shutil.copytree(root, dst)
    os.sync()
    return dst


def convert(binary, src, dst, spec, drop_caches):
    """Runs `ckptfs convert src dst --view spec` from a cold page cache: (seconds, peak RSS in
    KiB). The peak is the process's VmHWM, read every 20 ms until it exits (the kernel's rusage
    of a child counts the memory of the process it was forked from)."""
    drop_caches()
    t0 = time.perf_counter()
    p = subprocess.Popen([str(binary), "convert", str(src), str(dst), "--view", spec],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while p.poll() is None:
        try:
            for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
        except (FileNotFoundError, ProcessLookupError):
            pass
        time.sleep(0.02)
    seconds = time.perf_counter() - t0
    err = p.stderr.read().decode()
    p.stderr.close()
    assert p.returncode == 0, f"ckptfs convert {spec}: {err}"
    return seconds, peak


def same_files(a, b):
    """Asserts that directories a and b hold the same files, bit for bit; their count."""
    a, b = Path(a), Path(b)
    names = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    assert names == sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file()), (a, b)
    for n in names:
        assert filecmp.cmp(a / n, b / n, shallow=False), f"{n}: converted file differs"
    return len(names)

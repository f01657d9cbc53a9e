# The daemon-wide bound on written bytes held in memory (-o write_memory): many files written at
# once, each out of order (its second half first, as a pool of writer threads may), would hold
# every file's reorder window and write queue in memory without it (32 files x 24 MiB here, over
# 1 GiB measured). With it, the daemon's peak RSS stays near the bound, and every file is exact.
import os
import threading

from conftest import read_file

MiB = 1 << 20
FILES, SIZE_MIB = 32, 48
WRITE_MEMORY = 128 * MiB
RAM_CACHE = 16 * MiB
# What the daemon holds besides the bounded buffers: code, LMDB pages, a chunk per write thread.
BASELINE = 128 * MiB


def peak_rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def block(i, k):
    """1 MiB, different for every file and offset."""
    return (bytes([i, k]) + bytes((i * 7 + k + j) & 0xFF for j in range(254))) * 4096


def test_many_out_of_order_writers_stay_within_write_memory(make_mount):
    m = make_mount(options=f"write_memory={WRITE_MEMORY >> 20}M,ram_cache={RAM_CACHE >> 20}M")

    def writer(i):
        fd = os.open(m / f"rank{i}.bin", os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            half = SIZE_MIB // 2
            for k in list(range(half, SIZE_MIB)) + list(range(half)):
                os.pwrite(fd, block(i, k), k * MiB)
        finally:
            os.close(fd)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(FILES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    peak = peak_rss(m.daemon_pid())
    assert peak <= WRITE_MEMORY + RAM_CACHE + BASELINE, f"peak RSS {peak >> 20} MiB"
    for i in (0, FILES // 2, FILES - 1):
        data = read_file(m / f"rank{i}.bin")
        assert len(data) == SIZE_MIB * MiB
        for k in range(SIZE_MIB):
            assert data[k * MiB:(k + 1) * MiB] == block(i, k), (i, k)

# A chain of two remote tiers on real backends: a file:// directory (the parallel filesystem)
# nearest, radosgw farthest. Three mounts with 10% injected faults on both tiers save the ranks of
# a run's steps; every file reaches both tiers; `ckptfs retain` keeps the last two steps and a gc
# round on each tier then leaves each tier's chunk bytes within 5% of the unique bytes that
# remain, and no local tier holds more; cold mounts read every remaining file back, also once the
# near tier lost its chunks.
# fsck on two tiers finds each injected damage and repairs it from the other copies. gc rounds
# loop on both tiers while two mounts save and delete: no committed file loses a chunk.
# Runs in /usr/bin/python3.
import json
import os
import shutil
import threading

import pytest

from conftest import CKPTFS_BIN, read_file, run, wait_for, write_file
from test_fsck import fsck
from test_gc import field, save_and_delete
from test_remote import REMOTE_CHUNKS, new_remote, wait_state  # noqa: F401

MiB = 1 << 20
TIERS = "user.ckptfs.tiers"


def chain_args(near, far, faults=None):
    return near.mount_args + far.mount_args + (["--backend-faults", faults] if faults else [])


def mount_chain(make_mount, near, far, name, faults=None, options=REMOTE_CHUNKS):
    return make_mount(options=options, name=name, args=chain_args(near, far, faults), env=far.env)


def gc(remote, *args):
    env = {**os.environ, **(remote.env or {})}
    p = run([CKPTFS_BIN, "gc", *remote.mount_args, *args], check=False, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def chunk_bytes(remote):
    return sum(n for k, n in remote.objects("chunks/").items())


@pytest.mark.timeout(900)
def test_three_mounts_on_two_tiers_retention_gc_and_cold_reads(make_mount, new_remote):
    near, far = new_remote("file", "pfs"), new_remote("s3")
    options = REMOTE_CHUNKS + ",gc_window=1"
    mounts = [mount_chain(make_mount, near, far, f"node{i}", options=options,
                          faults=f"fail=0.1,ops=put+get+head,seed={i + 3}") for i in range(3)]
    os.mkdir(mounts[0] / "run")
    expect = {}
    for step in range(1, 5):
        d = f"run/global_step{step}"
        os.mkdir(mounts[0] / d)
        assert wait_for(lambda: all(os.path.isdir(m / d) for m in mounts), bool, 60), d
        for rank, m in enumerate(mounts):
            data = os.urandom(MiB + 4096 * (step * 3 + rank))  # no chunk shared: bytes add up
            write_file(m / d / f"rank{rank}.bin", data)
            expect[f"{d}/rank{rank}.bin"] = data
    write_file(mounts[0] / "run" / "latest", b"global_step4")
    for rank, m in enumerate(mounts):
        wait_state([m / n for n in expect if n.endswith(f"rank{rank}.bin")], timeout=300)
    # Every tier holds every file, as user.ckptfs.tiers says.
    tiers = json.loads(os.getxattr(mounts[1] / "run/global_step2/rank1.bin", TIERS))["tiers"]
    assert [t["state"] for t in tiers] == ["remote", "remote"], tiers
    assert tiers[0]["backend"].startswith("file://") and tiers[1]["backend"].startswith("s3://")
    want = {"files/" + n for n in expect} | {"files/run/latest"}
    for tier in (near, far):
        got = wait_for(lambda: set(tier.objects("files/")), lambda k: k == want, 120)
        assert got == want, tier.kind

    # Retention through one mount, once that mount has synced every rank (it deletes what its
    # namespace holds); every tier loses the old steps' records.
    names = sorted(n for n in expect)
    assert wait_for(lambda: sorted(str(p.relative_to(mounts[2].mnt)) for p in
                                   (mounts[2].mnt / "run").glob("*/*")), lambda l: l == names,
                    120) == names
    p = run([CKPTFS_BIN, "retain", mounts[2] / "run", "--keep-last", "2"], check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    expect = {n: d for n, d in expect.items() if "step3" in n or "step4" in n}
    want = {"files/" + n for n in expect} | {"files/run/latest"}
    for tier in (near, far):
        got = wait_for(lambda: set(tier.objects("files/")), lambda k: k == want, 180)
        assert got == want, tier.kind
    for m in mounts:
        assert wait_for(lambda: sorted(os.listdir(m / "run")), lambda l: len(l) == 3, 60) == \
            ["global_step3", "global_step4", "latest"]

    # A gc round on each tier: what is left is what the remaining records name.
    unique = sum(len(d) for d in expect.values()) + len(b"global_step4")
    for tier in (near, far):
        before = chunk_bytes(tier)
        out = gc(tier, "--grace", "2")
        assert "deleted" in out, out
        after = chunk_bytes(tier)
        assert after < before, (tier.kind, before, after)
        assert unique <= after <= 1.05 * unique, (tier.kind, after, unique)
    for m in mounts:
        assert "injected fault" in m.log()
        # The local tiers dropped the chunks of the deleted steps too.
        assert wait_for(m.chunk_bytes_on_disk, lambda n: n <= unique, 60) <= unique, m.mnt

    # A cold mount reads everything from the near tier: radosgw serves no chunk.
    far_gets = len(far.requests("GET", "chunks/"))
    cold = mount_chain(make_mount, near, far, "cold")
    for name, data in expect.items():
        assert read_file(cold / name) == data, name
    assert len(far.requests("GET", "chunks/")) == far_gets

    # The near tier loses its chunks: a cold mount reads through to the far one.
    shutil.rmtree(near.root / "chunks.d")
    colder = mount_chain(make_mount, near, far, "colder")
    for name, data in expect.items():
        assert read_file(colder / name) == data, name
    assert len(far.requests("GET", "chunks/")) >= far_gets + len(expect)


def near_chunk(near, name):
    return near.root / "chunks.d" / f"{name[:2]}.d" / name


@pytest.mark.timeout(600)
def test_fsck_on_two_tiers_finds_each_damage_and_repairs_from_the_other_copies(make_mount,
                                                                              new_remote):
    near, far = new_remote("file", "pfs"), new_remote("s3")
    m = mount_chain(make_mount, near, far, "a", options=REMOTE_CHUNKS + ",ram_cache=0")
    files = {f"f{i}.bin": os.urandom(3 * MiB) for i in range(2)}
    for name, data in files.items():
        write_file(m / name, data)
    wait_state([m / n for n in files], timeout=180)
    code, r = fsck(m.mnt, "--deep")
    assert code == 0 and r["clean"] and r["records"] == 4, r  # two records on each tier

    # A local chunk gone first: with packs (-o packs=1) that takes a remount (conftest.py).
    c = m.losable_chunks()[0]
    m.lose_chunk(c)                                               # a local chunk gone
    a, b, d = [n for n in sorted(m.chunk_locations()) if n != c][:3]
    near_chunk(near, a).unlink()                                  # gone from the near tier
    key = f"{far.prefix}/chunks/{b[:2]}/{b}"                      # a flipped byte in the bucket
    body = bytearray(far.read(f"chunks/{b[:2]}/{b}"))
    body[100] ^= 0xFF
    far.rgw.client().put_object(Bucket=far.bucket, Key=key, Body=bytes(body))
    m.corrupt_chunk(d, 100)                                       # a local chunk corrupt
    record = near.root / "files.d" / "f1.bin"
    record.write_bytes(record.read_bytes()[:-3] + b"xyz")         # a damaged record

    code, r = fsck(m.mnt, "--deep")
    assert code == 1 and not r["clean"], r
    assert r["remote_missing"] == 1 and r["remote_corrupt"] == 1, r
    # A local chunk missing while a tier holds the chunk is an eviction, not damage.
    assert r["local_missing"] == 0 and r["local_corrupt"] == 1, r
    assert r["records_bad"] == 1 and r["damaged_files"] == 0, r
    code, r = fsck(m.mnt, "--deep", "--repair")
    assert code == 0 and r["clean"], r
    # The corrupt local copy was moved aside by the check before: the tiers hold the chunk, so
    # it is as evicted, not damage.
    assert r["remote_repaired"] == 2 and r["local_corrupt"] == 0, r
    assert r["records_republished"] == 1, r
    wait_state([m / n for n in files], timeout=120)
    code, r = fsck(m.mnt, "--deep")
    assert code == 0 and r["clean"], r
    assert near_chunk(near, a).exists()
    assert far.read(f"chunks/{b[:2]}/{b}") == bytes(body[:100]) + bytes([body[100] ^ 0xFF]) + \
        bytes(body[101:])
    cold = mount_chain(make_mount, near, far, "cold")
    for name, data in files.items():
        assert read_file(cold / name) == data, name


@pytest.mark.timeout(900)
def test_gc_rounds_on_both_tiers_while_two_mounts_save_and_delete_lose_nothing(make_mount,
                                                                                new_remote):
    near, far = new_remote("file", "pfs"), new_remote("s3")
    options = REMOTE_CHUNKS + ",gc_window=1"
    mounts = {tag: mount_chain(make_mount, near, far, tag, options=options,
                               faults=f"fail=0.1,ops=put+get+head,seed={seed}")
              for tag, seed in (("a", 3), ("b", 5))}
    stop = threading.Event()
    rounds = []

    def collect(tier):
        while not stop.is_set():
            env = {**os.environ, **(tier.env or {})}
            rounds.append(run([CKPTFS_BIN, "gc", *tier.mount_args, "--grace", "2"], check=False,
                              env=env, timeout=300))

    collectors = [threading.Thread(target=collect, args=(t,)) for t in (near, far)]
    for c in collectors:
        c.start()
    expect = {}
    try:
        save_and_delete(mounts, 2, 16, expect, wait_s=300)
        want = {"files/" + n for n in expect}
        for tier in (near, far):
            got = wait_for(lambda: set(tier.objects("files/")), lambda k: k == want, 180)
            assert got == want, tier.kind
    finally:
        stop.set()
        for c in collectors:
            c.join()
    assert all(p.returncode == 0 for p in rounds), [p.stdout + p.stderr for p in rounds]
    for tier in (near, far):
        # Some round on the tier deleted garbage while the mounts saved.
        assert any(p.args[3] == tier.url and "deleted" in p.stdout for p in rounds), tier.kind
        gc(tier, "--grace", "2")
        dry = gc(tier, "--dry-run")
        assert field(dry, "unreferenced") == 0, dry  # each tier holds what its records name
        assert field(dry, "records") == len(expect), dry
    cold = mount_chain(make_mount, near, far, "cold")
    for name, data in expect.items():
        assert read_file(cold / name) == data, name
    shutil.rmtree(near.root / "chunks.d")  # and through the far tier alone
    colder = mount_chain(make_mount, near, far, "colder")
    for name, data in expect.items():
        assert read_file(colder / name) == data, name

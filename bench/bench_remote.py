#!/usr/bin/python3
"""ckptfs remote-tier benchmark against a real S3 server (Ceph radosgw on 127.0.0.1, started by
scripts/rgw.sh), every figure a ratio measured in this run:

  cold-load  mount/download   torch.load of a checkpoint whose chunks are only in the bucket,
                              through a fresh mount with an empty cache, against the usual route:
                              download it with boto3 (parallel ranged GETs), then torch.load the
                              local copy. Lower is better; the goal is <= 0.6.
  save remote/local           torch.save + fsync with -o durability=remote against
                              durability=local (same mount, fresh bytes each run).
  restore-N  mount/boto3      N processes at once, each loading its own rank file of one
                              checkpoint (a DeepSpeed global_step directory) cold through a
                              fresh mount, against N processes each downloading the same object
                              with boto3 (then loading it). Aggregate throughput ratio: higher is
                              better; the goal is >= 1.0 against the downloads alone. Also with
                              the processes only reading their files' bytes (no torch.load), on
                              another fresh mount: the transport against the same downloads.
  upload ckptfs/boto3         the mount's background upload of a saved checkpoint (from close
                              to user.ckptfs.state == remote) against boto3's upload_file of the
                              same bytes. Higher is better (throughput ratio).
  cold-load mount/max(download, load)
                              the cold load against the longer of its two parts done apart:
                              1.0 when the fetch runs at the download's speed and the load
                              overlaps it. Goal <= 1.1 with --link.
  next-step mount/download    a node that loaded step N of a fine-tune with a frozen base (half
                              the bytes the same in both steps) loads step N+1 through its mount,
                              against boto3's download of step N+1: only the changed chunks
                              cross. Goal <= 0.6 with --link.

--link RATE (e.g. 1600mbit) puts the S3 port behind a link of that rate each way (bench/link.py:
tc htb on lo, only that port): on this 2-core machine radosgw shares the CPU with the client, so
without it the figures measure the server's CPU; with it, the network, as on a cluster.

Usage: /usr/bin/python3 bench/bench_remote.py [--gib 2] [--dir /var/tmp/ckptfs-remote]
                                             [--cold-options OPT,OPT] [--options OPT,OPT]
                                             [--ranks 4] [--link 1600mbit]
radosgw stores on bluestore in a sparse file under --dir (RGW_STORE=memstore keeps it in RAM).
"""
import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time

import boto3
import torch

# DeepSpeed's and Megatron's checkpoints hold more than tensors (args, numpy values); the
# frameworks load them with weights_only=False, torch >= 2.6's default being True.
os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
from boto3.s3.transfer import TransferConfig

import benchjson  # noqa: E402  (bench/, the script's own folder)
from bench_fs import daemon_pid  # noqa: E402
from link import Link  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(*args, **kw):
    return subprocess.run([str(a) for a in args], check=True, **kw)


def state_dict(gib, seed):
    """A GPT-like state dict of about `gib` GiB of fresh bf16 and fp32 tensors."""
    g = torch.Generator().manual_seed(seed)
    sd, total, i = {}, 0, 0
    while total < gib * 2**30:
        sd[f"layers.{i}.weight"] = torch.randn(4096, 4096, generator=g).bfloat16()
        sd[f"layers.{i}.exp_avg"] = torch.randn(2048, 4096, generator=g)
        total += 4096 * 4096 * 2 + 2048 * 4096 * 4
        i += 1
    return sd


def wait_state(path, want, timeout=1800):
    t0 = time.perf_counter()
    while os.getxattr(path, "user.ckptfs.state").decode() != want:
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"{path} never reached state {want}")
        time.sleep(0.05)
    return time.perf_counter() - t0


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def _storm_worker(barrier, results, index, job):
    """One process of the restore storm: waits at the barrier, then runs job(index) and reports
    the times (since the barrier) at which its steps ended."""
    barrier.wait()
    t0 = time.perf_counter()
    results.put((index, [t - t0 for t in job(index)]))


def storm(n, job):
    """Runs job(0..n-1) in n forked processes released at once; returns, per step of job, the
    time at which the last process ended it."""
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(n + 1), ctx.Queue()
    procs = [ctx.Process(target=_storm_worker, args=(barrier, results, i, job)) for i in range(n)]
    for p in procs:
        p.start()
    barrier.wait()
    ends = [results.get(timeout=1800)[1] for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a storm process failed ({p.exitcode})")
    return [max(e[k] for e in ends) for k in range(len(ends[0]))]


def cpu_seconds(pids):
    """CPU seconds (user + system) used so far by each of `pids`, threads included."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[pid] = (int(fields[11]) + int(fields[12])) / tick
        except FileNotFoundError:
            out[pid] = 0.0
    return out


def busy_seconds():
    """CPU seconds all cores have spent busy since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


RGW_ASOK = None  # radosgw's admin socket, set by start_rgw


def server_counters():
    """radosgw's own counts so far: S3 requests, GETs, bytes its GETs sent, and the read ops it
    sent to the osd (its perf counters, through the admin socket)."""
    if RGW_ASOK is None:
        return {}
    r = subprocess.run(["ceph", "--admin-daemon", RGW_ASOK, "perf", "dump"], capture_output=True,
                       text=True)
    if r.returncode != 0:
        return {}
    d = json.loads(r.stdout)
    return {"requests": d["rgw"]["req"], "GETs": d["rgw"]["get"], "get_b": d["rgw"]["get_b"],
            "osd reads": d["objecter"]["op_r"]}


class CpuMeter:
    """Where the CPU went while a step ran: the S3 server (radosgw, ceph-osd), the ckptfs daemons
    named, this process and its children (the reader, boto3's threads), all cores together; and
    what the server was asked for meanwhile (requests, GETs, bytes sent, osd reads)."""

    def __init__(self, daemons=()):
        self.parts = {name: [int(p) for p in subprocess.run(
            ["pgrep", "-x", name], capture_output=True, text=True).stdout.split()]
            for name in ("radosgw", "ceph-osd")}
        self.server = [p for pids in self.parts.values() for p in pids]
        self.daemons = list(daemons)

    def __enter__(self):
        self.c0 = server_counters()
        self.t0, self.busy0 = time.perf_counter(), busy_seconds()
        self.s0, self.d0 = cpu_seconds(self.server), cpu_seconds(self.daemons)
        self.own0 = os.times()
        return self

    def __exit__(self, *exc):
        own = os.times()
        wall = time.perf_counter() - self.t0
        s1, d1 = cpu_seconds(self.server), cpu_seconds(self.daemons)
        server = sum(s1[p] - self.s0[p] for p in self.server)
        parts = ", ".join(f"{name} {sum(s1[p] - self.s0[p] for p in pids):.1f}"
                          for name, pids in self.parts.items())
        daemon = sum(d1[p] - self.d0[p] for p in self.daemons)
        reader = sum(getattr(own, k) - getattr(self.own0, k)
                     for k in ("user", "system", "children_user", "children_system"))
        cores = os.cpu_count()
        busy = busy_seconds() - self.busy0
        self.line = (f"S3 server {server:.1f} core-s ({parts}), ckptfs daemon {daemon:.1f}, reader/client "
                     f"{reader:.1f}, all CPU {busy:.1f} of {cores * wall:.1f} core-s "
                     f"({100 * busy / (cores * wall):.0f}% of {cores} cores)")
        c1 = server_counters()
        if c1 and self.c0:
            d = {k: c1[k] - self.c0[k] for k in c1}
            self.line += (f"; server: {d['requests']} requests, {d['GETs']} GETs sending "
                          f"{d['get_b'] / 2**30:.2f} GiB, {d['osd reads']} osd reads")
        self.server_s = server
        return False


def start_rgw(work):
    """Starts radosgw under work/rgw (bluestore on a sparse file: memstore would hold every byte
    twice in RAM, and a full store makes PUTs hang rather than fail); returns (its directory,
    the AWS_* environment to reach it), and puts that environment into os.environ."""
    rgw = os.path.join(work, "rgw")
    out = sh("bash", os.path.join(ROOT, "scripts/rgw.sh"), "start", rgw, capture_output=True,
             text=True, env={**os.environ, "RGW_STORE": os.environ.get("RGW_STORE", "bluestore")}
             ).stdout
    env = {}
    for line in out.splitlines():
        if line.startswith("export "):
            for kv in line[len("export "):].split():
                k, v = kv.split("=", 1)
                env[k] = v
    os.environ.update(env)
    global RGW_ASOK
    RGW_ASOK = os.path.join(rgw, "run", "client.rgw.a.asok")
    return rgw, env


def mount_bucket(ckptfs, work, name, endpoint, mounts, options=()):
    """Mounts s3://bench/ck as node `name` (work/name/{mnt,cache}), each of `options` an -o;
    appends the mountpoint to `mounts` and returns it."""
    mnt, cache = os.path.join(work, name, "mnt"), os.path.join(work, name, "cache")
    os.makedirs(mnt)
    os.makedirs(cache)
    cmd = [ckptfs, "mount", mnt, "--cache-dir", cache, "--backend", "s3://bench/ck",
           "--s3-endpoint", endpoint]
    for o in options:
        cmd += ["-o", o]
    sh(*cmd, stdout=subprocess.DEVNULL)
    mounts.append(mnt)
    return mnt


def teardown(ckptfs, mounts, rgw):
    """Unmounts every mount, then stops radosgw."""
    for m in mounts:
        subprocess.run([ckptfs, "umount", m], stdout=subprocess.DEVNULL)
    subprocess.run(["bash", os.path.join(ROOT, "scripts/rgw.sh"), "stop", rgw],
                   stdout=subprocess.DEVNULL)


def next_step(a, mount, s3, xfer, work, gib):
    """Steps N and N+1 of a fine-tune with a frozen base saved on node a (a directory each); a
    fresh node loads N, then N+1 (timed) against boto3's download of N+1: (mount s, download s,
    N+1 bytes, the CPU and server line of the timed load: the bytes the server sent)."""
    base = state_dict(gib / 2, 3)
    steps = []
    for n, seed in ((1, 4), (2, 5)):
        sd = {**base, **{f"head.{k}": v for k, v in state_dict(gib / 2, seed).items()}}
        path = os.path.join(a, f"finetune/step{n}/model.pt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save(sd, path)
        steps.append((path, sd))
    for path, _ in steps:
        wait_state(path, "remote")
    plain = os.path.join(work, "step2.pt")
    shutil.copyfile(steps[1][0], plain)
    s3.upload_file(plain, "bench", "plain/step2.pt", Config=xfer)
    size = os.path.getsize(plain)
    g = mount("g")
    mine = [os.path.join(g, "finetune", f"step{n}", "model.pt") for n in (1, 2)]
    t_wait = time.perf_counter()
    while not all(os.path.exists(p) for p in mine):
        if time.perf_counter() - t_wait > 60:
            raise TimeoutError("the fine-tune node never saw both steps")
        time.sleep(0.05)
    torch.load(mine[0])  # step N: this node holds it now
    time.sleep(2)  # any fetch that load started (readahead) has ended
    drop_caches()
    t0 = time.perf_counter()
    with CpuMeter([daemon_pid(os.path.join(work, "g", "cache"))]) as cpu:
        loaded = torch.load(mine[1])
    mount_s = time.perf_counter() - t0
    assert all(torch.equal(loaded[k], steps[1][1][k]) for k in steps[1][1])
    del loaded
    os.unlink(plain)
    drop_caches()
    t0 = time.perf_counter()
    s3.download_file("bench", "plain/step2.pt", plain, Config=xfer)
    download_s = time.perf_counter() - t0
    os.unlink(plain)
    return mount_s, download_s, size, cpu.line


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--dir", default="/var/tmp/ckptfs-remote")
    ap.add_argument("--cold-options", default="",
                    help="-o options of the cold-load mount (e.g. readahead_chunks=64)")
    ap.add_argument("--options", default="",
                    help="-o options of every mount, the saving one included (e.g. tensor_piece=16M)")
    ap.add_argument("--ranks", type=int, default=4,
                    help="processes of the restore storm, one rank file each (0: skip it)")
    ap.add_argument("--link", default="",
                    help="the S3 port behind a link of this rate each way (tc rate: 1600mbit)")
    ap.add_argument("--bin", default=os.environ.get("CKPTFS_BIN",
                                                    os.path.join(ROOT, "build/tools/ckptfs")))
    benchjson.add_argument(ap)
    args = ap.parse_args()
    out = benchjson.Results("remote", args.json)
    work = args.dir
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    rgw, env = start_rgw(work)
    mounts = []
    link = Link(args.link, Link.port_of(env["AWS_ENDPOINT_URL"])) if args.link else None
    try:
        if link:
            link.__enter__()
        s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1")
        s3.create_bucket(Bucket="bench")
        xfer = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20,
                              max_concurrency=10)

        def mount(name, *opts):
            if args.options:
                opts = (args.options,) + opts
            return mount_bucket(args.bin, work, name, env["AWS_ENDPOINT_URL"], mounts, opts)

        a = mount("a")
        sd = state_dict(args.gib, 1)
        ckpt = os.path.join(a, "model.pt")
        t0 = time.perf_counter()
        torch.save(sd, ckpt)
        local_save = time.perf_counter() - t0
        size = os.path.getsize(ckpt)
        upload = wait_state(ckpt, "remote")
        plain = os.path.join(work, "plain.pt")
        shutil.copyfile(ckpt, plain)

        # Baseline upload: boto3 of the same bytes to another key.
        t0 = time.perf_counter()
        s3.upload_file(plain, "bench", "plain/model.pt", Config=xfer)
        boto_up = time.perf_counter() - t0

        # Cold load: a fresh mount, empty cache, the file known only from the bucket.
        b = mount("b", *([args.cold_options] if args.cold_options else []))
        path_b = os.path.join(b, "model.pt")
        t_wait = time.perf_counter()
        while not os.path.exists(path_b):
            if time.perf_counter() - t_wait > 60:
                raise TimeoutError("the second mount never saw the checkpoint")
            time.sleep(0.05)
        drop_caches()
        t0 = time.perf_counter()
        with CpuMeter([daemon_pid(os.path.join(work, "b", "cache"))]) as cpu_mount:
            loaded = torch.load(path_b)
        mount_load = time.perf_counter() - t0
        assert all(torch.equal(loaded[k], sd[k]) for k in sd)
        del loaded
        os.unlink(plain)
        drop_caches()
        t0 = time.perf_counter()
        with CpuMeter() as cpu_download:
            s3.download_file("bench", "plain/model.pt", plain, Config=xfer)
            download_only = time.perf_counter() - t0
            loaded = torch.load(plain)
        download_load = time.perf_counter() - t0
        assert all(torch.equal(loaded[k], sd[k]) for k in sd)
        del loaded

        # Where the cold load's time goes: the fetch alone (ckptfs prefetch --wait on another
        # fresh mount), then torch.load from the local tier with the page cache dropped.
        d = mount("d", *([args.cold_options] if args.cold_options else []))
        path_d = os.path.join(d, "model.pt")
        while not os.path.exists(path_d):
            time.sleep(0.05)
        t0 = time.perf_counter()
        sh(args.bin, "prefetch", path_d, "--wait", stdout=subprocess.DEVNULL,
           stderr=subprocess.DEVNULL)
        fetch_only = time.perf_counter() - t0
        drop_caches()
        t0 = time.perf_counter()
        loaded = torch.load(path_d)
        local_load = time.perf_counter() - t0
        del loaded

        # The restore storm: one checkpoint of `ranks` rank files (together --gib), each loaded by
        # its own process, cold, at once; against as many parallel boto3 downloads (+ loads).
        if args.ranks:
            step = os.path.join(a, "global_step1")
            os.makedirs(step)
            names = [f"mp_rank_{r:02d}_model_states.pt" for r in range(args.ranks)]
            for r, n in enumerate(names):
                torch.save(state_dict(args.gib / args.ranks, 10 + r), os.path.join(step, n))
            # A second step of the same shape for the read-only storm, so that neither storm
            # finds the other's objects in the osd's cache.
            step2 = os.path.join(a, "global_step2")
            os.makedirs(step2)
            for r, n in enumerate(names):
                torch.save(state_dict(args.gib / args.ranks, 20 + r), os.path.join(step2, n))
            for n in names:
                wait_state(os.path.join(step, n), "remote")
                wait_state(os.path.join(step2, n), "remote")
            for r, n in enumerate(names):
                shutil.copyfile(os.path.join(step, n), plain)
                s3.upload_file(plain, "bench", f"plain/{n}", Config=xfer)
            os.unlink(plain)
            rank_bytes = sum(os.path.getsize(os.path.join(step, n)) for n in names)
            e = mount("e", *([args.cold_options] if args.cold_options else []))
            while not all(os.path.exists(os.path.join(e, "global_step1", n)) for n in names):
                time.sleep(0.05)
            drop_caches()

            def load_from_mount(r):
                torch.load(os.path.join(e, "global_step1", names[r]))
                return [time.perf_counter()]

            with CpuMeter([daemon_pid(os.path.join(work, "e", "cache"))]) as cpu_storm_mount:
                (storm_mount,) = storm(args.ranks, load_from_mount)

            # The same storm reading the files' bytes only (global_step2), on another fresh mount:
            # the transport alone, against downloads that do no more (torch.load is work
            # boto3's side skips).
            f = mount("f", *([args.cold_options] if args.cold_options else []))
            while not all(os.path.exists(os.path.join(f, "global_step2", n)) for n in names):
                time.sleep(0.05)
            drop_caches()

            def read_from_mount(r):
                with open(os.path.join(f, "global_step2", names[r]), "rb", buffering=0) as fh:
                    while fh.read(4 << 20):
                        pass
                return [time.perf_counter()]

            with CpuMeter([daemon_pid(os.path.join(work, "f", "cache"))]) as cpu_storm_read:
                (storm_read,) = storm(args.ranks, read_from_mount)
            drop_caches()

            def download_and_load(r):
                client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"],
                                      region_name="us-east-1")
                local = os.path.join(work, f"storm{r}.pt")
                client.download_file("bench", f"plain/{names[r]}", local, Config=xfer)
                t_download = time.perf_counter()
                torch.load(local)
                return [t_download, time.perf_counter()]

            with CpuMeter() as cpu_storm_download:
                storm_download, storm_download_load = storm(args.ranks, download_and_load)

        # Save with durability=remote (fsync waits for the upload) on a third mount.
        c = mount("c", "durability=remote")
        sd2 = state_dict(args.gib, 2)
        t0 = time.perf_counter()
        with open(os.path.join(c, "model.pt"), "wb") as f:
            torch.save(sd2, f)
            f.flush()
            os.fsync(f.fileno())
        remote_save = time.perf_counter() - t0
        assert os.getxattr(os.path.join(c, "model.pt"), "user.ckptfs.state") == b"remote"

        step_mount, step_download, step_size, step_line = next_step(a, mount, s3, xfer, work,
                                                                    args.gib)

        mib = size / 2**20
        print(f"checkpoint {mib:.0f} MiB, radosgw on 127.0.0.1"
              + (f", {link.describe()}" if link else ""))
        print(f"cold-load  mount/download = {mount_load / download_load:.2f}   "
              f"(mount {mount_load:.1f} s, download+load {download_load:.1f} s)   goal <= 0.6")
        print(f"  of which fetch   prefetch/download = {fetch_only / download_only:.2f}   "
              f"(ckptfs prefetch --wait {fetch_only:.1f} s, boto3 download {download_only:.1f} s); "
              f"torch.load from the local tier {local_load:.1f} s")
        apart = max(download_only, download_load - download_only)
        print(f"cold-load  mount/max(download, load) = {mount_load / apart:.2f}   (download "
              f"{download_only:.1f} s, torch.load of the download {download_load - download_only:.1f}"
              f" s)" + ("   goal <= 1.1" if link else ""))
        print(f"  CPU, mount:         {cpu_mount.line}")
        print(f"  CPU, download+load: {cpu_download.line}")
        # The goal's time on all cores, against what the server alone used in the mount's run.
        goal_core_s = 0.6 * download_load * os.cpu_count()
        print(f"  the S3 server alone used {cpu_mount.server_s / goal_core_s:.2f} of the "
              f"{goal_core_s:.1f} core-s the goal's time holds on this machine")
        if args.ranks:
            gb = rank_bytes / 1e9
            print(f"restore-{args.ranks}  mount/boto3      = {storm_download / storm_mount:.2f}   "
                  f"(aggregate: mount {gb / storm_mount:.2f} GB/s, {args.ranks} boto3 downloads "
                  f"{gb / storm_download:.2f} GB/s)   goal >= 1.0")
            print(f"  against download+load = {storm_download_load / storm_mount:.2f}   "
                  f"(mount {storm_mount:.1f} s, boto3 download+load {storm_download_load:.1f} s)")
            print(f"  CPU, mount:         {cpu_storm_mount.line}")
            print(f"  CPU, download+load: {cpu_storm_download.line}")
            print(f"  reads alone   mount/boto3 = {storm_download / storm_read:.2f}   "
                  f"(each process reads its file through a fresh mount: {storm_read:.1f} s, "
                  f"boto3 downloads {storm_download:.1f} s)")
            print(f"  CPU, mount reads:   {cpu_storm_read.line}")
        print(f"next-step  mount/download = {step_mount / step_download:.2f}   (torch.load of "
              f"step N+1 ({step_size / 2**20:.0f} MiB, half shared with step N) on the node "
              f"holding N {step_mount:.1f} s, boto3 download {step_download:.1f} s)"
              + ("   goal <= 0.6" if link else ""))
        print(f"  CPU, mount:         {step_line}")
        print(f"save       remote/local   = {remote_save / local_save:.2f}   "
              f"(durability=local {local_save:.1f} s, remote {remote_save:.1f} s)")
        print(f"upload     ckptfs/boto3   = {(mib / upload) / (mib / boto_up):.2f}   "
              f"(ckptfs {mib / upload:.0f} MiB/s, boto3 {mib / boto_up:.0f} MiB/s)")
        out.add("cold-load", mount_load / download_load, subject="mount", baseline="download+load",
                better="lower", goal=0.6, subject_s=mount_load, baseline_s=download_load)
        out.add("fetch", fetch_only / download_only, subject="prefetch", baseline="download",
                better="lower", subject_s=fetch_only, baseline_s=download_only)
        out.add("cold-load-apart", mount_load / apart, subject="mount",
                baseline="max(download, load)", better="lower", goal=1.1 if link else None,
                subject_s=mount_load, baseline_s=apart)
        out.add("next-step", step_mount / step_download, subject="mount", baseline="download",
                better="lower", goal=0.6 if link else None, subject_s=step_mount,
                baseline_s=step_download)
        if link:
            out.note("link", link.describe())
        if args.ranks:
            out.add(f"restore-{args.ranks}", storm_download / storm_mount, subject="mount",
                    baseline="boto3", goal=1.0, subject_s=storm_mount, baseline_s=storm_download)
            out.add(f"restore-{args.ranks}-read", storm_download / storm_read, subject="mount reads",
                    baseline="boto3", subject_s=storm_read, baseline_s=storm_download)
        out.add("save-remote", remote_save / local_save, subject="durability=remote",
                baseline="durability=local", better="lower", subject_s=remote_save,
                baseline_s=local_save)
        out.add("upload", boto_up / upload, subject="ckptfs", baseline="boto3", subject_s=upload,
                baseline_s=boto_up)
        out.write()
    finally:
        if link:
            link.__exit__(None, None, None)
        teardown(args.bin, mounts, rgw)
    return 0


if __name__ == "__main__":
    sys.exit(main())

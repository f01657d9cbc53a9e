#!/usr/bin/python3
"""Eight nodes on one bucket (radosgw on 127.0.0.1, scripts/rgw.sh): eight mounts, each with its
own cache directory, as eight nodes of a cluster (docs/journal.md). Measured in this run:

  visible      a file closed on one node until the other seven see it (stat), for each node in
               turn: median and max over the 56 pairs, with the sync every sync_interval (1 s)
  storm-same   eight cold mounts, two readers each, torch.load of one checkpoint at once:
               aggregate throughput against eight parallel boto3 downloads of the same bytes
               (the file, put as a plain object), each then torch.load-ed from memory
  storm-own    the same with each mount loading its own rank file (-o warm=file)
  peers        radosgw's port behind a --link (1600mbit each way; bench/link.py), peer traffic
               unshaped: one cold mount loading a checkpoint of --peers-mib alone, then eight
               cold mounts loading it at once without peers and with them (-o peer_listen=,
               peers=): the bytes radosgw sent over the checkpoint's size, and the storm's time
               over the time of the node alone. Goals with peers: bytes <= 1.1, time <= 1.3.
               Beside each storm: where the CPU went (radosgw and ceph-osd, the ckptfs daemons,
               this process's loaders), all cores' busy share, and the load average before it;
               with --perf, a `perf record` of the storm with peers (the daemons, radosgw,
               ceph-osd and this process), its samples by command and by function.

  /usr/bin/python3 bench/bench_nodes.py [--mib 256] [--peers-mib 256] [--link 1600mbit]
                                        [--only peers] [--perf]
"""
import argparse
import contextlib
import io
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

import socket

import boto3
import torch
from boto3.s3.transfer import TransferConfig

import benchjson  # noqa: E402  (bench/, the script's own folder)
from bench_remote import CpuMeter, drop_caches, mount_bucket, start_rgw, teardown, wait_state
from link import Link  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODES = 8


def tensors(mib, seed):
    g = torch.Generator().manual_seed(seed)
    n = mib * 2**20 // 4
    return {f"w{i}": torch.randn(n // 4, generator=g) for i in range(4)}


def at_once(jobs):
    """Runs the callables on threads released together; the wall time until the last ends."""
    barrier = threading.Barrier(len(jobs) + 1)
    errors = []

    def run(job):
        barrier.wait()
        try:
            job()
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(repr(e))
    threads = [threading.Thread(target=run, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(errors[0])
    return time.perf_counter() - t0


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def umount_all(ckptfs, mounts):
    for m in mounts:
        subprocess.run([ckptfs, "umount", m], stdout=subprocess.DEVNULL)
    mounts.clear()


def daemon_pids(mounts):
    """The ckptfs daemons of `mounts` (<node>/mnt): the pid in each <node>/cache/lock."""
    pids = []
    for m in mounts:
        with open(os.path.join(os.path.dirname(m), "cache", "lock")) as f:
            pids.append(int(f.read().split()[0]))
    return pids


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


class PerfRecord:
    """`perf record` of `pids` (every thread, 99 Hz) while the block runs, into `path`; then the
    samples' shares. Only the pids named: other jobs on the machine stay out."""

    def __init__(self, path, pids):
        self.path, self.pids = path, pids

    def __enter__(self):
        self.proc = subprocess.Popen(["perf", "record", "-F", "99", "-g", "-o", self.path,
                                      "-p", ",".join(str(p) for p in self.pids)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)  # perf is recording
        return self

    def __exit__(self, *exc):
        self.proc.send_signal(2)
        self.proc.wait(timeout=120)
        return False

    def shares(self, sort, top):
        """The `top` largest shares of the samples by `sort` ("comm", "comm,dso,sym")."""
        r = subprocess.run(["perf", "report", "-i", self.path, "--stdio", "--no-children",
                            "--sort", sort, "-g", "none"], capture_output=True, text=True)
        return [" ".join(line.split()) for line in r.stdout.splitlines()
                if line.strip() and not line.startswith("#")][:top]


def peer_storms(args, mount, mounts, endpoint, out):
    """The peers phase (see the module's doc)."""
    w = mount("pwriter")
    os.makedirs(os.path.join(w, "peers"))
    path = os.path.join(w, "peers", "model.pt")
    torch.save(tensors(args.peers_mib, 99), path)
    wait_state(path, "remote")
    size = os.path.getsize(path)
    umount_all(args.bin, mounts)
    link = Link(args.link, Link.port_of(endpoint))

    def storm(tag, n, peers):
        addrs = [f"127.0.0.1:{p}" for p in free_ports(n)]
        cold = [mount(f"p/{tag}{i}", (f"peer_listen={addrs[i]},peers=" + ",".join(addrs))
                      if peers else "") for i in range(n)]
        drop_caches()
        load = loadavg()
        before = link.bytes_sent()[0]
        server = [int(p) for name in ("radosgw", "ceph-osd") for p in subprocess.run(
            ["pgrep", "-x", name], capture_output=True, text=True).stdout.split()]
        perf = PerfRecord(os.path.join(args.dir, f"perf-{tag}.data"),
                          daemon_pids(cold) + server + [os.getpid()]) \
            if args.perf and peers else None
        with perf or contextlib.nullcontext(), CpuMeter(daemon_pids(cold)) as cpu:
            t = at_once([lambda i=i: torch.load(os.path.join(cold[i], "peers", "model.pt"))
                         for i in range(n)])
        sent = link.bytes_sent()[0] - before
        umount_all(args.bin, mounts)
        out.note(f"peers-{tag}-cpu", cpu.line)
        out.note(f"peers-{tag}-loadavg", load)
        lines = [f"         CPU during it: {cpu.line}; load average before {load}"]
        if perf:
            lines.append("         perf record of the daemons, radosgw, ceph-osd and the loaders, "
                         "samples by command:")
            lines += [f"           {line}" for line in perf.shares("comm", 12)]
            lines.append("         by command, library and function:")
            lines += [f"           {line}" for line in perf.shares("comm,dso,sym", 30)]
        return t, sent / size, lines

    with link:
        t1, b1, lines = storm("alone", 1, False)
        print(f"peers    one node alone: {t1:.1f} s, radosgw sent {b1:.2f} x the checkpoint "
              f"({size / 2**20:.0f} MiB; {link.describe()})", flush=True)
        print("\n".join(lines), flush=True)
        for tag, peers in (("off", False), ("on", True)):
            t, b, lines = storm(tag, NODES, peers)
            print(f"peers-{tag:3s} 8 nodes at once: radosgw sent {b:.2f} x the checkpoint, storm "
                  f"{t:.1f} s = {t / t1:.2f} x one node alone"
                  + ("   goals <= 1.1, <= 1.3" if peers else ""), flush=True)
            print("\n".join(lines), flush=True)
            out.add(f"peers-{tag}-bytes", b, subject="store bytes", baseline="checkpoint size",
                    better="lower", goal=1.1 if peers else None)
            out.add(f"peers-{tag}-time", t / t1, subject="8-node storm", baseline="one node",
                    better="lower", goal=1.3 if peers else None, subject_s=t, baseline_s=t1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256, help="size of each checkpoint file")
    ap.add_argument("--dir", default="/var/tmp/ckptfs-nodes")
    ap.add_argument("--bin", default=os.environ.get("CKPTFS_BIN",
                                                    os.path.join(ROOT, "build/tools/ckptfs")))
    ap.add_argument("--peers-mib", type=int, default=256,
                    help="size of the checkpoint the peers phase loads")
    ap.add_argument("--link", default="1600mbit",
                    help="the peers phase: radosgw's port behind a link of this rate each way")
    ap.add_argument("--only", choices=("all", "peers"), default="all")
    ap.add_argument("--perf", action="store_true",
                    help="the peers phase: perf record -a the storm with peers (in --dir)")
    benchjson.add_argument(ap)
    args = ap.parse_args()
    out = benchjson.Results("nodes", args.json)
    work = args.dir
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    rgw, env = start_rgw(work)
    mounts = []
    try:
        s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1")
        s3.create_bucket(Bucket="bench")

        def mount(name, options=""):
            return mount_bucket(args.bin, work, name, env["AWS_ENDPOINT_URL"], mounts,
                                [options] if options else [])

        if args.only == "peers":
            peer_storms(args, mount, mounts, env["AWS_ENDPOINT_URL"], out)
            out.write()
            return 0
        # Commit -> visible on the other seven.
        nodes = [mount(f"n{i}") for i in range(NODES)]
        os.makedirs(os.path.join(nodes[0], "ckpt"))
        for n in nodes:
            while not os.path.isdir(os.path.join(n, "ckpt")):
                time.sleep(0.01)
        lat = []
        for i, n in enumerate(nodes):
            name = f"ckpt/rank-{i}.pt"
            with open(os.path.join(n, name), "wb") as f:
                f.write(os.urandom(4096))
            t0 = time.perf_counter()  # close returned: committed on node i
            pending = {j for j in range(NODES) if j != i}
            while pending:
                for j in list(pending):
                    if os.path.exists(os.path.join(nodes[j], name)):
                        lat.append(time.perf_counter() - t0)
                        pending.discard(j)
                time.sleep(0.005)
        med, mx = statistics.median(lat), max(lat)
        print(f"visible  commit -> seen on another node: median {med:.2f} s, max {mx:.2f} s "
              f"({len(lat)} pairs, sync_interval 1 s)", flush=True)
        out.note("visible_median_s", round(med, 3))
        out.note("visible_max_s", round(mx, 3))
        for m in mounts:
            subprocess.run([args.bin, "umount", m], stdout=subprocess.DEVNULL)
        mounts.clear()

        # The checkpoint files, written back by one writer, also put as plain objects.
        w = mount("writer")
        os.makedirs(os.path.join(w, "ckpt2"))
        files = ["model.pt"] + [f"rank-{r}.pt" for r in range(NODES)]
        for k, name in enumerate(files):
            path = os.path.join(w, "ckpt2", name)
            torch.save(tensors(args.mib, 10 + k), path)
            wait_state(path, "remote")
            s3.upload_file(path, "bench", f"plain/{name}")
        size = os.path.getsize(os.path.join(w, "ckpt2", "model.pt"))
        subprocess.run([args.bin, "umount", w], stdout=subprocess.DEVNULL)
        mounts.clear()
        xfer = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20,
                              max_concurrency=10)

        def download_and_load(name):
            client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"],
                                  region_name="us-east-1")
            buf = io.BytesIO()
            client.download_fileobj("bench", f"plain/{name}", buf, Config=xfer)
            buf.seek(0)
            torch.load(buf)

        # Each node's own rank with warm=file: the default (warm=checkpoint) would pull every rank
        # onto every node.
        for case, pick, opts in (("same", lambda i: "model.pt", ""),
                                 ("own", lambda i: f"rank-{i}.pt", "warm=file")):
            for m in mounts:
                subprocess.run([args.bin, "umount", m], stdout=subprocess.DEVNULL)
            mounts.clear()
            shutil.rmtree(os.path.join(work, "s"), ignore_errors=True)
            cold = [mount(f"s/{case}{i}", opts) for i in range(NODES)]
            drop_caches()
            t_mount = at_once([lambda i=i, r=r: torch.load(os.path.join(cold[i], "ckpt2", pick(i)))
                               for i in range(NODES) for r in range(2)])
            drop_caches()
            t_plain = at_once([lambda i=i: download_and_load(pick(i)) for i in range(NODES)])
            gb = NODES * size / 1e9
            print(f"storm-{case:4s} mount/boto3 = {t_plain / t_mount:.2f}   (aggregate: 8 mounts x 2 "
                  f"readers {gb / t_mount:.2f} GB/s in {t_mount:.1f} s, 8 boto3 downloads+loads "
                  f"{gb / t_plain:.2f} GB/s in {t_plain:.1f} s)", flush=True)
            out.add(f"storm-{case}", t_plain / t_mount, subject="mount", baseline="boto3",
                    goal=1.0, subject_s=t_mount, baseline_s=t_plain)
        umount_all(args.bin, mounts)
        peer_storms(args, mount, mounts, env["AWS_ENDPOINT_URL"], out)
        out.write()
    finally:
        teardown(args.bin, mounts, rgw)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

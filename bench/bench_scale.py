#!/usr/bin/python3
"""The inputs of the scale model (docs/journal.md, "At 1,000 nodes and 10M chunks"), measured at
--nodes nodes (default 16) on one bucket of radosgw on 127.0.0.1 (scripts/rgw.sh), each node a
mount with its own cache directory, listening for peers on a 127.0.0.1 port of its own and
finding the others through the bucket (-o peer_listen=, no peers=: nodes/<addr>/<time> records).

  idle     over --idle seconds once every node sees every other: the requests radosgw logged,
           per node per second and per heartbeat (-o peer_heartbeat=, default 10 s), by method
           and by the key's first component under the mount's prefix (nodes/ is discovery;
           journal/, files and the rest are the namespace sync; gc/ the gc round). The same
           with peers off (no peer_listen) over --idle-off seconds, as the baseline.
  memory   each daemon's VmRSS (/proc/PID/status; PID from <cache>/lock) after mount, after the
           idle period and after the storm, with peers off and on.
  storm    every node cold-loads one checkpoint (--mib MiB of random tensors, torch.save) at
           once: the bytes radosgw sent (its access log) over the checkpoint's size, GETs of
           chunks/ in all and per chunk, and the chunks each node served its peers, counted from
           the receivers' logs at debug level ("chunk ID (N bytes) from peer ADDR",
           peers/peer_backend.cc): nothing else counts requests a peer served.
  rendezvous  build/bench/rendezvous_bench: ns per chunk to pick an owner among 16 and 1,000 nodes.

  /usr/bin/python3 bench/bench_scale.py [--nodes 16] [--idle 60] [--idle-off 20]
                                        [--heartbeat 10] [--mib 128]

radosgw's access log (its debug_rgw 1 "beast:" lines) gives each request's method, key, status,
bytes sent and time; the windows above are cut by those times.
"""
import argparse
import datetime
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import urllib.parse

import torch

import benchjson  # noqa: E402  (bench/, the script's own folder)
from bench_nodes import at_once, free_ports, tensors, umount_all
from bench_remote import mount_bucket, start_rgw, teardown, wait_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET, PREFIX = "bench", "ck/"
# beast: 0x7f...: 127.0.0.1 - ckptfs [03/Dec/2026:17:40:01.123 +0000] "GET /bench/ck/x HTTP/1.1"
#   200 4194304 - "ua" - latency=0.001s
BEAST = re.compile(r' beast: \S+ \S+ \S+ \S+ \[([^\]]+)\] "(\S+) (\S+) [^"]*" (\d+) (\d+|-)')


def access_log(rgw):
    """[(unix time, method, what, status, bytes sent)] of every request radosgw logged; `what`
    is the key under PREFIX, or "LIST <prefix>" for a listing of the bucket."""
    out = []
    try:
        text = open(os.path.join(rgw, "log", "client.rgw.a.log"), errors="replace").read()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        m = BEAST.search(line)
        if not m:
            continue
        when = datetime.datetime.strptime(m[1], "%d/%b/%Y:%H:%M:%S.%f %z").timestamp()
        method, target = m[2], m[3]
        path, _, query = target.partition("?")
        path = urllib.parse.unquote(path)
        if path.rstrip("/") == f"/{BUCKET}" and method == "GET":
            q = urllib.parse.parse_qs(query)
            what = "LIST " + q.get("prefix", [""])[0].removeprefix(PREFIX)
            method = "LIST"
        elif path.startswith(f"/{BUCKET}/{PREFIX}"):
            what = path[len(f"/{BUCKET}/{PREFIX}"):]
        else:
            what = path
        out.append((when, method, what, int(m[4]), 0 if m[5] == "-" else int(m[5])))
    return out


def settled_log(rgw):
    """The access log once it has stopped growing (radosgw writes its lines a little late)."""
    last = access_log(rgw)
    for _ in range(20):
        time.sleep(1)
        now = access_log(rgw)
        if len(now) == len(last):
            return now
        last = now
    return last


def kind(method, what):
    """A request's class: method and the first component of its key ("nodes", "journal", ...)."""
    rest = what.removeprefix("LIST ")
    first = rest.split("/", 1)[0] if "/" in rest else (rest.split("-", 1)[0] or "(root)")
    return f"{method} {first}/" if "/" in rest or method == "LIST" else f"{method} {first}"


def window(log, t0, t1):
    return [r for r in log if t0 <= r[0] < t1]


def rss_mib(pid):
    """(VmRSS, RssAnon, RssFile) of `pid` in MiB."""
    got = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k = line.split(":", 1)[0]
            if k in ("VmRSS", "RssAnon", "RssFile"):
                got[k] = int(line.split()[1]) / 1024
    return got.get("VmRSS", 0.0), got.get("RssAnon", 0.0), got.get("RssFile", 0.0)


def daemon_pids(work, names):
    pids = []
    for n in names:
        with open(os.path.join(work, n, "cache", "lock")) as f:
            pids.append(int(f.read().split()[0]))
    return pids


def rss_line(tag, pids):
    v = [rss_mib(p) for p in pids]
    rss, anon, file = ([x[k] for x in v] for k in range(3))
    print(f"memory   {tag:26s} VmRSS per daemon: median {statistics.median(rss):6.1f} MiB "
          f"(RssAnon {statistics.median(anon):.1f}, RssFile {statistics.median(file):.1f}), "
          f"min {min(rss):6.1f}, max {max(rss):6.1f} ({len(v)} daemons)", flush=True)
    return statistics.median(rss), max(rss)


def daemon_log(work, name):
    try:
        return open(os.path.join(work, name, "cache", "ckptfs.log"), errors="replace").read()
    except FileNotFoundError:
        return ""


def wait_all_joined(work, names, addrs, timeout):
    """Until every node's log says each other node joined (discovery converged)."""
    t0 = time.monotonic()
    while True:
        missing = [(n, a) for i, n in enumerate(names) for j, a in enumerate(addrs)
                   if i != j and f"peer {a} joined" not in daemon_log(work, n)]
        if not missing:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{len(missing)} (node, peer) pairs not joined, e.g. {missing[0]}")
        time.sleep(0.5)


def idle_table(tag, log, t0, t1, nodes, heartbeat):
    """Prints the requests of [t0, t1) per node per second and per heartbeat, by class."""
    reqs = window(log, t0, t1)
    by, sent = {}, {}
    for r in reqs:
        by[kind(r[1], r[2])] = by.get(kind(r[1], r[2]), 0) + 1
        sent[kind(r[1], r[2])] = sent.get(kind(r[1], r[2]), 0) + r[4]
    secs = t1 - t0
    per_s = len(reqs) / nodes / secs
    print(f"idle-{tag:3s} {secs:.0f} s, {nodes} nodes: {len(reqs)} requests = {per_s:.3f} per node "
          f"per s = {per_s * heartbeat:.2f} per node per {heartbeat:g} s heartbeat", flush=True)
    print(f"         {'class':22s} {'in all':>7s} {'/node/s':>9s} {'/node/heartbeat':>16s} "
          f"{'bytes sent/request':>19s}")
    for k, n in sorted(by.items(), key=lambda kv: -kv[1]):
        print(f"         {k:22s} {n:7d} {n / nodes / secs:9.3f} {n / nodes / secs * heartbeat:16.2f} "
              f"{sent[k] / n:19.0f}")
    bad = [r for r in reqs if r[3] >= 400]
    if bad:
        print(f"         ({len(bad)} of them failed, e.g. {bad[0][1]} {bad[0][2]} {bad[0][3]})")
    return per_s, by


def idle_phase(tag, work, names, rgw, secs, heartbeat):
    """The mounted nodes left idle for `secs`: (start, end, VmRSS at the start, at the end,
    requests per node per second, {class: requests})."""
    pids = daemon_pids(work, names)
    mounted = rss_line(f"peers {tag}, mounted", pids)
    t0 = time.time()
    time.sleep(secs)
    t1 = time.time()
    idle = rss_line(f"peers {tag}, idle", pids)
    per_s, by = idle_table(tag, settled_log(rgw), t0, t1, len(names), heartbeat)
    return t0, t1, mounted, idle, per_s, by


def storm(work, names, want, rgw, tag, since):
    """Every node of `names` loads ckpt/model.pt at once (one load checked against `want`):
    (VmRSS after it, (bytes radosgw's GETs sent, the GETs of chunks/, {chunk: GETs}, seconds)).
    Everything radosgw logged from the start until its log settles counts: a fetch the storm
    started may end after the loads."""
    got = {}

    def load(i):
        sd = torch.load(os.path.join(work, names[i], "mnt", "ckpt", "model.pt"))
        if i == 0:
            got[0] = sd
    t0 = time.time()
    secs = at_once([lambda i=i: load(i) for i in range(len(names))])
    assert all(torch.equal(got[0][k], want[k]) for k in want), "the storm loaded wrong bytes"
    got.clear()
    rss = rss_line(f"{tag}, after storm", daemon_pids(work, names))
    log = settled_log(rgw)
    early = [r for r in window(log, since, t0) if r[1] == "GET" and r[2].startswith("chunks/")]
    if early:
        print(f"         (GETs of chunks/ after mounting, before the storm: {len(early)})",
              flush=True)
    during = window(log, t0, float("inf"))
    gets = [r for r in during if r[1] == "GET" and r[2].startswith("chunks/") and r[3] < 300]
    per_chunk = {}
    for r in gets:
        per_chunk[r[2]] = per_chunk.get(r[2], 0) + 1
    sent = sum(r[4] for r in during if r[1] == "GET")
    others = {}
    for r in window(log, t0, t0 + secs):
        if not (r[1] == "GET" and r[2].startswith("chunks/")):
            others[kind(r[1], r[2])] = others.get(kind(r[1], r[2]), 0) + 1
    print(f"         other requests during the {secs:.1f} s of loads: "
          + (", ".join(f"{k} {v}" for k, v in sorted(others.items(), key=lambda kv: -kv[1]))
             or "none"), flush=True)
    return rss, (sent, len(gets), per_chunk, secs)


def storm_lines(tag, n, size, chunks, sent, gets, per_chunk, secs):
    print(f"storm-{tag:3s} {n} nodes load {size / 2**20:.0f} MiB at once: {secs:.1f} s; radosgw "
          f"sent {sent / 2**20:.1f} MiB = {sent / size:.3f} x the checkpoint", flush=True)
    print(f"         GETs of chunks/: {gets} in all for {len(per_chunk)} chunks (of {chunks} "
          f"written) = {gets / max(chunks, 1):.3f} per chunk, at most "
          f"{max(per_chunk.values(), default=0)} for one", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--idle", type=float, default=60, help="seconds of the idle period, peers on")
    ap.add_argument("--idle-off", type=float, default=20,
                    help="seconds of the idle period with peers off (0: skip that phase)")
    ap.add_argument("--heartbeat", type=float, default=10, help="-o peer_heartbeat=")
    ap.add_argument("--storm-off", type=int, default=1,
                    help="1: the storm with peers off too, after their idle period (0: not)")
    ap.add_argument("--mib", type=int, default=128, help="size of the checkpoint of the storm")
    ap.add_argument("--dir", default="/var/tmp/ckptfs-scale")
    ap.add_argument("--bin", default=os.environ.get("CKPTFS_BIN",
                                                    os.path.join(ROOT, "build/tools/ckptfs")))
    benchjson.add_argument(ap)
    args = ap.parse_args()
    out = benchjson.Results("scale", args.json)
    n = args.nodes
    work = args.dir
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    rgw, env = start_rgw(work)
    mounts = []
    try:
        import boto3
        boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"],
                     region_name="us-east-1").create_bucket(Bucket=BUCKET)

        def mount(name, options):
            return mount_bucket(args.bin, work, name, env["AWS_ENDPOINT_URL"], mounts,
                                [options] if options else [])

        w = mount("writer", "")
        os.makedirs(os.path.join(w, "ckpt"))
        path = os.path.join(w, "ckpt", "model.pt")
        want = tensors(args.mib, 42)
        torch.save(want, path)
        wait_state(path, "remote")
        size = os.path.getsize(path)
        umount_all(args.bin, mounts)
        chunks = len({r[2] for r in settled_log(rgw) if r[1] == "PUT"
                      and r[2].startswith("chunks/") and r[3] < 300})
        print(f"checkpoint {size / 2**20:.0f} MiB in {chunks} chunks (PUTs of chunks/)",
              flush=True)

        if args.idle_off > 0:
            names = [f"off{i}" for i in range(n)]
            t_m = time.perf_counter()
            for nm in names:
                mount(nm, "log_level=debug")
            print(f"mounts   {n} without peers, one after another: {time.perf_counter() - t_m:.1f} s",
                  flush=True)
            t0, _, off_mount, off_idle, per_s_off, _ = idle_phase(
                "off", work, names, rgw, args.idle_off, args.heartbeat)
            out.note("idle_off_requests_per_node_s", round(per_s_off, 4))
            out.note("rss_off_mounted_mib", round(off_mount[0], 1))
            out.note("rss_off_idle_mib", round(off_idle[0], 1))
            if args.storm_off:
                off_storm, (sent, gets, per_chunk, secs) = storm(work, names, want, rgw,
                                                                 "peers off", t0)
                storm_lines("off", n, size, chunks, sent, gets, per_chunk, secs)
                out.note("rss_off_storm_mib", round(off_storm[0], 1))
                out.note("storm_off_store_bytes_over_checkpoint", round(sent / size, 4))
            umount_all(args.bin, mounts)

        names = [f"n{i}" for i in range(n)]
        addrs = [f"127.0.0.1:{p}" for p in free_ports(n)]
        t_m = time.perf_counter()
        for nm, a in zip(names, addrs):
            mount(nm, f"peer_listen={a},peer_heartbeat={args.heartbeat:g},log_level=debug")
        print(f"mounts   {n} with peers, one after another: {time.perf_counter() - t_m:.1f} s; "
              f"discovery converged {wait_all_joined(work, names, addrs, 6 * args.heartbeat):.1f} s "
              f"after the last", flush=True)
        t0, t1, on_mount, on_idle, per_s, by = idle_phase("on", work, names, rgw, args.idle,
                                                          args.heartbeat)
        disc = sum(v for k, v in by.items() if k.endswith(" nodes/")) / n / (t1 - t0)
        beats = n * (t1 - t0) / args.heartbeat
        print("         discovery per node per heartbeat: " + ", ".join(
            f"{by.get(f'{m} nodes/', 0) / beats:.2f} {m}" for m in ("LIST", "PUT", "DELETE", "GET",
                                                                 "HEAD"))
            + " (peers/peer_directory.h: one LIST, one PUT, one DELETE)", flush=True)
        if args.idle_off > 0:
            print(f"         peers on / peers off: {per_s / per_s_off:.2f} x the idle requests",
                  flush=True)
            out.add("idle-requests", per_s / per_s_off, subject="peers on", baseline="peers off",
                    better="lower")
        out.note("idle_requests_per_node_s", round(per_s, 4))
        out.note("discovery_requests_per_node_heartbeat", round(disc * args.heartbeat, 3))
        out.note("rss_on_mounted_mib", round(on_mount[0], 1))
        out.note("rss_on_idle_mib", round(on_idle[0], 1))

        on_storm, (sent, gets, per_chunk, secs) = storm(work, names, want, rgw, "peers on",
                                                          t0)
        umount_all(args.bin, mounts)  # flushes the daemons' debug lines
        served = {a: 0 for a in addrs}
        served_b = {a: 0 for a in addrs}
        fallback = 0
        for nm in names:
            text = daemon_log(work, nm)
            for m in re.finditer(r"chunk \S+ \((\d+) bytes\) from peer (\S+)", text):
                served[m[2]] = served.get(m[2], 0) + 1
                served_b[m[2]] = served_b.get(m[2], 0) + int(m[1])
            fallback += len(re.findall(r"not on peer|come from the store for|failed verification",
                                       text))
        s = sorted(served.values())
        storm_lines("on", n, size, chunks, sent, gets, per_chunk, secs)
        print(f"         chunks served to peers per node: median {statistics.median(s)}, min "
              f"{s[0]}, max {s[-1]}, {sum(s)} in all = {sum(s) / max(chunks, 1):.2f} per chunk "
              f"(ideal {n - 1}); {sum(served_b.values()) / 2**20:.0f} MiB node to node; "
              f"{fallback} peer misses or failures logged", flush=True)
        out.add("storm-store-bytes", sent / size, subject="store bytes",
                baseline="checkpoint size", better="lower", goal=1.1, subject_s=secs)
        out.note("storm_chunk_gets_per_chunk", round(gets / max(chunks, 1), 4))
        out.note("storm_served_per_node_median", statistics.median(s))
        out.note("rss_on_storm_mib", round(on_storm[0], 1))
        bench = os.path.join(os.path.dirname(args.bin), "..", "bench", "rendezvous_bench")
        if os.path.exists(bench):
            r = subprocess.run([bench, "100000", "16", "1000"], capture_output=True, text=True)
            print(r.stdout, end="", flush=True)
        out.write()
    finally:
        teardown(args.bin, mounts, rgw)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

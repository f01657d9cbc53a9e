# Chunks served node to node (-o peer_listen=, -o peers=; peers/): cold mounts on one radosgw
# bucket loading one checkpoint fetch each chunk from the bucket once in all, the owner serving
# the others; nodes finding each other through the bucket; a peer killed mid-load, a peer that
# does not answer, a peer that sends wrong bytes and a request without the bucket's proof each
# leave the loads exact and the peer named in a log, and each is counted in the nodes' metrics
# (-o metrics=: ckptfs_peer_*).
import hashlib
import hmac
import os
import secrets
import socket
import struct
import time

import pytest
import torch

from conftest import run
from test_metrics import get, samples
from test_nodes import chunk_gets, load_all, together
from test_remote import (REMOTE_CHUNKS, new_remote, remote_chunks, tensors,  # noqa: F401
                         wait_state, wait_true)


def free_ports(n):
    """n ports free on 127.0.0.1 now (bound and released)."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def peer_options(ports, i):
    addrs = [f"127.0.0.1:{p}" for p in ports]
    return f"{REMOTE_CHUNKS},peer_listen={addrs[i]},peers=" + ",".join(addrs)


def peer_mounts(make_mount, remote, ports, name, env=None):
    """A mount per port, each listening on its own and naming all of them as peers, each with
    its metrics at 127.0.0.1:<mount>.metrics_port."""
    env = env or {}
    metrics = [p for p in free_ports(2 * len(ports)) if p not in ports][:len(ports)]
    mounts = []
    for i in range(len(ports)):
        m = make_mount(options=peer_options(ports, i) + f",metrics=127.0.0.1:{metrics[i]}",
                       name=f"{name}{i}", args=remote.mount_args,
                       env={**remote.env, **env.get(i, {})})
        m.metrics_port = metrics[i]
        mounts.append(m)
    return mounts


def peer_metrics(node):
    """A node's ckptfs_peer* samples, scraped from its exporter: {'name{labels}': value}."""
    text = get(f"http://127.0.0.1:{node.metrics_port}/metrics")
    return {k: v for k, v in samples(text).items() if k.startswith("ckptfs_peer")}


def fallbacks(m):
    """{reason: count} of the nonzero ckptfs_peer_fallbacks_total series."""
    return {k.split('"')[1]: v for k, v in m.items()
            if k.startswith("ckptfs_peer_fallbacks_total{") and v}


def written_checkpoint(make_mount, remote):
    """model.pt (about 12 MiB: some 50 chunks) written and uploaded by a mount then gone."""
    from test_remote import mount_on
    writer = mount_on(make_mount, remote, "writer", options=REMOTE_CHUNKS)
    (writer / "shared").mkdir()
    sd = tensors(1200, [500_000] * 6)
    torch.save(sd, writer / "shared" / "model.pt")
    wait_state([writer / "shared" / "model.pt"])
    writer.umount()
    assert chunk_gets(remote) == {}, "the writer fetched chunks"
    return sd


def assert_loads(got, want):
    for sds in got.values():
        for sd in sds:
            assert sd.keys() == want.keys()
            assert all(torch.equal(sd[k], want[k]) for k in want)


def load_at_once(nodes, want, also=None):
    """shared/model.pt loaded by two readers on each of `nodes` at once, each load checked
    against `want`; `also` runs on a thread of its own meanwhile."""
    got = [None] * len(nodes)

    def node(i):
        if i == len(nodes):
            also()
            return
        got[i] = load_all([nodes[i] / "shared" / "model.pt"], readers=2)
    together(node, range(len(nodes) + (1 if also else 0)))
    for g in got:
        assert_loads(g, want)


@pytest.mark.timeout(600)
def test_four_cold_mounts_fetch_each_chunk_from_the_bucket_once_in_all(make_mount,
                                                                       new_remote):  # noqa: F811
    remote = new_remote("s3")
    want = written_checkpoint(make_mount, remote)
    chunks = remote_chunks(remote)
    assert len(chunks) >= 8
    ports = free_ports(4)
    nodes = peer_mounts(make_mount, remote, ports, "p")
    load_at_once(nodes, want)
    gets = chunk_gets(remote)
    # Each chunk left the bucket once: its owner fetched it, the other three asked the owner.
    assert set(gets) == set(chunks)
    assert {c: n for c, n in gets.items() if n > 1} == {}, "a chunk fetched twice from the bucket"
    for i, n in enumerate(nodes):
        # peers=A,B,C,D: the -o list's commas did not cut it short.
        assert f"serving chunks to peers at 127.0.0.1:{ports[i]} (4 peers given)" in n.log()
        assert "refused" not in n.log()
    # Every node fetched every chunk; each chunk's three other nodes got it from its owner, and
    # nothing fell back to the bucket.
    m = [peer_metrics(n) for n in nodes]
    total = sum(chunks.values())
    assert sum(x["ckptfs_peer_fetched_bytes_total"] for x in m) == 3 * total, m
    assert sum(x["ckptfs_peer_fetched_chunks_total"] for x in m) == 3 * len(chunks), m
    assert sum(x["ckptfs_peer_served_bytes_total"] for x in m) == 3 * total, m
    assert sum(x["ckptfs_peer_served_chunks_total"] for x in m) == 3 * len(chunks), m
    for x in m:
        assert fallbacks(x) == {}, x
        assert not [k for k, v in x.items() if "refused" in k and v], x
        assert x["ckptfs_peers_live"] == 3 and x["ckptfs_peers_down"] == 0, x
        assert x['ckptfs_peer_request_seconds_count{outcome="ok"}'] == \
            x["ckptfs_peer_fetched_chunks_total"], x


@pytest.mark.timeout(600)
def test_each_node_loading_its_own_rank_stays_at_one_fetch_per_chunk(make_mount,
                                                                     new_remote):  # noqa: F811
    from test_remote import mount_on
    remote = new_remote("s3")
    writer = mount_on(make_mount, remote, "writer", options=REMOTE_CHUNKS)
    (writer / "ranks").mkdir()
    own = {r: tensors(1300 + r, [300_000] * 3) for r in range(4)}
    for r, sd in own.items():
        torch.save(sd, writer / "ranks" / f"rank-{r}.pt")
    wait_state([writer / "ranks" / f"rank-{r}.pt" for r in own])
    writer.umount()
    ports = free_ports(4)
    nodes = [make_mount(options=peer_options(ports, i) + ",warm=file", name=f"o{i}",
                        args=remote.mount_args, env=remote.env) for i in range(4)]
    got = {}
    together(lambda i: got.update(load_all([nodes[i] / "ranks" / f"rank-{i}.pt"], readers=2)),
             range(4))
    for i in range(4):
        assert_loads({0: got[nodes[i] / "ranks" / f"rank-{i}.pt"]}, own[i])
    gets = chunk_gets(remote)
    assert len(gets) >= 8
    assert {c: n for c, n in gets.items() if n > 1} == {}, "a rank's chunk fetched twice"


@pytest.mark.timeout(600)
def test_mounts_find_each_other_through_the_bucket(make_mount, new_remote):  # noqa: F811
    # No peers= at all: each node puts a record of its address under nodes/ every second and
    # lists the others'.
    remote = new_remote("s3")
    want = written_checkpoint(make_mount, remote)
    ports = free_ports(3)
    nodes = [make_mount(options=f"{REMOTE_CHUNKS},peer_listen=127.0.0.1:{p},peer_heartbeat=1",
                        name=f"d{i}", args=remote.mount_args, env=remote.env)
             for i, p in enumerate(ports)]
    for i, n in enumerate(nodes):
        for j, p in enumerate(ports):
            if i != j:
                wait_true(lambda: f"peer 127.0.0.1:{p} joined" in n.log(), f"{p} seen by {i}", 30)
    assert sorted(remote.objects("nodes/")) != []
    load_at_once(nodes, want)
    gets = chunk_gets(remote)
    assert {c: n for c, n in gets.items() if n > 1} == {}, "a chunk fetched twice from the bucket"
    # A node that leaves takes its record with it.
    nodes[2].umount()
    assert not [k for k in remote.objects("nodes/") if f":{ports[2]}/" in k]


@pytest.mark.timeout(600)
def test_a_peer_killed_mid_load_leaves_the_others_exact(make_mount, new_remote):  # noqa: F811
    remote = new_remote("s3")
    want = written_checkpoint(make_mount, remote)
    ports = free_ports(4)
    nodes = peer_mounts(make_mount, remote, ports, "k")
    load_at_once(nodes[:3], want, also=nodes[3].kill_daemon)  # kill -9 as the others start
    dead = f"peer 127.0.0.1:{ports[3]}:"
    assert any(dead in n.log() for n in nodes[:3]), "no survivor names the dead peer"
    # A second load on a survivor, after all: from its local tier, exact.
    assert_loads(load_all([nodes[0] / "shared" / "model.pt"], readers=1), want)


@pytest.mark.timeout(600)
def test_a_peer_that_does_not_answer_times_out_and_the_loads_complete(make_mount,
                                                                       new_remote):  # noqa: F811
    # Node 2 is stopped (SIGSTOP): its kernel still accepts connections, nothing answers.
    import signal
    remote = new_remote("s3")
    want = written_checkpoint(make_mount, remote)
    ports = free_ports(5)
    metrics, ports = ports[3:], ports[:3]
    nodes = [make_mount(options=peer_options(ports, i) + ",peer_timeout=1" +
                        (f",metrics=127.0.0.1:{metrics[i]}" if i < 2 else ""), name=f"t{i}",
                        args=remote.mount_args, env=remote.env) for i in range(3)]
    for i in range(2):
        nodes[i].metrics_port = metrics[i]
    pid = nodes[2].daemon_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        load_at_once(nodes[:2], want)
    finally:
        os.kill(pid, signal.SIGCONT)
    slow = f"peer 127.0.0.1:{ports[2]}: chunk "
    assert any(slow in line and "timed out" in line
               for n in nodes[:2] for line in n.log().splitlines()), "no node names the slow peer"
    m = [peer_metrics(n) for n in nodes[:2]]
    assert sum(fallbacks(x).get("slow", 0) for x in m) >= 1, m
    assert all(set(fallbacks(x)) <= {"slow", "down"} for x in m), m


@pytest.mark.timeout(600)
def test_a_peer_sending_wrong_bytes_is_caught_and_named(make_mount, new_remote):  # noqa: F811
    remote = new_remote("s3")
    want = written_checkpoint(make_mount, remote)
    ports = free_ports(3)
    nodes = peer_mounts(make_mount, remote, ports, "w", env={2: {"CKPTFS_PEER_FAULTS": "corrupt"}})
    assert "every chunk this node serves to a peer is corrupted" in nodes[2].log()
    load_at_once(nodes[:2], want)
    bad = f"from peer 127.0.0.1:{ports[2]} failed verification"
    assert any(bad in n.log() for n in nodes[:2]), "no node names the lying peer"
    # Counted: the liar served bytes; the nodes that caught it left it out (marked down), and
    # fetched its chunks from the bucket: bad bytes first, then because it is down.
    m = [peer_metrics(n) for n in nodes]
    assert m[2]["ckptfs_peer_served_chunks_total"] >= 1, m[2]
    caught = [x for x in m[:2] if fallbacks(x).get("bad_bytes")]
    assert caught, m
    for x in caught:
        assert x["ckptfs_peers_down"] == 1 and x["ckptfs_peers_live"] == 1, x
        assert set(fallbacks(x)) <= {"bad_bytes", "down"}, x
    assert sum(fallbacks(x).get("bad_bytes", 0) for x in m[:2]) == \
        sum(x['ckptfs_peer_request_seconds_count{outcome="error"}'] for x in m[:2]), m
    # Nothing wrong was kept: a remount of node 0 reads its local tier, exact.
    nodes[0].remount()
    assert_loads(load_all([nodes[0] / "shared" / "model.pt"], readers=1), want)


def request(key, chunk_hex, length, when=None, nonce=None):
    """A chunk request as peers/peer_protocol.h lays it out, its proof made with `key`."""
    body = (b"CKPR" + struct.pack("<I", 1) + bytes.fromhex(chunk_hex) +
            struct.pack("<Qq", length, int(when if when is not None else time.time())) +
            (nonce or secrets.token_bytes(16)))
    return body + hmac.new(key, body, hashlib.sha256).digest()


def ask(port, wire):
    """Sends `wire` from a fresh socket: (our address "ip:port", status, bytes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        me = "%s:%d" % s.getsockname()
        s.sendall(wire)
        head = b""
        while len(head) < 16:
            part = s.recv(16 - len(head))
            if not part:
                break
            head += part
        assert head[:4] == b"CKPA", head
        status, n = struct.unpack("<IQ", head[4:16])
        data = b""
        while len(data) < n:
            part = s.recv(n - len(data))
            assert part, "the answer ended early"
            data += part
    return me, status, data


@pytest.mark.timeout(300)
def test_a_request_without_the_buckets_proof_is_refused_and_logged(make_mount,
                                                                   new_remote):  # noqa: F811
    remote = new_remote("s3")
    written_checkpoint(make_mount, remote)
    chunks = remote_chunks(remote)
    port = free_ports(1)[0]
    node = peer_mounts(make_mount, remote, [port], "r")[0]
    cid, size = sorted(chunks.items())[0]
    secret = remote.env["AWS_SECRET_ACCESS_KEY"].encode()
    key = hmac.new(secret, f"ckptfs peer key v1\n{remote.bucket}\n{remote.prefix}/".encode(),
                   hashlib.sha256).digest()
    refused = []
    # A proof under a guessed key, the secret itself as the key, garbage, a stale time.
    for wire in (request(b"guess" * 6, cid, size), request(secret, cid, size),
                 secrets.token_bytes(88), request(key, cid, size, when=time.time() - 3600)):
        me, status, data = ask(port, wire)
        assert (status, data) == (2, b""), me
        refused.append(me)
    log = node.log()
    for me in refused:
        assert f"peer {me}: refused" in log
    m = peer_metrics(node)
    assert m['ckptfs_peer_refused_requests_total{reason="proof"}'] == 4, m
    assert m["ckptfs_peer_served_chunks_total"] == 0, m
    # The bucket's key gets the chunk's exact bytes (the node is the only one, so the owner: it
    # fetches it from the bucket) and a replay of that request is refused.
    wire = request(key, cid, size)
    _, status, data = ask(port, wire)
    assert status == 0 and len(data) == size
    assert hashlib.sha256(data).digest() == hashlib.sha256(remote.read(
        f"chunks/{cid[:2]}/{cid}")).digest()
    me, status, _ = ask(port, wire)
    assert status == 2 and f"peer {me}: refused: a replayed request" in node.log()
    # A wrong length is not served, and leaves the chunk readable.
    _, status, _ = ask(port, request(key, cid, size + 1))
    assert status == 1
    _, status, data = ask(port, request(key, cid, size))
    assert status == 0 and len(data) == size
    m = peer_metrics(node)
    assert m['ckptfs_peer_refused_requests_total{reason="proof"}'] == 4, m
    assert m['ckptfs_peer_refused_requests_total{reason="replay"}'] == 1, m
    assert m['ckptfs_peer_unserved_requests_total{reason="not_here"}'] == 1, m
    assert m["ckptfs_peer_served_chunks_total"] == 2, m
    assert m["ckptfs_peer_served_bytes_total"] == 2 * size, m
    # Only the given addresses are bound: the peer endpoint's and the exporter's.
    listening = run(["ss", "-Hltnp"]).stdout
    mine = [l for l in listening.splitlines() if f"pid={node.daemon_pid()}," in l]
    assert sorted(l.split()[3] for l in mine) == sorted(
        [f"127.0.0.1:{port}", f"127.0.0.1:{node.metrics_port}"]), listening


@pytest.mark.parametrize("kind,options,error", [
    ("file", "peer_listen=127.0.0.1:{port}", "peers need an s3:// farthest tier"),
    ("s3", "peer_listen=localhost:{port}", "the host must be an IPv4 address"),
    ("s3", "peer_listen=127.0.0.1:{port},peers=127.0.0.1", "peers takes HOST:PORT"),
    ("s3", "peer_listen=127.0.0.1:{port},peer_timeout=0", "peer_timeout must be in"),
])
def test_bad_peer_options_fail_the_mount_with_the_reason(make_mount, new_remote, kind, options,
                                                         error):  # noqa: F811
    remote = new_remote(kind)
    m = make_mount(options=options.format(port=free_ports(1)[0]), args=remote.mount_args,
                   env=remote.env, mount=False)
    p = run(m.mount_command(), check=False, timeout=60, env=m.environ())
    assert p.returncode != 0
    assert error in p.stderr
    assert not m.mounted()

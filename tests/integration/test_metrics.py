# The Prometheus exporter (-o metrics=): scraped by a real Prometheus (Debian's package), started
# on 127.0.0.1 by the test, and queried through its HTTP API after a save and a load.
import json
import os
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import torch

from conftest import run, wait_for


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def samples(text):
    """{'name{labels}': value} of an exposition text."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


class Prometheus:
    def __init__(self, workdir, target):
        self.port = free_port()
        self.dir = workdir / "prometheus"
        self.dir.mkdir()
        cfg = self.dir / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 1s\n"
                       "scrape_configs:\n  - job_name: ckptfs\n"
                       f"    static_configs:\n      - targets: ['{target}']\n")
        self.log = open(self.dir / "log", "w")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def query(self, expr):
        """The value of an instant query with one result, or None while it has none."""
        q = urllib.parse.urlencode({"query": expr})
        try:
            r = json.loads(get(f"http://127.0.0.1:{self.port}/api/v1/query?{q}"))
        except OSError:
            return None  # not listening yet
        result = r["data"]["result"]
        return float(result[0]["value"][1]) if len(result) == 1 else None

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def test_prometheus_scrapes_what_the_mount_did(make_mount, workdir):
    port = free_port()
    m = make_mount(options=f"metrics=127.0.0.1:{port}")
    assert f"metrics at http://127.0.0.1:{port}/metrics" in m.log()
    prom = Prometheus(workdir, f"127.0.0.1:{port}")
    try:
        torch.manual_seed(3)
        sd = {f"w{i}": torch.randn(512, 1024) for i in range(4)}
        torch.save(sd, m / "a.pt")
        a = (m / "a.pt").read_bytes()
        (m / "b.pt").write_bytes(a)  # the same bytes again: every chunk deduplicated
        loaded = torch.load(m / "a.pt")
        assert all(torch.equal(loaded[k], sd[k]) for k in sd)
        os.setxattr(m.mnt, "user.ckptfs.seal", b"1")  # both files are in chunks now

        s = samples(get(f"http://127.0.0.1:{port}/metrics"))
        assert s["ckptfs_file_commits_total"] == 2
        assert s["ckptfs_file_commit_bytes_total"] == 2 * len(a)
        assert s["ckptfs_chunk_dedup_bytes_total"] == len(a)
        assert s["ckptfs_chunk_written_bytes_total"] == len(a)
        assert s["ckptfs_local_tier_bytes"] == len(a)
        assert s['ckptfs_fuse_request_seconds_count{op="create"}'] >= 2
        assert s['ckptfs_fuse_request_seconds_count{op="lookup"}'] >= 1

        # What Prometheus stored from its scrapes: the same values.
        expected = {
            "ckptfs_file_commits_total": 2,
            "ckptfs_file_commit_bytes_total": 2 * len(a),
            "ckptfs_chunk_dedup_bytes_total": len(a),
            'ckptfs_fuse_request_seconds_count{op="create"}':
                s['ckptfs_fuse_request_seconds_count{op="create"}'],
        }
        for expr, want in expected.items():
            got = wait_for(lambda: prom.query(expr), lambda v: v == want, timeout=60)
            assert got == want, (expr, got, open(prom.dir / "log").read()[-2000:])
        assert prom.query('up{job="ckptfs"}') == 1
    finally:
        prom.stop()


def test_an_address_in_use_fails_the_mount(make_mount):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        m = make_mount(options=f"metrics=127.0.0.1:{port}", mount=False)
        r = run(m.mount_command(), check=False, timeout=60)
        assert r.returncode != 0
        assert "metrics=127.0.0.1:" in r.stderr and "cannot listen" in r.stderr
        assert not m.mounted()

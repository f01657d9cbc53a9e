# The benchmarks' JSON output and bench/plot.py: a real (small) dedup benchmark run against the
# mount writes the ratios it prints, and plot.py draws them into a PNG.
import json
import re
import subprocess
import sys

import pytest

from conftest import CKPTFS_BIN, REPO_ROOT

BENCH = REPO_ROOT / "bench"


def test_dedup_benchmark_writes_what_it_prints_and_plot_draws_it(workdir):
    out_json, plots = workdir / "dedup.json", workdir / "plots"
    chunk_bench = CKPTFS_BIN.resolve().parent.parent / "bench" / "chunk_bench"
    r = subprocess.run([sys.executable, str(BENCH / "bench_dedup.py"), "--mib", "4",
                        "--dir", str(workdir / "bench"), "--bin", str(CKPTFS_BIN),
                        "--chunk-bench", str(chunk_bench), "--json", str(out_json)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert r.returncode == 0, r.stdout
    printed = {m[0]: (float(m[1]), float(m[2])) for m in
               re.findall(r"^(\S+)\s+stored/unique = ([\d.]+)\s+\(content-defined only: ([\d.]+)\)",
                          r.stdout, re.M)}
    assert set(printed) == {"dp-ranks", "finetune", "reordered"}, r.stdout
    doc = json.loads(out_json.read_text())
    assert doc["bench"] == "dedup" and doc["cpus"] >= 1
    got = {f["figure"]: f for f in doc["figures"]}
    for name, (tensor, cdc) in printed.items():
        for label, value in (("tensor", tensor), ("cdc", cdc)):
            f = got[f"{name} ({label})"]
            assert f["ratio"] == pytest.approx(value, abs=1e-4)
            assert (f["subject"], f["baseline"], f["better"]) == ("stored", "unique", "lower")
    # Tensor-aware chunking stores eight identical ranks about once.
    assert got["dp-ranks (tensor)"]["ratio"] < 1.1

    r = subprocess.run([sys.executable, str(BENCH / "plot.py"), str(out_json), "--out",
                        str(plots)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout
    png = (plots / "dedup.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width >= 600 and height >= 400, (width, height)


def test_plot_refuses_a_result_without_figures(workdir):
    empty = workdir / "empty.json"
    empty.write_text(json.dumps({"bench": "fs", "figures": []}))
    r = subprocess.run([sys.executable, str(BENCH / "plot.py"), str(empty), "--out",
                        str(workdir / "plots")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=120)
    assert r.returncode != 0
    assert "no figures" in r.stdout
    assert not (workdir / "plots" / "fs.png").exists()
